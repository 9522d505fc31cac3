"""An honest, fast CPU mse: one pass over both inputs, 16 float lanes a step (the compiler's vectors),
each run of 4096 elements summed into a double. Several times eager's three passes and two
temporaries on the 2-core box; the kernel kgen exists to find, which the judge must accept every time
(bench/cpu_judge_probe.py; the rates: docs/decisions/cpu-timing.md)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>

torch::Tensor mse(torch::Tensor predictions, torch::Tensor targets) {
    TORCH_CHECK(predictions.sizes() == targets.sizes(), "shape mismatch");
    TORCH_CHECK(predictions.scalar_type() == torch::kFloat32, "float32 only");
    auto p = predictions.contiguous();
    auto t = targets.contiguous();
    const float* __restrict a = p.data_ptr<float>();
    const float* __restrict b = t.data_ptr<float>();
    const int64_t n = p.numel();
    constexpr int L = 16;
    constexpr int64_t RUN = 4096;
    double sum = 0.0;
    int64_t i = 0;
    for (; i + RUN <= n; i += RUN) {
        float acc[L] = {0};
        for (int64_t j = 0; j < RUN; j += L)
            for (int k = 0; k < L; ++k) {
                const float d = a[i + j + k] - b[i + j + k];
                acc[k] += d * d;
            }
        double run = 0.0;
        for (int k = 0; k < L; ++k) run += acc[k];
        sum += run;
    }
    for (; i < n; ++i) {
        const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
        sum += d * d;
    }
    auto out = torch::empty({}, p.options());
    out.data_ptr<float>()[0] = static_cast<float>(n ? sum / static_cast<double>(n) : 0.0);
    return out;
}
"""

_ext = load_inline(name="kgen_honest_fast_mse", cpp_sources=_SOURCE, functions=["mse"],
                   extra_cflags=["-O3", "-march=native"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _ext.mse(predictions, targets)
