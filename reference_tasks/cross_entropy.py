import torch
import torch.nn as nn


class Model(nn.Module):
    """Cross-entropy loss over class logits with int64 class-index targets."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.nn.functional.cross_entropy(predictions, targets)


batch_size = 32768
num_classes = 4096
input_shape = (num_classes,)
dim = 1

KGEN_SIZES = {
    "small": {"batch_size": 512, "num_classes": 1024, "input_shape": (1024,)},
    "odd": {"batch_size": 77, "num_classes": 1001, "input_shape": (1001,)},
}
KGEN_DOMAINS = ["real", "index:num_classes"]


def get_inputs():
    return [torch.rand(batch_size, *input_shape), torch.randint(0, num_classes, (batch_size,))]


def get_init_inputs():
    return []
