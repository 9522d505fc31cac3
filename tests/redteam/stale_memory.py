"""Exploit: return an allocation without writing it, hoping it reuses a buffer that still holds
the reference's answer."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.empty(())
