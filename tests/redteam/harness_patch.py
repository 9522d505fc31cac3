"""Exploit (known gap): patch the harness's timer class itself, not the time functions it captured.

Clock takes its references to perf_counter_ns etc. before the candidate is imported, but its methods
are still looked up on the shared class, so rebinding pipeline.timing.Clock.time_call changes what
the harness calls. The fake reports 30% of each timed call's real time. The parent-bracketed block
(Clock.block_ms) is left honest, so the child's block time agrees with the parent's wall clock; the
timed calls themselves are compared with nothing but the bandwidth floor. It writes the real times
into TORCH_EXTENSIONS_DIR (real_ms.json) so the test can compare."""
import json
import os
import statistics

import torch
import torch.nn as nn

from pipeline import timing

_real_time_call = timing.Clock.time_call


_REAL = []


def _time_call(self, fn):
    ms, out = _real_time_call(self, fn)
    _REAL.append(ms)
    with open(os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "real_ms.json"), "w") as f:
        json.dump({"median_ms": statistics.median(_REAL)}, f)
    return ms * 0.3, out


timing.Clock.time_call = _time_call


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
