"""Why do our torch.compile baselines differ from shared/baselines-h100.md? Times eager and compiled
references of every task at KernelBench sizes in this (plain, unsandboxed) process under several
protocols, so the one that reproduces the shared table, and the gap between protocols, are visible:

  do_bench   triton.testing.do_bench (flush by zeroing 256 MB, no sync between reps), median
  loop       5 warm-ups, 30 calls each bracketed by events, no sync between calls, median
  synced     as loop, with a device sync before and after each call
  clock      pipeline.child.timing.Clock.time_call with new values in the same storage (what kgen records)
  clock_async  the same, with the flush left queued so launch overhead hides behind it
  cpu_us     CPU-side time for the call to return (no sync): the launch overhead

Also the compiled model under mode="max-autotune-no-cudagraphs" for the tasks named in MAX_TASKS.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

from pipeline.child import tasks
from pipeline.child.timing import Clock
from probe_kit import event_ms, reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def loop(fn, synced: bool) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    pairs = []
    for _ in range(30):
        if synced:
            torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        if synced:
            torch.cuda.synchronize()
        pairs.append((s, e))
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in pairs]
    return statistics.median(times)


def cpu_us(fn) -> float:
    out = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def clock_ms(model, module, inputs, clock) -> float:
    times = []
    for seed in range(100, 130):
        tasks.refill_inputs(inputs, module, seed, "cuda")
        ms, _ = clock.time_call(lambda: model(*inputs))
        times.append(ms)
    return statistics.median(times)


def clock_async_ms(model, module, inputs, clock) -> float:
    """Clock's protocol, except the flush is left queued (no sync before the start event), so the GPU
    is busy while the CPU launches the call: launch overhead hides behind the flush, as in do_bench."""
    times = []
    for seed in range(100, 130):
        tasks.refill_inputs(inputs, module, seed, "cuda")
        torch.cuda.synchronize()
        clock._reset_l2()
        clock._flush_buf.fill_(1.0)
        times.append(event_ms(lambda: model(*inputs)))
    return statistics.median(times)


def main() -> None:
    from triton.testing import do_bench

    clock = Clock("cuda")
    max_tasks = os.environ.get("MAX_TASKS", "cross_entropy hinge").split()
    names = os.environ.get("PROBE_TASKS", "*").split()
    rows = []
    for task in tasks.discover(__import__("pathlib").Path(ROOT) / "reference_tasks", names):
        module, model, inputs = reference(task.name)
        variants = {"eager": model, "compile": torch.compile(model)}
        if task.name in max_tasks:
            variants["max_autotune"] = torch.compile(model, mode="max-autotune-no-cudagraphs")
        with torch.no_grad():
            for label, m in variants.items():
                t0 = time.perf_counter()
                m(*inputs)
                torch.cuda.synchronize()
                first_s = time.perf_counter() - t0
                fn = lambda m=m: m(*inputs)  # noqa: E731
                row = {"task": task.name, "model": label, "first_call_s": round(first_s, 2),
                       "do_bench": do_bench(fn, warmup=25, rep=200, return_mode="median"),
                       "loop": loop(fn, False), "synced": loop(fn, True),
                       "clock": clock_ms(m, module, inputs, clock),
                       "clock_async": clock_async_ms(m, module, inputs, clock), "cpu_us": cpu_us(fn)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        del variants, model, inputs
        torch.cuda.empty_cache()
    print(f"\n{'task':<14}{'model':<13}{'do_bench':>9}{'loop':>9}{'synced':>9}{'clock':>9}{'async':>9}{'cpu us':>8}")
    for r in rows:
        print(f"{r['task']:<14}{r['model']:<13}{r['do_bench']:>9.3f}{r['loop']:>9.3f}{r['synced']:>9.3f}"
              f"{r['clock']:>9.3f}{r['clock_async']:>9.3f}{r['cpu_us']:>8.0f}")

    # The same baselines through the sandboxed reference process that `kgen run` uses.
    from pipeline.judge import evaluate
    from pipeline.judge.bench import prepare
    from pipeline.config import load_config

    settings = load_config(os.path.join(ROOT, "config-h100.yaml")).evaluation
    for task in tasks.discover(__import__("pathlib").Path(ROOT) / "reference_tasks",
                               os.environ.get("PROBE_REF", "mse cross_entropy").split()):
        t0 = time.perf_counter()
        bench = prepare(task, "default", "cuda", settings)
        b = bench.baselines
        print(f"reference process {task.name}: eager {b.eager.median_ms:.3f} compile "
              f"{b.compiled.median_ms if b.compiled else float('nan'):.3f} floor {b.floor_ms:.3f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
