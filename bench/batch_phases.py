"""Where a batch's evaluation seconds went: per attempt, the phases the evaluator recorded
(reference start-up and baselines per task; the child's start-up, trials, timing, profile, other
sizes), as medians over the batch's attempts. Used by `STEP=batch` in gpu_check.sh (issue 14).

    python3 bench/batch_phases.py db/batch.db
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys


def main(path: str) -> None:
    db = sqlite3.connect(path)
    rows = db.execute("select task, verdict, result_json, created_utc from attempts order by created_utc").fetchall()
    phases: dict[str, list[float]] = {}
    evals = []
    for task, verdict, result, created in rows:
        d = json.loads(result or "{}")
        evals.append(d.get("eval_seconds") or 0.0)
        for k, v in (d.get("phases") or {}).items():
            phases.setdefault(k, []).append(v)
    verdicts: dict[str, int] = {}
    for _, verdict, _, _ in rows:
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    print(f"PHASES attempts={len(rows)} verdicts={verdicts}")
    # What may be read of each correct attempt's figure, and those judged again (policy 11: Outcome.earlier).
    standing: dict[str, int] = {}
    for task, verdict, result, _ in rows:
        o = json.loads(result or "{}").get("outcome") or {}
        if verdict in ("correct", "impossible_timing"):
            key = f"{verdict}/{o.get('standing', '?')}" + ("/retimed" if o.get("earlier") else "")
            standing[key] = standing.get(key, 0) + 1
            if o.get("standing") not in (None, "kept") or o.get("earlier") or verdict != "correct":
                print(f"STANDING {task} {verdict} {o.get('standing')} why={o.get('why')} earlier={o.get('earlier')}")
    print(f"STANDING {standing}")
    if evals:
        print(f"PHASES eval_seconds median {statistics.median(evals):.2f} (min {min(evals):.2f}, max {max(evals):.2f})")
    for k, v in phases.items():
        if k == "shared_draw":  # 1 where a sibling's draw was taken (pipeline.judge.bench.Draws), 0 where made
            print(f"PHASES shared draws: {int(sum(v))} of {len(v)} attempts took a sibling's")
            continue
        print(f"PHASES {k}: median {statistics.median(v):.3f} s (min {min(v):.3f}, max {max(v):.3f}, n {len(v)})")
    # Per task, its correct attempts: a task's plan (timed calls, held-out sizes) sets most of an attempt.
    keys = ("expect", "digests", "startup_calibration", "trials", "timing", "other_sizes")
    by: dict[str, list[dict]] = {}
    for task, verdict, result, _ in rows:
        if verdict == "correct":
            d = json.loads(result or "{}")
            by.setdefault(task, []).append({"eval": d.get("eval_seconds") or 0.0, **(d.get("phases") or {})})
    if by:
        print("PHASES per task (correct; medians, s): task n eval " + " ".join(keys))
    for task, found in sorted(by.items()):
        cols = [statistics.median(x.get(k, 0.0) for x in found) for k in ("eval", *keys)]
        print(f"PHASES {task} {len(found)} " + " ".join(f"{c:.2f}" for c in cols))


if __name__ == "__main__":
    main(sys.argv[1])
