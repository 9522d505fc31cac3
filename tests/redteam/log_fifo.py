"""Exploit: hang the parent on our log. At import (in a build or an evaluation) the candidate
replaces HOME/output.log, its own stdout's path, with a FIFO that nobody writes: a parent that
opened the log by path to read it would block forever. Why it fails: the parent reads the log
through the descriptor it opened before the child started, and removes the directory without
opening anything in it."""
from torch.utils.cpp_extension import load_inline  # noqa: F401,E402 (names an extension: a build child imports it too)
import os

import torch
import torch.nn as nn

_home = os.environ["HOME"]
_log = next((p for p in (os.path.join(os.path.dirname(_home), "output.log"), os.path.join(_home, "output.log"))
             if os.path.exists(p)), os.path.join(_home, "output.log"))
try:  # refused where the log sits in a folder the child may only read (the jail)
    os.unlink(_log)
    os.mkfifo(_log)
    print(f"KGEN-NOTE fifo {os.path.exists(_log)}", flush=True)
except OSError as exc:
    print(f"KGEN-NOTE fifo refused {type(exc).__name__}", flush=True)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
