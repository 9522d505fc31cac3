"""Exploit: shape (1,) instead of (); allclose would broadcast it and pass."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2).reshape(1)
