"""Dtype mode, verdict correct: MSE forward in C++ for float32, bf16 and fp16 accumulating in float (not double:
a float sum per block of 1024 elements, then a float sum of the blocks) and the mean cast to the input's dtype."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>
#include <algorithm>

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
        // One running float sum over 1M elements drifts by ~6e-4, past float32's tolerance: sum in blocks.
        float sum = 0.0f;
        for (int64_t start = 0; start < n; start += 1024) {
            const int64_t end = std::min<int64_t>(n, start + 1024);
            float block = 0.0f;
            for (int64_t i = start; i < end; ++i) {
                const float d = static_cast<float>(a[i]) - static_cast<float>(b[i]);
                block += d * d;
            }
            sum += block;
        }
        out.data_ptr<scalar_t>()[0] = static_cast<scalar_t>(sum / static_cast<float>(n));
    });
    return out;
}
"""

_ext = load_inline(name="kgen_redteam_bf16_fp32acc_mse", cpp_sources=_SOURCE, functions=["mse"],
                   extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _ext.mse(predictions, targets)
