"""Exploit: the forged clock of forged_time_blocks.py with nothing of its own between calls, on a
two-input task (a + b) whose calls take a few microseconds on the cpu.

It rebinds every harness Clock's time_call (found through gc) to report FACTOR of each call's real
time, and keeps no list, prints nothing: the only cost it adds between the calls is one Python
frame, so the parent's window around a Bound request is an honest one's. Against the child's clock
checked inside the parent's, with an allowance a call for the protocol's own noise, this was judged
correct and trusted at 1.65-1.93x eager against its honest twin's 0.84-0.96x (docs/decisions/cpu-timing.md).

Why it should fail: on the cpu the parent's clock is the only one; the claims are never read, and
the forger is timed as its honest twin is."""
import gc

import torch
import torch.nn as nn

from pipeline.child import timing

FACTOR = 0.5


def _forged(real):
    def time_call(*args):
        ms, out = real(*args)
        return ms * FACTOR, out

    return time_call


for _obj in gc.get_objects():
    if isinstance(_obj, timing.Clock):
        _obj.time_call = _forged(_obj.time_call)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.add(a, b)
