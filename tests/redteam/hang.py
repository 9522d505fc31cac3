"""Exploit: never return, and leave a forked helper behind. Both write their pid and process group
into TORCH_EXTENSIONS_DIR (the one place the test can read back) so the test can check they died."""
import os
import time

import torch.nn as nn


def _note(tag):
    path = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], f"{tag}.pid")
    with open(path, "w") as f:
        f.write(f"{os.getpid()} {os.getpgid(0)}\n")


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        if os.fork() == 0:
            _note("helper")
            while True:
                time.sleep(1)
        _note("child")
        while True:
            pass
