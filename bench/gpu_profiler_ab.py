"""Does starting the profiler (CUPTI) before the timed calls change them? Each named task's best
kernel is evaluated twice with the profiler warmed before the job (kgen's default, profile on) and
twice with no profiler in the child at all (profile off), alternating; prints the medians."""

from __future__ import annotations

import os
import statistics

from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.sandbox.spares import Spares
from pipeline.child import HARNESS, tasks
from pipeline.config import load_config
from pipeline.store.store import Store

cfg = load_config("config-h100.yaml")
store = Store.open(cfg.path(cfg.database))
spares = Spares(HARNESS, ["eval"])
for task in tasks.discover(cfg.path(cfg.tasks.directory), os.environ.get("AB_TASKS", "cross_entropy kl_div").split()):
    best = [a for a in store.attempts(task=task.name, verdict="correct") if a["backend"] == "cuda"]
    a = min(best, key=lambda r: r["time_ms"])
    code = cfg.path(cfg.generated_dir) / f"{a['code_hash']}.py"
    bench = prepare(task, cfg.tasks.size, "cuda", cfg.evaluation, store.get_baseline)
    times: dict[bool, list[float]] = {True: [], False: []}
    for profile in (True, False, True, False):
        settings = cfg.evaluation.model_copy(update={"profile": profile})
        r = evaluate.evaluate(bench, code, cfg.path(cfg.build_dir) / a["code_hash"], settings)
        times[profile].append(r.time_ms)
    print(f"{task.name}: profiler warmed {[round(t, 4) for t in times[True]]} "
          f"no profiler {[round(t, 4) for t in times[False]]} "
          f"diff {100 * (statistics.mean(times[True]) / statistics.mean(times[False]) - 1):+.2f}%", flush=True)
spares.close()
