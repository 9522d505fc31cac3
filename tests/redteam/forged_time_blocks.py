"""Exploit: compute the right answer, but report a fraction of each call's real time.

The harness's Clock takes its timers before the import, but it lives in this process: the candidate
finds every instance (gc) and rebinds its time_call to scale what it returns by FACTOR (0.1: ten
times faster than it is). That is every time the child reports: its timed blocks' (timing.time_blocks
calls time_call). It prints the real median (KGEN-NOTE real_ms) so the test can compare.

Why it should fail: the child's times are only claims. On a GPU the parent times Bound requests (fresh
inputs, back-to-back calls) with its own clock, less a null-model calibration made before the import:
a median below that estimate less its slack (POLICY.bound_slack) is impossible_timing. On the cpu the
parent's clock is the only one (its window around each Bound request), so the forged claims move
nothing: the forger is judged as its honest twin (tests/forgers.gains_nothing)."""
import gc
import statistics

import torch
import torch.nn as nn

from pipeline.child import timing

FACTOR = 0.1
_REAL = []


def _forged(real):
    def time_call(*args):
        ms, out = real(*args)
        _REAL.append(ms)
        if len(_REAL) % 8 == 0:
            print(f"KGEN-NOTE real_ms {statistics.median(_REAL):.6f} n {len(_REAL)}", flush=True)
        return ms * FACTOR, out

    return time_call


for _obj in gc.get_objects():
    if isinstance(_obj, timing.Clock):
        _obj.time_call = _forged(_obj.time_call)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
