"""Per turn of a search run: correct %, fast_1, fast_compile, best speedup, and where the seconds went.

    python bench/search_turns.py db/h100-refine.db [RUN_ID]

The conversation figures are kgen report's (pipeline.report.page.search_data: each conversation's best so
far after the turn). Seconds are summed over the turn's attempts: the model call (completions.seconds,
0 for a replayed answer), the build (builds.seconds, counted once, at the first attempt of its hash),
the evaluation (the result's eval_seconds). Builds reused from an earlier run count nothing.
Conversations run concurrently, so a turn's sums are work,
not wall time; the run's wall time is printed last.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

from pipeline.report.page import search_data
from pipeline.store.store import Store


def main(db: str, run_id: str | None = None) -> None:
    if not Path(db).is_file():
        sys.exit(f"{db}: no such database")
    store = Store.open(db)
    run_id = run_id or store.latest_run_id()
    rows = store.attempts(run=run_id)
    data = search_data(rows)
    started = (store.get_run(run_id) or {}).get("started_utc") or ""
    seconds: dict[int, dict[str, float]] = {}
    built: set[str] = set()
    for r in sorted(rows, key=lambda r: r["created_utc"]):
        s = seconds.setdefault(r["turn"], {"model": 0.0, "build": 0.0, "eval": 0.0})
        full = store.attempt(r["id"])
        s["model"] += full["completion"].seconds if full.get("completion") else 0.0
        if r["code_hash"] and r["code_hash"] not in built:
            built.add(r["code_hash"])
            b = next(iter(store.db.query("SELECT seconds, created_utc FROM builds WHERE code_hash = ?",
                                         [r["code_hash"]])), None)
            if b and b["created_utc"] >= started:  # built by this run, not reused from an earlier one
                s["build"] += b["seconds"] or 0.0
        s["eval"] += full["result"].eval_seconds
    print(f"run {run_id}: {len(rows)} attempts")
    print(f"{'turn':>4} {'attempts':>8} {'correct':>8} {'fast_1':>7} {'fast_c':>7} {'best xe':>8} "
          f"{'model s':>8} {'build s':>8} {'eval s':>8}")
    for q in (data or {}).get("per_step", []):
        s = seconds.get(q["step"] - 1, {})
        print(f"{q['step']:>4} {q['attempts']:>8} {100 * q['correct']:>7.0f}% {100 * q['fast_1']:>6.0f}% "
              f"{100 * q['fast_compile']:>6.0f}% {q['best_eager'] or 0:>8.3g} {s.get('model', 0):>8.1f} "
              f"{s.get('build', 0):>8.1f} {s.get('eval', 0):>8.1f}")
    for t in (data or {}).get("per_task", []):
        print(f"  {t['task']:<14} best x eager by turn: " + "  ".join("-" if v is None else f"{v:.3g}" for v in t["best"]))
    run = store.get_run(run_id) or {}
    if run.get("started_utc") and run.get("finished_utc"):
        wall = datetime.fromisoformat(run["finished_utc"]) - datetime.fromisoformat(run["started_utc"])
        print(f"run wall seconds: {wall.total_seconds():.0f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
