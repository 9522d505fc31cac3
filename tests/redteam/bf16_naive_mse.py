"""Dtype mode, verdict mismatch in bf16 and fp16: MSE forward in C++ accumulating in the input's own type, so each
bf16 addition rounds to bf16 and the sum stalls far below the truth on a large reduction (fp16 also overflows N).
In float32 it is one running float sum: ~6e-4 off at 1M elements, past float32's 1e-4 tolerance as well."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>

torch::Tensor mse(torch::Tensor predictions, torch::Tensor targets) {
    TORCH_CHECK(predictions.sizes() == targets.sizes(), "shape mismatch");
    TORCH_CHECK(predictions.scalar_type() == targets.scalar_type(), "dtype mismatch");
    auto p = predictions.contiguous();
    auto t = targets.contiguous();
    const int64_t n = p.numel();
    auto out = torch::empty({}, p.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, p.scalar_type(), "mse", [&] {
        const scalar_t* a = p.data_ptr<scalar_t>();
        const scalar_t* b = t.data_ptr<scalar_t>();
        scalar_t sum = 0;
        for (int64_t i = 0; i < n; ++i) {
            const scalar_t d = a[i] - b[i];
            sum += d * d;  // rounds to scalar_t on every addition
        }
        out.data_ptr<scalar_t>()[0] = sum / static_cast<scalar_t>(n);
    });
    return out;
}
"""

_ext = load_inline(name="kgen_redteam_bf16_naive_mse", cpp_sources=_SOURCE, functions=["mse"],
                   extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _ext.mse(predictions, targets)
