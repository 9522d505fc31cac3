"""Replayed kernels against the evaluator's record: each task's best verified kernel of the H100 run,
loaded through pipeline.library and timed with the evaluator's own protocol (pipeline.child.timing.time_blocks:
blocks of fresh input sets, flush, device-wide sync), median of the block means over as many calls as
the evaluator timed. Prints recorded vs replayed."""

from __future__ import annotations

import json
import torch

from pipeline.judge.bench import timed_count
from pipeline import library
from pipeline.child import tasks, timing
from pipeline.config import load_config
from pipeline.leaderboard import best_rows
from pipeline.store.store import Store
from pipeline.child.timing import Clock

cfg = load_config("examples/config-h100.yaml")
db = cfg.path(cfg.database)
store = Store.open(db)
clock = Clock("cuda")
rows = []
for best in best_rows([a for a in store.attempts() if a["backend"] == "cuda"]):
    task = tasks.discover(cfg.path(cfg.tasks.directory), [best["task"]])[0]
    module = tasks.load_module(task, cfg.tasks.size)
    op = library.load(best["task"], db=db, backend="cuda", generated_dir=cfg.path(cfg.generated_dir),
                      builds_dir=cfg.path(cfg.build_dir))
    inputs = tasks.make_inputs(module, 1, "base", "cuda")
    calls = timed_count(cfg.evaluation, best["eager_ms"], best["compile_ms"])  # as the evaluator timed it

    def median_ms(fn) -> float:
        with torch.no_grad():
            for _ in range(5):
                fn(*inputs)
            sets = tasks.block_sets(module, inputs, "cuda")
            times = timing.time_blocks(clock, lambda x: fn(*x), sets, calls, lambda i, n: list(range(2 + i, 2 + i + n)),
                                       lambda x, seed: tasks.refill_inputs(x, module, seed, "cuda"))
        return timing.summarize_blocks(times)["median_ms"]

    replayed = median_ms(op)
    direct = median_ms(op.direct) if op.direct is not None else None  # the kernel's ModelNew, no library layer
    rows.append({"task": best["task"], "calls": calls, "code_hash": best["code_hash"], "recorded_ms": best["time_ms"],
                 "replayed_ms": replayed, "direct_ms": direct, "diff": replayed / best["time_ms"] - 1,
                 "used_kernel": op.entry is not None})
    print(json.dumps(rows[-1]), flush=True)
print(f"\n{'task':<14}{'recorded ms':>12}{'replayed ms':>12}{'ModelNew ms':>12}{'diff':>8}")
for r in rows:
    print(f"{r['task']:<14}{r['recorded_ms']:>12.4f}{r['replayed_ms']:>12.4f}{r['direct_ms'] or 0:>12.4f}"
          f"{100 * r['diff']:>7.2f}%")
