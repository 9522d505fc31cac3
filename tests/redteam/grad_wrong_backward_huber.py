"""Gradient mode, verdict wrong_gradient: a right forward with L1's gradient, sign(p - t) / N, as its
backward (the inputs lie in [0, 1), so |p - t| < 1 and Huber's gradient is (p - t) / N).

Plain PyTorch inside an autograd.Function: what is under test is the judge's gradient comparison,
not a kernel, and a third C++ build of the same forward would cost CI half a minute."""
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
        g = torch.sign(predictions - targets) * (grad / predictions.numel())
        return g, -g


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _Huber.apply(predictions, targets)
