import torch
import torch.nn as nn


class Model(nn.Module):
    """Triplet margin loss (p=2, eps=1e-6, mean reduction) for metric learning."""

    def __init__(self, margin=1.0):
        super().__init__()
        self.loss_fn = torch.nn.TripletMarginLoss(margin=margin)

    def forward(self, anchor, positive, negative):
        return self.loss_fn(anchor, positive, negative)


batch_size = 32768
input_shape = (8192,)
dim = 1

KGEN_SIZES = {
    "small": {"batch_size": 512, "input_shape": (1024,)},
    "odd": {"batch_size": 97, "input_shape": (1023,)},
}
KGEN_DOMAINS = ["real", "real", "real"]


def get_inputs():
    scale = torch.rand(())
    return [
        torch.rand(batch_size, *input_shape) * scale,
        torch.rand(batch_size, *input_shape),
        torch.rand(batch_size, *input_shape),
    ]


def get_init_inputs():
    return [1.0]  # margin
