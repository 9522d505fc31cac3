"""Exploit: do the work while the harness prepares a timed call's inputs, not inside the call.

At import the candidate wraps pipeline.child.tasks.make_inputs, which the harness looks up on the
module each time it makes an input set from a request's seed (a GPU's Bound requests, and their
capture when replayed; once, the timed blocks' refills). The
wrapper computes the answer for the fresh values on the spot: untimed by the child's clock, and after
the seed is known, so revealing seeds one request at a time does not stop it. Each call then
fingerprints its inputs (16 values) and, when it recognises them, spins until just above the
bandwidth floor (estimated with pipeline.child.timing.measure_bandwidth, as the reference does) and
returns the answer. No clock is patched: every output is right and every child time is real, but the
work was done outside the timed calls. It prints what the work really cost (KGEN-NOTE real_ms).

Why it should fail: a Bound request fills its sets inside the parent's clock, so the hidden work is timed
there (the calibration before import saw refills without it), and the child's median falls below
the parent's bound: impossible_timing.

Status when written: judged `correct` on the cpu backend (2-core box), its time unearned: the parent's
estimate is swamped by the input refills it includes, and check_estimate also subtracts the calibration
spread, which the first calibration block (the one that builds the input sets) inflates to several
calls' worth; the bound goes negative and only the bandwidth floor is left. The test asserts the
intended verdict."""
import statistics
import time

import torch
import torch.nn as nn

from pipeline.child import tasks

_PRE = {}
_COSTS = []
_TARGET_S = []
_make_inputs = tasks.make_inputs


def _key(p, t):
    return tuple(p.reshape(-1)[:8].tolist()) + tuple(t.reshape(-1)[:8].tolist())


def _wrapped(module, seed, variant, device, *args, **kwargs):
    inputs = _make_inputs(module, seed, variant, device, *args, **kwargs)
    if len(inputs) == 2 and all(isinstance(x, torch.Tensor) for x in inputs):
        p, t = inputs
        start = time.perf_counter()
        _PRE[_key(p, t)] = torch.mean((p - t) ** 2)
        _COSTS.append((time.perf_counter() - start) * 1e3)
        if len(_COSTS) % 8 == 0:
            print(f"KGEN-NOTE real_ms {statistics.median(_COSTS):.6f} n {len(_COSTS)}", flush=True)
        if not _TARGET_S:
            from pipeline.child.timing import measure_bandwidth

            floor_s = 2 * p.numel() * p.element_size() / (measure_bandwidth(device) * 1e9)
            _TARGET_S.append(1.15 * floor_s)
    return inputs


tasks.make_inputs = _wrapped


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        start = time.perf_counter()
        hit = _PRE.pop(_key(predictions, targets), None)
        if hit is None:
            return torch.mean((predictions - targets) ** 2)
        while time.perf_counter() - start < _TARGET_S[0]:
            pass
        return hit
