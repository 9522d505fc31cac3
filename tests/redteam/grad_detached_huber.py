"""Gradient mode, verdict no_gradient: a right forward and backward, but forward hands back its
output detached from the graph, so nothing can flow back through it.

Plain PyTorch inside an autograd.Function: what is under test is the judge's gradient check, not a
kernel (and a C++ build of the same forward would cost CI half a minute)."""
import torch
import torch.nn as nn


class _Huber(torch.autograd.Function):
    @staticmethod
    def forward(ctx, predictions, targets):
        ctx.save_for_backward(predictions, targets)
        d = (predictions - targets).double()
        return torch.where(d.abs() < 1, 0.5 * d * d, d.abs() - 0.5).mean().to(predictions.dtype)

    @staticmethod
    def backward(ctx, grad):
        predictions, targets = ctx.saved_tensors
        g = (predictions - targets).clamp(-1, 1) * (grad / predictions.numel())
        return g, -g


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _Huber.apply(predictions, targets).detach()
