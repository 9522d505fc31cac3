"""An honest Huber forward in C++ (double accumulator; float32, bf16, fp16) called directly, with no backward:
correct in forward and dtype modes, no_gradient in gradient mode (its output has no grad_fn)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor huber_forward(torch::Tensor predictions, torch::Tensor targets) {
    TORCH_CHECK(predictions.sizes() == targets.sizes(), "shape mismatch");
    TORCH_CHECK(predictions.scalar_type() == targets.scalar_type(), "dtype mismatch");
    auto p = predictions.contiguous();
    auto t = targets.contiguous();
    const int64_t n = p.numel();
    auto out = torch::empty({}, p.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, p.scalar_type(), "huber_forward", [&] {
        const scalar_t* a = p.data_ptr<scalar_t>();
        const scalar_t* b = t.data_ptr<scalar_t>();
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
            const double ad = std::fabs(d);
            sum += ad < 1.0 ? 0.5 * d * d : ad - 0.5;
        }
        out.data_ptr<scalar_t>()[0] = static_cast<scalar_t>(sum / static_cast<double>(n));
    });
    return out;
}
"""

_ext = load_inline(name="kgen_redteam_huber_forward_only", cpp_sources=_SOURCE, functions=["huber_forward"],
                   extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _ext.huber_forward(predictions, targets)
