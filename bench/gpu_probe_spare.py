"""Probe (issue 14): where a spare child's start-up goes, and whether it disturbs a timed kernel.

A batch attempt on the H100 waited a median 4.9 s for its child's `Ready` (docs/benchmarks.md,
twelfth session): the spare is released only after the previous attempt's timing, and then
initialises CUDA and the profiler. This prints, for fresh processes on two cores as a lane's child:
the seconds to import torch, to initialise CUDA, for a first tensor, for the first profiler session
and a second one. Then the known mse and a 4096 matmul are timed with the evaluator's clock alone,
and while fresh processes start CUDA and the profiler in a loop on other cores, alternating.

    python3 bench/gpu_probe_spare.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import time, json, sys
t = [time.monotonic()]
import torch
t.append(time.monotonic()); torch.cuda.init(); torch.empty(1, device="cuda")
t.append(time.monotonic()); x = torch.ones(1024, device="cuda"); torch.cuda.synchronize()
t.append(time.monotonic())
from torch.profiler import ProfilerActivity, profile
t.append(time.monotonic())
for _ in range(2):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        x.sum(); torch.cuda.synchronize()
    t.append(time.monotonic())
names = ["import_torch", "cuda_init", "first_tensor", "import_profiler", "profiler_first", "profiler_second"]
print("SPARE " + json.dumps({n: round(b - a, 3) for n, a, b in zip(names, t, t[1:])}), flush=True)
"""


def spare(cores: set[int]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    os.sched_setaffinity(proc.pid, cores)
    return proc


def main() -> None:
    lane, others = {0, 1}, set(range(2, os.cpu_count() or 4))
    for _ in range(3):
        started = time.monotonic()
        out = spare(lane).communicate()[0].strip()
        print(f"{out} wall={time.monotonic() - started:.2f}", flush=True)

    os.sched_setaffinity(0, lane)
    import torch

    sys.path.insert(0, os.getcwd())
    from pipeline.child.timing import Clock

    clock = Clock("cuda")
    p, t = torch.randn(128, 32768, device="cuda"), torch.randn(128, 32768, device="cuda")
    a, b = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
    kernels = {"mse": lambda: torch.mean((p - t) ** 2), "matmul4096": lambda: a @ b}
    rows: dict[str, dict[str, list[float]]] = {k: {"alone": [], "beside_spares": []} for k in kernels}
    with torch.no_grad():
        for round_ in range(6):
            for mode in ("alone", "beside_spares"):
                procs = [spare(others)] if mode == "beside_spares" else []
                end = time.monotonic() + 6.0
                while time.monotonic() < end:
                    for name, fn in kernels.items():
                        fn()
                        rows[name][mode].append(clock.time_call(fn)[0])
                    if procs and procs[-1].poll() is not None:
                        procs.append(spare(others))
                for proc in procs:
                    proc.wait()
    for name, modes in rows.items():
        line = {m: {"median": round(statistics.median(v), 5), "p90": round(statistics.quantiles(v, n=10)[-1], 5),
                    "max": round(max(v), 5), "n": len(v)} for m, v in modes.items()}
        print(f"PERTURB {name} " + json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
