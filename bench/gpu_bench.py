"""Timing fidelity on the GPU: each task's best kernel of the H100 run evaluated EVALS times (default
3), each time in a fresh reference process and a fresh candidate child with new seeds; prints the
medians, the widest spread between any two of them, the number of timed calls, the baselines (also
timed the common plain way, for comparison with shared numbers) and the GPU-seconds per attempt
(build excluded), with the warm-start spare children a GPU lane uses."""

from __future__ import annotations

import json
import os

from pipeline.child import HARNESS, tasks
from pipeline.config import load_config
from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.sandbox.spares import Spares
from pipeline.store.store import Store

cfg = load_config("examples/config-h100.yaml")
store = Store.open(cfg.path(cfg.database))
rows = []
spares = Spares(HARNESS, ["eval"])  # as a GPU lane of `kgen run` does
for task in tasks.discover(cfg.path(cfg.tasks.directory), os.environ.get("BENCH_TASKS", "*").split()):
    best = [a for a in store.attempts(task=task.name, verdict="correct") if a["backend"] == "cuda"]
    if not best:
        continue
    a = min(best, key=lambda r: r["time_ms"])
    code = cfg.path(cfg.generated_dir) / f"{a['code_hash']}.py"
    runs, ref_phases = [], []
    for _ in range(int(os.environ.get("EVALS", "3"))):
        # Baselines come from the run's cache (measured fresh in that run); the candidate is timed anew.
        bench = prepare(task, cfg.tasks.size, "cuda", cfg.evaluation, store.get_baseline)
        ref_phases.append(bench.phases)
        result = evaluate.evaluate(bench, code, cfg.path(cfg.build_dir) / a["code_hash"], cfg.evaluation,
                                   spares=spares)
        runs.append(result)
    t = [r.time_ms for r in runs]
    e = [r.baselines.eager.median_ms for r in runs]
    c = [r.baselines.compiled.median_ms if r.baselines.compiled else None for r in runs]
    rows.append({"task": task.name, "verdicts": [r.verdict.value for r in runs], "time_ms": t,
                 "time_spread": (max(t) - min(t)) / min(t) if all(t) else None,
                 "timed_calls": [r.timing.n if r.timing else None for r in runs],
                 "baseline_calls": [runs[0].baselines.eager.n, runs[0].baselines.compiled.n if c[0] else None],
                 "eager_ms": e, "compile_ms": c,
                 "floor_ms": runs[0].baselines.floor_ms, "bandwidth_gbs": runs[0].baselines.bandwidth_gbs,
                 "eval_seconds": [r.eval_seconds for r in runs], "speedup_eager": runs[0].speedup_eager,
                 "speedup_compile": runs[0].speedup_compile, "floor_fraction": runs[0].floor_fraction,
                 "eager_plain_ms": runs[0].baselines.eager_plain_ms,
                 "compile_plain_ms": runs[0].baselines.compiled_plain_ms,
                 "phases": [r.phases for r in runs], "reference_phases": ref_phases})
    print(json.dumps(rows[-1]), flush=True)
spares.close()
print(f"\n{'task':<14}{'times ms':>26}{'spread':>8}{'calls':>6}{'eager':>9}{'compile':>9}{'floor':>8}{'x eager':>8}"
      f"{'x comp':>8}{'eval s':>8}{'eager pl':>9}{'comp pl':>9}")
for r in rows:
    times = " ".join(f"{x:.4f}" for x in r["time_ms"])
    print(f"{r['task']:<14}{times:>26}{100 * (r['time_spread'] or 0):>7.2f}%{r['timed_calls'][0] or 0:>6}"
          f"{r['eager_ms'][0]:>9.3f}{(r['compile_ms'][0] or 0):>9.3f}{r['floor_ms']:>8.3f}"
          f"{r['speedup_eager'] or 0:>8.2f}{r['speedup_compile'] or 0:>8.2f}{r['eval_seconds'][-1]:>8.1f}"
          f"{r['eager_plain_ms'] or 0:>9.3f}{r['compile_plain_ms'] or 0:>9.3f}")
