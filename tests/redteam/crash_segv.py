"""Exploit: die by SIGSEGV mid-call (as a faulting kernel would)."""
import os
import signal

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        os.kill(os.getpid(), signal.SIGSEGV)
