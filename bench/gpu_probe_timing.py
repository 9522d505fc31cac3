"""Which step of the timing protocol moves compiled references, and what an attempt's start-up costs.

Part 1: compiled (and one eager) references at KernelBench sizes, each step of
pipeline.child.timing.Clock.time_call added alone to a plain synced event timing:

  synced      sync; events around the call; sync            (same inputs every call)
  refill      new values in the same storage first
  fill        a 256 MB fill (writes) first, synced
  reset       the persisting-L2 reset alone, synced
  read        a 256 MB read-only reduction first, synced
  fill_q      reset + fill left queued: launch overhead hides behind it
  read_q      read left queued
  clock       Clock.time_call as kgen records it (refill + reset + fill, synced)

Part 2: what start-up costs in a fresh process: import torch, CUDA init, the first and the second
torch.profiler session with CUDA activity.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from pipeline.child import tasks
from pipeline.child.timing import Clock
from probe_kit import event_ms, reference

ROOT = Path(__file__).resolve().parent.parent


def timed(model, inputs, before, sync_before=True, module=None, n=30) -> float:
    for _ in range(3):
        model(*inputs)
    times = []
    for i in range(n):
        before(i)
        if sync_before:
            torch.cuda.synchronize()
        times.append(event_ms(lambda: model(*inputs)))
    return statistics.median(times)


def part1() -> None:
    clock = Clock("cuda")
    buf = clock._flush_buf
    rows = []
    for name in os.environ.get("PROBE_TASKS", "mse kl_div hinge cross_entropy").split():
        module, model, inputs = reference(name)
        models = {"compile": torch.compile(model)}
        if name == "mse":
            models["eager"] = model
        with torch.no_grad():
            for label, m in models.items():
                nothing = lambda i: None  # noqa: E731
                row = {"task": name, "model": label,
                       "synced": timed(m, inputs, nothing),
                       "refill": timed(m, inputs, lambda i: tasks.refill_inputs(inputs, module, 100 + i, "cuda")),
                       "fill": timed(m, inputs, lambda i: buf.fill_(1.0)),
                       "reset": timed(m, inputs, lambda i: clock._reset_l2()),
                       "read": timed(m, inputs, lambda i: buf.sum()),
                       "fill_q": timed(m, inputs, lambda i: (torch.cuda.synchronize(), clock._reset_l2(),
                                                               buf.fill_(1.0)), sync_before=False),
                       "read_q": timed(m, inputs, lambda i: (torch.cuda.synchronize(), buf.sum()), sync_before=False)}
                times = []
                for i in range(30):
                    tasks.refill_inputs(inputs, module, 200 + i, "cuda")
                    times.append(clock.time_call(lambda: m(*inputs))[0])
                row["clock"] = statistics.median(times)
                rows.append(row)
                print(json.dumps(row), flush=True)
        del models, model, inputs
        torch.cuda.empty_cache()
    cols = ["synced", "refill", "fill", "reset", "read", "fill_q", "read_q", "clock"]
    print(f"\n{'task':<14}{'model':<9}" + "".join(f"{c:>9}" for c in cols))
    for r in rows:
        print(f"{r['task']:<14}{r['model']:<9}" + "".join(f"{r[c]:>9.3f}" for c in cols))


STARTUP = r"""
import time, json
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
from torch.profiler import profile, ProfilerActivity
x = torch.randn(1 << 20, device="cuda")
out = {}
for k in (1, 2):
    a = time.perf_counter()
    p = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    p.__enter__()
    b = time.perf_counter()
    x.sum(); torch.cuda.synchronize()
    p.__exit__(None, None, None)
    c = time.perf_counter()
    ev = p.events()
    d = time.perf_counter()
    out[f"profiler{k}"] = {"enter": round(b - a, 3), "exit": round(c - b, 3), "events": round(d - c, 3)}
print(json.dumps({"import_torch": round(t1 - t0, 3), "cuda_init": round(t2 - t1, 3), **out}))
"""


def part2() -> None:
    for _ in range(2):
        print("startup", subprocess.run([sys.executable, "-c", STARTUP], capture_output=True, text=True).stdout.strip(),
              flush=True)


def part3() -> None:
    """The reference process's stages, with and without the compile baseline."""
    from pipeline.judge import evaluate
    from pipeline.judge.bench import prepare
    from pipeline.config import load_config

    settings = load_config(ROOT / "config-h100.yaml").evaluation
    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    for compile_baseline in (True, False):
        s = settings.model_copy(update={"compile_baseline": compile_baseline})
        bench = prepare(task, "default", "cuda", s)
        print(f"reference mse compile_baseline={compile_baseline}: cumulative seconds {bench.phases}", flush=True)


if __name__ == "__main__":
    part2()
    part3()
    part1()
