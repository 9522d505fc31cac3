"""Exploit: monkeypatch the ops a reference would use, at import, so a reference computed in this
process would agree with the candidate's wrong answer (a quarter of the true loss)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

_mean, _sub, _mse = torch.mean, torch.Tensor.__sub__, F.mse_loss


def _fake_mean(x, *args, **kwargs):
    return _mean(x, *args, **kwargs) * 0.25


def _fake_sub(a, b):
    return _sub(a, b) * 0.5


torch.mean = _fake_mean
torch.Tensor.mean = _fake_mean
torch.Tensor.__sub__ = _fake_sub
F.mse_loss = lambda a, b, *args, **kwargs: _mse(a, b, *args, **kwargs) * 0.25
torch.nn.functional.mse_loss = F.mse_loss


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)  # patched: 1/16 of the true value
