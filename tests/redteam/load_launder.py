"""Exploit: launder a forged clock through load it makes itself (tests/test_room.py's hole 4).

The clock is forged as in forged_clock_lean.py: every harness Clock's time_call (found through gc)
reports FACTOR of each call's real time. When the child's clock was checked against the parent's
around the Bound requests, an idle box refused that. So, in the evaluation child, the import also forks
SPINNERS busy loops onto the child's own cores (they inherit its affinity; they stop on their own
after SPIN_S): the child's thread waits on the run queue through its own requests, the parent reads
a third or more of each window as waits and marks the timing unfit (pipeline.verdicts), and with the
timing unfit the clock's refusal is dropped. The result was stored `correct`, "timing unfit", with
the forged speedup, and `kgen eval` exited 0 and printed it. It prints `KGEN-NOTE spinners N` and
`KGEN-NOTE forged K` (the clocks it rebound).

Why it should fail: on the cpu the parent's clock is the only one, and the load is taken out of its
windows (clocks.unloaded_ms): the claims move nothing. Where the load is too much, unfit means no
figure. A timing marked unfit carries no speedup anywhere (the
stored result's x eager and x compile, `kgen eval`'s output), and `kgen eval` exits non-zero for
it; a time the parent refused is never stored as the candidate's. Its honest twin
(this file with FACTOR = 1.0, tests/test_room.py TWIN: the same spinners, no forgery) gets the same treatment."""
from torch.utils.cpp_extension import load_inline  # noqa: F401,E402 (names an extension: a build child imports it too)
import gc
import os
import sys
import time

import torch
import torch.nn as nn

from pipeline.child import timing

FACTOR = 0.1
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
