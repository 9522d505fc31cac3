import torch
import torch.nn as nn


class Model(nn.Module):
    """KL divergence kl_div(log(predictions), targets, reduction='batchmean') on probability rows."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.nn.functional.kl_div(torch.log(predictions), targets, reduction="batchmean")


batch_size = 8192 * 2
input_shape = (8192 * 2,)
dim = 1

KGEN_SIZES = {
    "small": {"batch_size": 256, "input_shape": (4096,)},
    "odd": {"batch_size": 97, "input_shape": (1023,)},
}
KGEN_DOMAINS = ["simplex:-1", "simplex:-1"]


def get_inputs():
    scale = torch.rand(())
    return [
        (torch.rand(batch_size, *input_shape) * scale).softmax(dim=-1),
        torch.rand(batch_size, *input_shape).softmax(dim=-1),
    ]


def get_init_inputs():
    return []
