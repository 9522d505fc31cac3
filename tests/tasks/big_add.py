"""A task with a large output (512 x 512 = 262144 values at "small"), for the red team: an
evaluator that compares only a sample of positions would miss a kernel that gets most of them wrong."""
import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise sum: a + b."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


rows = 2048
cols = 2048

KGEN_SIZES = {"small": {"rows": 512, "cols": 512}}
KGEN_DOMAINS = ["real", "real"]


def get_inputs():
    return [torch.randn(rows, cols), torch.randn(rows, cols)]


def get_init_inputs():
    return []
