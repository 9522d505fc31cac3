"""Gradient mode, verdict missing_gradient naming input 1: a right forward and a right gradient for
the predictions, but backward returns None for the targets.

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
        return (predictions - targets).clamp(-1, 1) * (grad / predictions.numel()), None


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _Huber.apply(predictions, targets)
