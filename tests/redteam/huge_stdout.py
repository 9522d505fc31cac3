"""Exploit: make our log too big to read. At import (in a build or an evaluation) the candidate
extends its stdout, the log file the parent keeps, to 1 TiB (sparse, so it costs nothing) and goes
on writing at its end: a parent that read the whole log would run out of memory or time. The room's
file-size limit refuses 1 TiB, so it takes what the limit allows (1 GiB). Why it fails: the parent
reads only the last POLICY.log_tail_bytes of the log, through its own descriptor."""
from torch.utils.cpp_extension import load_inline  # noqa: F401,E402 (names an extension: a build child imports it too)
import os
import resource

import torch
import torch.nn as nn

try:
    os.ftruncate(1, 1 << 40)
    _how = "ftruncate"
except OSError:  # the room's file-size limit: as big as it allows instead
    os.ftruncate(1, resource.getrlimit(resource.RLIMIT_FSIZE)[0] - (1 << 20))  # room to go on writing
    _how = "limited"
os.lseek(1, 0, os.SEEK_END)
print(f"KGEN-NOTE huge {_how} {os.fstat(1).st_size}", flush=True)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
