"""Exploit: confuse the parent with a reply of our own. At import the candidate finds the result pipe
(`--result-fd` in sys.argv) and writes a line that is no reply (a parser that skipped or guessed
at it could be led to read the next one as something else). Why it fails: every line must be the
one typed reply the request calls for; anything else is protocol_error."""
import os
import sys

import torch
import torch.nn as nn

_fd = int(sys.argv[sys.argv.index("--result-fd") + 1])
os.write(_fd, b'{"event": "timed_done", "index": 0, "times_ms": "fast"} and some garbage\n')


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
