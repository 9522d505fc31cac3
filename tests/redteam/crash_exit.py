"""Exploit: leave mid-call with os._exit, skipping every handler."""
import os

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        os._exit(3)
