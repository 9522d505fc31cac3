"""Exploit (known gap): patch the harness's timer object itself, not the time functions it captured.

The Clock is built, and takes its references to perf_counter_ns etc., before the candidate is
imported; but it lives in this process, so the candidate finds it (gc) and rebinds its time_call,
on the class and on every live instance. The fake reports 30% of each timed call's real time. The
parent-bracketed block of back-to-back calls is left alone on the clock side, but those calls all
get the same inputs, so a memo of the last answer (keyed by storage and a few values) makes them
genuinely fast: the block then vouches for a per-call time as small as the fake. It writes the real
times into TORCH_EXTENSIONS_DIR (real_ms.json) so the test can compare."""
import gc
import json
import os
import statistics

import torch
import torch.nn as nn

from pipeline.child import timing

_REAL = []


def _faker(real):
    def time_call(*args):
        ms, out = real(*args)
        _REAL.append(ms)
        with open(os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "real_ms.json"), "w") as f:
            json.dump({"median_ms": statistics.median(_REAL)}, f)
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
