import torch
import torch.nn as nn


class Model(nn.Module):
    """Mean squared error: mean((predictions - targets) ** 2)."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


batch_size = 32768
input_shape = (32768,)
dim = 1

# kgen: sizes the config may choose (module globals to override); the file as written is "default".
KGEN_SIZES = {
    "small": {"batch_size": 256, "input_shape": (4096,)},
    "odd": {"batch_size": 97, "input_shape": (1023,)},
}
# kgen: the valid domain of each input of get_inputs(), in order.
KGEN_DOMAINS = ["real", "real"]


def get_inputs():
    scale = torch.rand(())
    return [torch.rand(batch_size, *input_shape) * scale, torch.rand(batch_size, *input_shape)]


def get_init_inputs():
    return []
