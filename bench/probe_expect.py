"""Where an attempt's `expect` (1.9 s median in the 24th session's batch) and its reference blocks go,
on a GPU, at KernelBench sizes: the reference process's own methods called in this process, one
step at a time with the device synchronized, for an attempt's worth of specs and digests.

    python bench/probe_expect.py mse cosine      (prints PROBE lines)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from pipeline.child import tasks
from pipeline.judge import reference as R
from pipeline.judge.evaluate import CHECKED_TIMED, REPLAY_CHECKS
from probe_kit import DEV, SIZE, seed, sync

ROOT = Path(__file__).resolve().parent.parent


def clock(label, fn, *args, **kw):
    sync()
    t = time.perf_counter()
    out = fn(*args, **kw)
    sync()
    ms = (time.perf_counter() - t) * 1e3
    return out, ms


def one_spec(module, m32, m64, steps: dict[str, list[float]]) -> None:
    def step(label, fn, *args):
        out, ms = clock(label, fn, *args)
        steps.setdefault(label, []).append(ms)
        return out

    inputs = step("make_inputs", tasks.make_inputs, module, seed(), "base", DEV)
    in64 = step("as64", R._as64, inputs)
    with torch.no_grad():
        _, parts = step("m64", lambda: R._parts(m64(*in64)))
        _, parts32 = step("m32", lambda: R._parts(m32(*inputs)))
    step("errs", lambda: [R._errs(a, b) for (_, a), (_, b) in zip(parts32, parts)])
    os.close(step("memfd", lambda: R.sealed_memfd("kgen-expected", *(
        t.detach().reshape(-1).to(device="cpu", dtype=torch.float64).numpy() for _, t in parts))))


def probe(name: str) -> None:
    path = ROOT / "reference_tasks" / f"{name}.py"
    job = {"device": DEV, "task_path": str(path), "grad": False, "dtype": "float32", "size": SIZE,
           "init_seed": 1, "baseline_seeds": [seed() for _ in range(4)], "warmup": 5}
    ref = R.Reference(job)
    init = seed()
    module, m32, m64 = ref.models_for(SIZE, init)
    n_specs = 5 + CHECKED_TIMED + 8  # trials, checked timed calls, one checked call a Bound request
    # One spec's steps, as Reference.expected takes them (in a function: its tensors die at return).
    steps: dict[str, list[float]] = {}
    for _ in range(6):
        one_spec(module, m32, m64, steps)
    for k, v in steps.items():
        print(f"PROBE {name} step {k}: median {sorted(v)[len(v) // 2]:.2f} ms (min {min(v):.2f}, max {max(v):.2f})")
    # A whole attempt's expect, as the reference serves it.
    t = time.perf_counter()
    for i in range(n_specs):
        meta = ref.expected(SIZE, init, seed(), tasks.VARIANTS[i % 4])
        os.close(meta["values_fd"])
    sync()
    print(f"PROBE {name} expect x{n_specs}: {time.perf_counter() - t:.3f} s")
    seeds_b = [seed()]
    t = time.perf_counter()
    for b in range(8 * REPLAY_CHECKS):
        ref.digest(SIZE, init, seeds_b, b, seed(), seed())
    sync()
    print(f"PROBE {name} digests x{8 * REPLAY_CHECKS}: {time.perf_counter() - t:.3f} s")
    # The reference's blocks after `release` (each attempt's expect ends with one).
    blk = [seed() for _ in range(4)]
    for label, compiled in (("eager", False), ("compiled", True)):
        for rnd in range(3):
            if rnd == 2:
                ref.release(); ref.models_for(SIZE, init)
            _, ms = clock(label, ref.time_block, SIZE, init, blk, 5, compiled)
            print(f"PROBE {name} {label} block {'after release' if rnd == 2 else rnd}: {ms:.1f} ms")
    ref.release()
    if DEV == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    for n in sys.argv[1:] or ["mse"]:
        probe(n)
