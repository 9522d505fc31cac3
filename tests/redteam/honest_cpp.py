"""An honest CPU kernel: one pass over both inputs with a double accumulator, in C++ via load_inline."""
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
    const float* a = p.data_ptr<float>();
    const float* b = t.data_ptr<float>();
    const int64_t n = p.numel();
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
        sum += d * d;
    }
    auto out = torch::empty({}, p.options());
    out.data_ptr<float>()[0] = static_cast<float>(n ? sum / static_cast<double>(n) : 0.0);
    return out;
}
"""

_ext = load_inline(name="kgen_redteam_honest_mse", cpp_sources=_SOURCE, functions=["mse"],
                   extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _ext.mse(predictions, targets)
