"""Exploit: a Tensor subclass whose comparison methods always say "close" (a lazy or lying tensor)."""
import torch
import torch.nn as nn


class Lying(torch.Tensor):
    def __eq__(self, other):
        return True

    def allclose(self, *args, **kwargs):
        return True


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.zeros(()).as_subclass(Lying)
