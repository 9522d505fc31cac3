"""Where a reference block's lane time goes (the batch's eager 1.31 s and torch.compile 0.77 s an
attempt, 32nd session), at KernelBench sizes: the reference process's own methods called in this
process, the device synchronized around each step.

    python bench/probe_blocks.py mse cosine cross_entropy      (prints PROBE lines)

Per task: how many calls an attempt times (timing.calls_for on the eager call), a whole block as the
reference serves it (Reference.time_block inside IdleProbe.timed), and its parts alone: drawing a
call's inputs (tasks.make_inputs), writing them into the set (refill_inputs: the draw plus a copy),
one timed call (Clock.time_call: flush, hold, call, syncs), the call between events, and the idle
probe's checks around a block.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from pipeline.child import tasks
from pipeline.child.timing import BLOCK, Clock, calls_for
from pipeline.judge import reference as R
from pipeline.judge.health import IdleProbe
from probe_kit import DEV, SIZE, seed, sync

ROOT = Path(__file__).resolve().parent.parent


def ms_of(fn, repeat: int = 5) -> tuple[float, float]:
    """(median, min) milliseconds of fn() between syncs."""
    out = []
    for _ in range(repeat):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out), min(out)


def probe(name: str) -> None:
    path = ROOT / "reference_tasks" / f"{name}.py"
    job = {"device": DEV, "task_path": str(path), "grad": False, "dtype": "float32", "size": SIZE,
           "init_seed": 1, "baseline_seeds": [seed() for _ in range(4)], "warmup": 5}
    ref = R.Reference(job)
    init = seed()
    module, m32, _ = ref.models_for(SIZE, init)
    inputs = tasks.make_inputs(module, seed(), "base", DEV)
    nbytes = tasks.input_bytes(inputs)
    clock = Clock(DEV)
    with torch.no_grad():
        for _ in range(3):
            m32(*inputs)
        call_ms, _ = ms_of(lambda: m32(*inputs))
        calls = calls_for(call_ms, 100.0, 30, 256)
        print(f"PROBE {name} inputs {nbytes / 2**20:.0f} MiB, eager call {call_ms:.3f} ms, "
              f"{calls} timed calls = {-(-calls // BLOCK)} blocks an attempt", flush=True)
        draw, draw_min = ms_of(lambda: tasks.make_inputs(module, seed(), "base", DEV))
        refill, refill_min = ms_of(lambda: tasks.refill_inputs(inputs, module, seed(), DEV))
        timed, timed_min = ms_of(lambda: clock.time_call(lambda: m32(*inputs)))
        flush, _ = ms_of(clock.flush)
        print(f"PROBE {name} parts (median/min ms): draw {draw:.2f}/{draw_min:.2f}, refill (draw + copy) "
              f"{refill:.2f}/{refill_min:.2f}, timed call (flush, hold, call, syncs) {timed:.2f}/{timed_min:.2f}, "
              f"flush {flush:.3f}", flush=True)
    del inputs
    idle = IdleProbe() if DEV == "cuda" else None
    if idle is not None:
        check, _ = ms_of(lambda: (idle.wait(), idle.busy_ms()))
        print(f"PROBE {name} idle probe's checks around a block: {check:.2f} ms", flush=True)
    for label, compiled in (("eager", False), ("compiled", True)):
        walls = []
        for rnd in range(10):
            seeds = [seed() for _ in range(BLOCK)]
            sync()
            t = time.perf_counter()
            if idle is not None:
                idle.timed(lambda: ref.time_block(SIZE, init, seeds, 5 if rnd == 0 else 0, compiled))
            else:
                ref.time_block(SIZE, init, seeds, 5 if rnd == 0 else 0, compiled)
            sync()
            walls.append((time.perf_counter() - t) * 1e3)
        rest = walls[1:]
        print(f"PROBE {name} {label} block of {BLOCK}: first {walls[0]:.1f} ms, then median {statistics.median(rest):.1f} "
              f"(min {min(rest):.1f}, max {max(rest):.1f}); an attempt's {-(-calls // BLOCK)} blocks ~ "
              f"{(walls[0] + statistics.median(rest) * (-(-calls // BLOCK) - 1)) / 1e3:.2f} s", flush=True)
    ref.release()
    if DEV == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    for n in sys.argv[1:] or ["mse"]:
        probe(n)
