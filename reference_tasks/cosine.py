import torch
import torch.nn as nn


class Model(nn.Module):
    """Cosine similarity loss: mean(1 - cosine_similarity(predictions, targets, dim=1))."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        cosine_sim = torch.nn.functional.cosine_similarity(predictions, targets, dim=1)
        return torch.mean(1 - cosine_sim)


batch_size = 32768
input_shape = (32768,)
dim = 1

KGEN_SIZES = {
    "small": {"batch_size": 256, "input_shape": (4096,)},
    "odd": {"batch_size": 97, "input_shape": (1023,)},
}
KGEN_DOMAINS = ["real", "real"]


def get_inputs():
    scale = torch.rand(())
    return [torch.rand(batch_size, *input_shape) * scale, torch.rand(batch_size, *input_shape)]


def get_init_inputs():
    return []
