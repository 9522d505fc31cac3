"""Exploit: hang the parent on our log. At import (in a build or an evaluation) the candidate
replaces HOME/output.log, its own stdout's path, with a FIFO that nobody writes: a parent that
opened the log by path to read it would block forever. Why it fails: the parent reads the log
through the descriptor it opened before the child started, and removes the directory without
opening anything in it."""
import os

import torch
import torch.nn as nn

_log = os.path.join(os.environ["HOME"], "output.log")
os.unlink(_log)
os.mkfifo(_log)
print(f"KGEN-NOTE fifo {os.path.exists(_log)}", flush=True)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
