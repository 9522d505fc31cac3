"""Gradient mode, verdict no_gradient: the honest Huber autograd.Function, but forward returns its output
.detach()-ed (the right value, cut from the graph)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>
#include <cmath>
#include <vector>

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

std::vector<torch::Tensor> huber_backward(torch::Tensor grad, torch::Tensor predictions,
                                          torch::Tensor targets) {
    TORCH_CHECK(grad.numel() == 1, "the upstream gradient of a scalar loss has one element");
    auto p = predictions.contiguous();
    auto t = targets.contiguous();
    auto grad_p = torch::empty_like(p);
    auto grad_t = torch::empty_like(t);
    const int64_t n = p.numel();
    const double scale = grad.item<double>() / static_cast<double>(n);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, p.scalar_type(), "huber_backward", [&] {
        const scalar_t* a = p.data_ptr<scalar_t>();
        const scalar_t* b = t.data_ptr<scalar_t>();
        scalar_t* gp = grad_p.data_ptr<scalar_t>();
        scalar_t* gt = grad_t.data_ptr<scalar_t>();
        for (int64_t i = 0; i < n; ++i) {
            const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
            const double g = scale * (d < -1.0 ? -1.0 : (d > 1.0 ? 1.0 : d));
            gp[i] = static_cast<scalar_t>(g);
            gt[i] = static_cast<scalar_t>(-g);
        }
    });
    return {grad_p, grad_t};
}
"""

_ext = load_inline(name="kgen_redteam_grad_detached_huber", cpp_sources=_SOURCE,
                   functions=["huber_forward", "huber_backward"], extra_cflags=["-O3"], verbose=False)


class _Huber(torch.autograd.Function):
    @staticmethod
    def forward(ctx, predictions, targets):
        ctx.save_for_backward(predictions, targets)
        return _ext.huber_forward(predictions, targets)

    @staticmethod
    def backward(ctx, grad):
        predictions, targets = ctx.saved_tensors
        grad_p, grad_t = _ext.huber_backward(grad, predictions, targets)
        return grad_p, grad_t


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _Huber.apply(predictions, targets).detach()
