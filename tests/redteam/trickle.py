"""Exploit: keep the parent waiting forever with a reply that never ends. At import the candidate
writes one byte of a reply to `--result-fd` every 0.2 s, never a newline: a parent whose wait
restarts with each byte that arrives would never time out. Why it fails: each reply is awaited
under the child's absolute deadline; at timeout_s the child is killed and the verdict is timeout."""
import os
import sys
import time

import torch.nn as nn

_fd = int(sys.argv[sys.argv.index("--result-fd") + 1])
os.write(_fd, b'{"event": "imported"')
while True:
    os.write(_fd, b" ")
    time.sleep(0.2)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return predictions.sum()
