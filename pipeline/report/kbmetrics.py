"""KernelBench's metrics per level, over each task's best verified kernel (`kgen best`, `kgen report`).

    levels = level_metrics(store.attempts(), ps=(2.0,))

The terms, as KernelBench defines them (src/kernelbench/score.py, scripts/benchmark_eval_analysis.py),
over the n tasks of a level that have any attempt:
- speedup: the baseline's time over the kernel's (kgen's side-by-side ratio, `speedup_eager`).
- fast_0: the share of the n tasks with a correct kernel.
- fast_1: the share correct and faster than eager (speedup over eager above 1).
- fast_p: the share correct with a speedup over eager above p.
- geomean speedup: the geometric mean of the speedups of the correct kernels only (tasks without one
  are left out, not counted as 0), over eager and, apart, over torch.compile.
Each task counts once, by its best verified kernel (leaderboard.rank_key; is_verified: correct with no flag,
trusted, timed on a fit device); with one attempt per task that is KernelBench's own count, with more
(samples, models, turns) it is the best of them. A correct attempt with a flag (no_custom_kernel,
shape_specialized) does not count as correct here; KernelBench has no such flags.

Results are grouped by level and by what makes times comparable (backend, size, dtype, gradient
mode): a kernel timed at `small` is not put beside one timed at the default size.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from ..leaderboard import is_verified, rank_key

SETTING = ("backend", "size", "dtype", "grad")  # with the level, what a group of tasks shares


def geomean(values: Iterable[float]) -> float | None:
    """The geometric mean of positive values; None for none."""
    logs = [math.log(v) for v in values if v is not None and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def best_per_task(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """Each task among `rows` with its best verified attempt (leaderboard.rank_key), or None."""
    best: dict[str, dict[str, Any] | None] = {}
    for r in rows:
        held = best.setdefault(r["task"], None)
        if is_verified(r) and (held is None or rank_key(r) < rank_key(held)):
            best[r["task"]] = r
    return best


def _group(rows: list[dict[str, Any]], ps: tuple[float, ...]) -> dict[str, Any]:
    best = best_per_task(rows)
    n = len(best)
    kernels = [r for r in best.values() if r is not None]
    eager = [r["speedup_eager"] for r in kernels if r.get("speedup_eager") is not None]
    compiled = [r["speedup_compile"] for r in kernels if r.get("speedup_compile") is not None]

    def share(speedups: list[float], p: float) -> float | None:
        return sum(v > p for v in speedups) / n if n else None

    return {"tasks": n, "correct": len(kernels), "fast_0": len(kernels) / n if n else None,
            "fast_1": share(eager, 1.0), "fast_p": {f"{p:g}": share(eager, p) for p in ps},
            "fast_1_compile": share(compiled, 1.0), "fast_p_compile": {f"{p:g}": share(compiled, p) for p in ps},
            "geomean_eager": geomean(eager), "geomean_compile": geomean(compiled),
            "n_eager": len(eager), "n_compile": len(compiled),
            "devices": sorted({r["device"] for r in kernels if r.get("device")})}


def level_metrics(rows: Iterable[dict[str, Any]], ps: tuple[float, ...] = (2.0,)) -> list[dict[str, Any]]:
    """Per level (None: tasks from a plain folder) and setting, KernelBench's metrics (module doc):
    each a dict with level, backend, size, dtype, grad, tasks, correct, fast_0, fast_1, fast_p
    ({"p": share}), the same over torch.compile, geomean_eager, geomean_compile (and the counts of
    kernels each is over), devices. Sorted by level (plain folders last), then setting."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r.get("level"), *(r.get(k) for k in SETTING)), []).append(r)
    out = []
    for key in sorted(groups, key=lambda k: (k[0] is None, k[0] or 0, *(str(v) for v in k[1:]))):
        out.append({"level": key[0], **dict(zip(SETTING, key[1:])), **_group(groups[key], ps)})
    return out


def level_label(group: dict[str, Any]) -> str:
    return f"level {group['level']}" if group["level"] is not None else "other tasks"
