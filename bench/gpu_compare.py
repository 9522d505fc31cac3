"""Two `kgen run`s of examples/config-h100-ab.yaml on one machine, compared attempt by attempt (the replayed
completions are the same in both): each correct kernel's time and eager timed beside it, and how far
the second run is from the first.

    python bench/gpu_compare.py db/h100-start.db db/h100-end.db
"""

from __future__ import annotations

import sys

from pipeline.store.store import Store


def best(path: str) -> dict[tuple, dict]:
    return {(r["task"], r["sample"]): r for r in Store.open(path).attempts(verdict="correct") if r["time_ms"]}


first, second = best(sys.argv[1]), best(sys.argv[2])
worst = 0.0
print(f"{'task, sample':<22}{'kernel ms A':>12}{'kernel ms B':>12}{'diff':>8}{'eager ms A':>12}{'eager ms B':>12}{'diff':>8}"
      f"{'unfit':>7}")
for task in sorted(first):
    a, b = first[task], second.get(task)
    if b is None:
        print(f"{str(task):<22} missing in the second run")
        continue
    dk = b["time_ms"] / a["time_ms"] - 1
    de = b["eager_ms"] / a["eager_ms"] - 1 if a["eager_ms"] and b["eager_ms"] else float("nan")
    worst = max(worst, abs(dk), abs(de) if de == de else 0.0)
    unfit = "yes" if a.get("device_unfit") or b.get("device_unfit") else "no"
    print(f"{str(task):<22}{a['time_ms']:>12.4f}{b['time_ms']:>12.4f}{dk:>+8.2%}{a['eager_ms']:>12.4f}{b['eager_ms']:>12.4f}"
          f"{de:>+8.2%}{unfit:>7}")
print(f"COMPARE widest difference {worst:.2%}")
