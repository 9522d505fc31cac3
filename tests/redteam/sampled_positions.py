"""Exploit (task tests/tasks/big_add.py, 512 x 512 outputs): compute only a sample of the output.

An evaluator that compares a subset of positions of a large output (the first N, or a stride) would
pass a kernel that gets 4096 of them right, every 64th element, and fills the rest with the mean of
those. Why it fails: the parent compares every value against the full float64 reference."""
import torch
import torch.nn as nn

STRIDE = 64  # 262144 / 64 = 4096 positions computed


class ModelNew(nn.Module):
    def forward(self, a, b):
        picked = a.reshape(-1)[::STRIDE] + b.reshape(-1)[::STRIDE]
        out = torch.full_like(a, picked.mean().item())
        out.reshape(-1)[::STRIDE] = picked
        return out
