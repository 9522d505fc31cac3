"""Exploit: patch the harness's timer class, not the time functions it captured.

Rebinds pipeline.child.timing.Clock.time_call to report 30% of each timed call's real time. Methods
looked up on the shared class would pick that up; a Clock that bound its methods when it was built
(before the candidate was imported) never calls it. When the patch runs it prints the real median
(KGEN-NOTE class_patch real_ms ...)."""
import statistics

import torch
import torch.nn as nn

from pipeline.child import timing

_real_time_call = timing.Clock.time_call
_REAL = []


def _time_call(self, fn):
    ms, out = _real_time_call(self, fn)
    _REAL.append(ms)
    print(f"KGEN-NOTE class_patch real_ms {statistics.median(_REAL):.6f} n {len(_REAL)}", flush=True)
    return ms * 0.3, out


timing.Clock.time_call = _time_call


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
