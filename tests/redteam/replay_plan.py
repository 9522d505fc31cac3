"""Exploit: read ahead. The child once held the whole plan, timed seeds included, from the first call
on; now each request reveals only its own seeds, but a timed block or a Bound request fills all its
input sets before its first call. So on a call the candidate walks up the stack to the harness's
`sets`, computes the answers for every set at once, and serves the block's later calls from that,
each spinning only until just above the bandwidth floor (pipeline.child.timing.measure_bandwidth).
No clock is patched and every output is right. It prints what the work really cost per call
(KGEN-NOTE real_ms) when it finds the sets.

Why it does not pay: every call of a block is timed and the recorded time is the median of block
means, so work moved from a block's later calls into its first still counts in full; and a Bound
request is timed whole by the parent's clock."""
import statistics
import sys
import time

import torch
import torch.nn as nn

_PRE = {}
_COSTS = []
_TARGET_S = []


def _key(p, t):
    return tuple(p.reshape(-1)[:8].tolist()) + tuple(t.reshape(-1)[:8].tolist())


def _read_ahead():
    frame = sys._getframe(2)
    while frame is not None:
        sets = frame.f_locals.get("sets")
        if isinstance(sets, list) and sets and all(isinstance(s, list) and len(s) == 2 for s in sets):
            break
        frame = frame.f_back
    else:
        return
    start = time.perf_counter()
    for p, t in sets:
        _PRE[_key(p, t)] = torch.mean((p - t) ** 2)
    _COSTS.append((time.perf_counter() - start) * 1e3 / len(sets))
    print(f"KGEN-NOTE real_ms {statistics.median(_COSTS):.6f} n {len(_COSTS)}", flush=True)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        start = time.perf_counter()
        if not _TARGET_S:
            from pipeline.child.timing import measure_bandwidth

            floor_s = 2 * predictions.numel() * predictions.element_size() / (measure_bandwidth("cpu") * 1e9)
            _TARGET_S.append(1.15 * floor_s)
        hit = _PRE.pop(_key(predictions, targets), None)
        if hit is None:
            _PRE.clear()
            _read_ahead()
            hit = _PRE.pop(_key(predictions, targets), None)
            if hit is None:
                return torch.mean((predictions - targets) ** 2)
        while time.perf_counter() - start < _TARGET_S[0]:
            pass
        return hit
