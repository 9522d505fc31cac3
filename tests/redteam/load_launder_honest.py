"""The honest twin of load_launder.py: the same spinners on its own cores from the evaluation child's
import, and no forgery (FACTOR = 1.0: its clocks are left alone). Its timing is marked unfit for the
load it makes; unfit means no figure for it too: no speedup stored or printed, and `kgen eval` exits
non-zero."""
import gc
import os
import sys
import time

import torch
import torch.nn as nn

from pipeline.child import timing

FACTOR = 1.0
SPINNERS = 2
SPIN_S = 90.0
ROLE = "b" if "build" in sys.argv[1:] else "e"  # the harness runs as `... --result-fd N build|eval`


def _spin() -> None:
    end = time.monotonic() + SPIN_S
    while time.monotonic() < end:
        for _ in range(100000):
            pass
    os._exit(0)


def _forged(real):
    def time_call(*args):
        ms, out = real(*args)
        return ms * FACTOR, out

    return time_call


if ROLE == "e":
    for _ in range(SPINNERS):
        if os.fork() == 0:
            try:
                _spin()
            finally:
                os._exit(0)
    print(f"KGEN-NOTE spinners {SPINNERS}", flush=True)
    _forged_clocks = 0
    if FACTOR != 1.0:
        for _obj in gc.get_objects():
            if isinstance(_obj, timing.Clock):
                _obj.time_call = _forged(_obj.time_call)
                _forged_clocks += 1
    print(f"KGEN-NOTE forged {_forged_clocks} factor {FACTOR}", flush=True)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
