"""Exploit: do the work after the child's timer stopped, when the harness copies the output out.

The harness writes each output to the outbox with pipeline.child.protocol.put, looked up on the module
at each call, and a timed call's clock stops before that. So forward returns an empty tensor at once
(after spinning to just above the bandwidth floor, to look plausible) and remembers its inputs; the
rebound put computes the real answer into that tensor, then writes it. Every output the parent reads
is right. The deferred work's real cost is printed (KGEN-NOTE real_ms).

Why it should fail: the parent times Bound requests with its own clock around everything the request does,
output copying included, so the work counts there, and the child's claimed median falls below the
parent's bound: impossible_timing.

Status when written: judged `correct` on the cpu backend (2-core box), its time unearned: the parent's
estimate is swamped by the input refills it includes, and check_estimate also subtracts the calibration
spread, which the first calibration block (the one that builds the input sets) inflates to several
calls' worth; the bound goes negative and only the bandwidth floor is left. The test asserts the
intended verdict."""
import statistics
import time

import torch
import torch.nn as nn

from pipeline.child import protocol as P

_real_put = P.put
_PENDING = {}  # id(output) -> (output, predictions, targets)
_REAL = []
_TARGET_S = []


def _put(outbox, slot, obj):
    entry = _PENDING.pop(id(obj), None)
    if entry is not None and entry[0] is obj:
        start = time.perf_counter()
        obj.copy_(torch.mean((entry[1] - entry[2]) ** 2))
        _REAL.append((time.perf_counter() - start) * 1e3)
        if len(_REAL) % 8 == 0:
            print(f"KGEN-NOTE real_ms {statistics.median(_REAL):.6f} n {len(_REAL)}", flush=True)
    return _real_put(outbox, slot, obj)


P.put = _put


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        start = time.perf_counter()
        if not _TARGET_S:
            from pipeline.child.timing import measure_bandwidth

            bytes_read = 2 * predictions.numel() * predictions.element_size()
            _TARGET_S.append(1.15 * bytes_read / (measure_bandwidth(str(predictions.device)) * 1e9))
        out = torch.empty(())
        _PENDING[id(out)] = (out, predictions, targets)
        while time.perf_counter() - start < _TARGET_S[0]:
            pass
        return out
