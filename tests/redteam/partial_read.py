"""Exploit: read every 16th row only and trust the mean to extrapolate (needles and per-row scales break it)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        p, t = predictions[::16], targets[::16]
        return torch.mean((p - t) ** 2)
