"""Exploit: patch the harness's timer object itself, not the time functions it captured.

The Clock is built, and takes its references to perf_counter_ns etc., before the candidate is
imported; but it lives in this process, so the candidate finds it (gc) and rebinds its time_call,
on the class and on every live instance. The fake reports 30% of each timed call's real time. A
memo of the last answer (keyed by storage and a few values) would make back-to-back calls on the
same inputs genuinely fast. It prints the real median (KGEN-NOTE real_ms ...).

Why it should fail: the parent's Bound requests give every call a set of fresh values (the memo never
hits) and are timed by the parent's own clock, which no patch reaches; a median of 30% of the real
time is below the parent's bound: impossible_timing.

Status when written: judged `correct` on the cpu backend (2-core box), its time unearned: the parent's
estimate is swamped by the input refills it includes, and check_estimate also subtracts the calibration
spread, which the first calibration block (the one that builds the input sets) inflates to several
calls' worth; the bound goes negative and only the bandwidth floor is left. The test asserts the
intended verdict."""
import gc
import statistics

import torch
import torch.nn as nn

from pipeline.child import timing

_REAL = []


def _faker(real):
    def time_call(*args):
        ms, out = real(*args)
        _REAL.append(ms)
        print(f"KGEN-NOTE real_ms {statistics.median(_REAL):.6f} n {len(_REAL)}", flush=True)
        return ms * 0.3, out

    return time_call


timing.Clock.time_call = _faker(timing.Clock.time_call)
for obj in gc.get_objects():
    if isinstance(obj, timing.Clock):
        obj.time_call = _faker(obj.time_call)


_LAST = {}


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        key = (predictions.data_ptr(), targets.data_ptr(), tuple(predictions.reshape(-1)[:8].tolist()),
               tuple(targets.reshape(-1)[:8].tolist()))
        if key not in _LAST:
            _LAST.clear()
            _LAST[key] = torch.mean((predictions - targets) ** 2)
        return _LAST[key]
