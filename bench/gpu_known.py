"""The known kernels a device call measures at its start and end (docs/validation.md): if the two
disagree by more than 2%, no number from that call is trusted. Each is timed with the evaluator's own
clock (flushed, behind the hold, median of 30). Prints one JSON line.

    python bench/gpu_known.py LABEL
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from pipeline.child.timing import Clock, hold_ms, measure_bandwidth

clock = Clock("cuda")
a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
p = torch.randn(128, 4096 * 8, device="cuda")  # mse at about KernelBench's size
t = torch.randn(128, 4096 * 8, device="cuda")


def clocked(fn, n: int = 30) -> float:
    for _ in range(3):
        fn()
    return round(statistics.median(clock.time_call(fn)[0] for _ in range(n)), 4)


with torch.no_grad():
    row = {"when": sys.argv[1] if len(sys.argv) > 1 else "", "bandwidth_gbs": round(measure_bandwidth("cuda", clock), 1),
           "hold_ms": round(hold_ms(clock), 4), "matmul4096_ms": clocked(lambda: a @ b),
           "mse_ms": clocked(lambda: torch.mean((p - t) ** 2))}
print("KNOWN " + json.dumps(row), flush=True)
