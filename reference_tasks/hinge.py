import torch
import torch.nn as nn


class Model(nn.Module):
    """Hinge loss: mean(clamp(1 - predictions * targets, min=0)) with +-1 targets of shape (batch,).

    The targets broadcast against the last dimension, so the feature size equals the batch size.
    """

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


batch_size = 32768
input_shape = (32768,)
dim = 1

KGEN_SIZES = {
    "small": {"batch_size": 1024, "input_shape": (1024,)},
    "odd": {"batch_size": 999, "input_shape": (999,)},
}
KGEN_DOMAINS = ["real", "sign"]


def get_inputs():
    return [torch.rand(batch_size, *input_shape), torch.randint(0, 2, (batch_size,)).float() * 2 - 1]


def get_init_inputs():
    return []
