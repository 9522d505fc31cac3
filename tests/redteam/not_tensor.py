"""Exploit: return a Python float (the right number, but not a tensor)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return float(torch.mean((predictions - targets) ** 2))
