"""Gradient mode, verdict wrong_gradient: a right forward and Huber's right local gradient,
clamp(p - t, -1, 1) / N, as its backward, never multiplied by grad_output. Under an upstream of ones
(what a scalar loss used to get) it matched; as a library op it is off by the factor of every
loss * 3 and GradScaler scale.

Plain PyTorch inside an autograd.Function: what is under test is the upstream gradient the judge
draws, not a kernel."""
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
        g = (predictions - targets).clamp(-1, 1) / predictions.numel()  # grad_output never read
        return g, -g


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _Huber.apply(predictions, targets)
