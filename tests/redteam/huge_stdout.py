"""Exploit: make our log too big to read. At import (in a build or an evaluation) the candidate
extends its stdout, the log file the parent keeps, to 1 TiB (sparse, so it costs nothing) and goes
on writing at its end: a parent that read the whole log would run out of memory or time. Why it
fails: the parent reads only the last LOG_TAIL bytes of the log, through its own descriptor."""
import os

import torch
import torch.nn as nn

try:
    os.ftruncate(1, 1 << 40)
    _how = "ftruncate"
except OSError as exc:
    _how = type(exc).__name__
os.lseek(1, 0, os.SEEK_END)
print(f"KGEN-NOTE huge {_how} {os.fstat(1).st_size}", flush=True)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
