"""The known kernels a device call measures at its start and end (docs/benchmarks.md): if the two
disagree by more than 2%, no number from that call is trusted. Prints one JSON line.

    python scripts/gpu_known.py start|end
"""

from __future__ import annotations

import json
import sys

import torch

from pipeline.child.timing import Clock, hold_ms, measure_bandwidth, plain_ms

clock = Clock("cuda")
a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
p = torch.randn(128, 4096 * 8, device="cuda")  # mse at about KernelBench's size
t = torch.randn(128, 4096 * 8, device="cuda")
with torch.no_grad():
    row = {"when": sys.argv[1] if len(sys.argv) > 1 else "", "bandwidth_gbs": round(measure_bandwidth("cuda", clock), 1),
           "hold_ms": round(hold_ms(clock), 4), "matmul4096_ms": round(plain_ms(lambda: a @ b), 4),
           "mse_ms": round(plain_ms(lambda: torch.mean((p - t) ** 2)), 4)}
print("KNOWN " + json.dumps(row), flush=True)
