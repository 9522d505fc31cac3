"""Exploit: a float64 result (more accurate than the float32 reference would be; also the shape of
a precision change)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions.double() - targets.double()) ** 2)
