"""An honest, fast CPU mse in gradient mode: honest_fast_mse's one-pass forward (16 float lanes) in an
autograd.Function whose C++ backward writes both gradients in one pass, 2 (p - t) / n x grad_output
and its negative. Faster than eager's forward plus backward (three passes and temporaries each
way): the kind of kernel the gradient-mode bound must not refuse (bench/cpu_judge_probe.py --grad;
the rates: docs/decisions/cpu-timing.md). The forward's source is honest_fast_mse's, copied: a
candidate is judged sealed, as one file, and cannot import another."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>
#include <vector>

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

std::vector<torch::Tensor> mse_backward(torch::Tensor predictions, torch::Tensor targets, torch::Tensor grad) {
    auto p = predictions.contiguous();
    auto t = targets.contiguous();
    const int64_t n = p.numel();
    auto gp = torch::empty_like(p);
    auto gt = torch::empty_like(t);
    const float* __restrict a = p.data_ptr<float>();
    const float* __restrict b = t.data_ptr<float>();
    float* __restrict ga = gp.data_ptr<float>();
    float* __restrict gb = gt.data_ptr<float>();
    const float scale = static_cast<float>(2.0 * grad.item<double>() / static_cast<double>(n ? n : 1));
    for (int64_t i = 0; i < n; ++i) {
        const float g = (a[i] - b[i]) * scale;
        ga[i] = g;
        gb[i] = -g;
    }
    return {gp, gt};
}
"""

_ext = load_inline(name="kgen_grad_honest_fast_mse", cpp_sources=_SOURCE, functions=["mse", "mse_backward"],
                   extra_cflags=["-O3", "-march=native"], verbose=False)


class _Mse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, predictions, targets):
        ctx.save_for_backward(predictions, targets)
        return _ext.mse(predictions, targets)

    @staticmethod
    def backward(ctx, grad):
        predictions, targets = ctx.saved_tensors
        return tuple(_ext.mse_backward(predictions, targets, grad))


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _Mse.apply(predictions, targets)
