"""`kgen report`: one self-contained HTML page (inline CSS, plotly.js and figure JSON; no network).

    html = render(store.attempts(run=run_id), source="db/kgen.db", run=run_id)

The numbers are computed here, the figures are built in report_charts.py, and the template lays them
out; every chart has a table beside it with the same numbers as text, so the page can be checked,
searched and diffed. Text from models, tasks and candidates is escaped (Jinja autoescape in the tables,
report_charts._text in the charts).
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
from plotly.offline import get_plotlyjs

from ..leaderboard import best_rows, is_verified, none_verified, not_verified_reason
from ..records import Verdict
from .charts import VERDICT_COLOURS, distribution_figure, fast_p_figure, floor_speedup, search_figure, speedup_figure, verdict_figure
from .kbmetrics import best_per_task, level_label, level_metrics

MAX_BARS = 40  # correct attempts drawn per task chart, best first (the task's table lists every attempt)
TASK_CHARTS = 20  # above this many tasks, no chart per task: each task's table is one click away instead
REPORT_PS = (0.5, 0.8, 1.5, 2.0)  # fast_p's p in the per-level table, beside fast_0 and fast_1 (KernelBench's grid)
ERROR_CHARS = 300  # an error cell shows this much of the error; `kgen show ID` has all of it

__all__ = ["render", "report_data", "report_json", "fast_p", "search_data", "floor_speedup", "MAX_BARS", "TASK_CHARTS"]


def _nice_step(span: float, target: int = 5) -> float:
    """A 1-2-5 step giving about `target` intervals over span."""
    raw = max(span, 1e-12) / target
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def _verdict_rank(verdict: str) -> int:
    order = [v.value for v in Verdict]
    return order.index(verdict) if verdict in order else len(order)


def _task(task: str, mine: list[dict[str, Any]], chart: bool = True) -> dict[str, Any]:
    """One task: its verified attempts best first (numbered as in its chart), then the correct ones not
    verified, then every other attempt by verdict, and (with `chart`) the chart of the best MAX_BARS
    verified ones."""
    verified = sorted((r for r in mine if is_verified(r)), key=lambda r: (-(r["speedup_eager"] or 0.0), r["id"]))
    rest = sorted((r for r in mine if not is_verified(r)),  # correct (not verified) first
                  key=lambda r: (r["verdict"] != "correct", _verdict_rank(r["verdict"]), r["id"]))
    listed = [{"rank": i, "row": r} for i, r in enumerate(verified, 1)] + [{"rank": None, "row": r} for r in rest]
    return {"name": task, "attempts": len(mine), "correct": sum(r["verdict"] == "correct" for r in mine),
            "verified": verified, "listed": listed,
            "figure": speedup_figure(verified[:MAX_BARS]) if verified and chart else None,
            "cut": max(0, len(verified) - MAX_BARS)}


def _verdicts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model, how many attempts ended in each verdict."""
    by_model: dict[str, Counter] = {}
    for r in rows:
        by_model.setdefault(r["model"], Counter())[r["verdict"]] += 1
    models = [{"model": m, "counts": c, "total": sum(c.values())} for m, c in sorted(by_model.items())]
    seen = sorted({v for m in models for v in m["counts"]}, key=lambda v: (_verdict_rank(v), v))
    return {"models": models, "verdicts": seen, "colours": VERDICT_COLOURS,
            "figure": verdict_figure(models) if models else None}


def fast_p(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """fast_p: the share of all attempts that are verified (leaderboard.is_verified) with a speedup above
    p, over eager and over torch.compile; a table at a 1-2-5 grid of p, and the exact step curves for
    the chart."""
    n = len(rows)
    correct = [r for r in rows if is_verified(r)]
    eager = [r["speedup_eager"] for r in correct if r["speedup_eager"] is not None]
    compiled = [r["speedup_compile"] for r in correct if r["speedup_compile"] is not None]
    top = max(eager + compiled + [1.0])
    step = _nice_step(top, 20)
    grid = [round(i * step, 10) for i in range(int(math.ceil(top / step - 1e-9)) + 1)]
    points = []
    for p in grid:
        e, c = sum(v > p for v in eager), sum(v > p for v in compiled)
        points.append({"p": p, "eager_n": e, "compile_n": c, "eager": e / n if n else 0.0,
                       "compile": c / n if n else 0.0})
    return {"n": n, "points": points, "figure": fast_p_figure(eager, compiled, n, grid[-1]) if n else None}


def _step(row: dict[str, Any], evolve: bool) -> int:
    return row.get("generation", 0) if evolve else row.get("turn", 0)


def search_data(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A search's progress by step (turn, or generation when the rows evolved): per step, for every
    conversation (task, model, sample; a task's whole archive when evolving), whether its best so far
    is correct, faster than eager, faster than torch.compile; and per task the best-so-far speedup.
    Step 1 is the first answer to the plain prompt: the single-shot numbers of the same run. Only
    verified attempts count (leaderboard.is_verified), as everywhere on the page: a correct attempt
    timed on an unfit device, flagged or untrusted does not."""
    evolve = any(r.get("generation") for r in rows)
    steps = sorted({_step(r, evolve) for r in rows})
    if steps in ([], [0]):
        return None

    def key(r: dict[str, Any]) -> tuple:
        return (r["task"], r["model"]) if evolve else (r["task"], r["model"], r["sample"])

    verified = [r for r in rows if is_verified(r)]
    threads = sorted({key(r) for r in rows})
    task_names = sorted({r["task"] for r in rows})
    per_step, per_task = [], {}
    for step in steps:
        timed = [r for r in verified if _step(r, evolve) <= step]
        best: dict[tuple, dict[str, float]] = {key(r): {"eager": 0.0, "compile": 0.0} for r in timed}
        for r in timed:
            b = best[key(r)]
            b["eager"] = max(b["eager"], r["speedup_eager"] or 0.0)
            b["compile"] = max(b["compile"], r["speedup_compile"] or 0.0)
        n = len(threads)
        per_step.append({"step": step + 1, "attempts": sum(1 for r in rows if _step(r, evolve) == step),
                         "verified": len(best) / n, "fast_1": sum(b["eager"] > 1 for b in best.values()) / n,
                         "fast_compile": sum(b["compile"] > 1 for b in best.values()) / n,
                         "best_eager": max((b["eager"] for b in best.values() if b["eager"]), default=None)})
        for task in task_names:
            mine = [r["speedup_eager"] for r in timed if r["task"] == task and r["speedup_eager"]]
            per_task.setdefault(task, []).append(max(mine) if mine else None)
    return {"unit": "generation" if evolve else "turn", "steps": [s + 1 for s in steps], "per_step": per_step,
            "per_task": [{"task": t, "best": v} for t, v in per_task.items()], "conversations": len(threads)}


def levels_data(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """KernelBench's metrics per level (pipeline.report.kbmetrics) and the chart of how each task's best
    verified kernel's speedups are spread; tasks with none are counted beside it."""
    best = best_per_task(rows)
    kernels = [r for r in best.values() if r is not None]
    eager = [r["speedup_eager"] for r in kernels if r.get("speedup_eager")]
    compiled = [r["speedup_compile"] for r in kernels if r.get("speedup_compile")]
    groups = level_metrics(rows, REPORT_PS)
    for g in groups:
        g["label"] = level_label(g)
    return {"groups": groups, "ps": [f"{p:g}" for p in REPORT_PS], "tasks": len(best), "with_kernel": len(kernels),
            "figure": distribution_figure(eager, compiled) if eager or compiled else None}


def _task_order(rows: list[dict[str, Any]]) -> list[str]:
    """Tasks by KernelBench level and problem id (plain-folder tasks after them), then name."""
    keys: dict[str, tuple] = {}
    for r in rows:
        level, problem = r.get("level"), r.get("problem")
        keys.setdefault(r["task"], (level is None, level or 0, problem or 0, r["task"]))
    return sorted(keys, key=keys.__getitem__)


def report_data(rows: list[dict[str, Any]]) -> dict[str, Any]:
    search = search_data(rows)
    order = _task_order(rows)
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_task.setdefault(r["task"], []).append(r)
    charts = len(order) <= TASK_CHARTS
    best = best_rows(rows)
    return {"n": len(rows), "n_correct": sum(r["verdict"] == "correct" for r in rows),
            "n_verified": sum(map(is_verified, rows)), "why_none": None if best else none_verified(rows),
            "models": sorted({r["model"] for r in rows}), "runs": sorted({r["run_id"] for r in rows}),
            "levels": levels_data(rows), "task_charts": charts,
            "tasks": [_task(t, by_task[t], charts) for t in order],
            "best": best, "verdicts": _verdicts(rows), "fast_p": fast_p(rows), "search": search,
            "search_figure": search_figure(search) if search else None}


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _error(row: dict[str, Any]) -> str:
    """An attempt's error as one short cell: its first line, cut at ERROR_CHARS; for a correct attempt
    that is not verified, why (escaped later, by the template)."""
    why = not_verified_reason(row)
    if why:
        return f"not verified: {why}"
    value = row.get("error")
    if not value:
        return ""
    line = value.strip().splitlines()[0] if value.strip() else ""
    return line if len(line) <= ERROR_CHARS else line[:ERROR_CHARS] + "…"


def render(rows: list[dict[str, Any]], *, source: str = "", run: str | None = None) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters["f"] = _fmt
    env.filters["error"] = _error
    env.filters["pct"] = lambda v: "-" if v is None else f"{100 * v:.0f}%"
    # Each figure is written as JSON in a <script type="application/json"> block beside its <div>; the
    # page's one loop hands them to Plotly.newPlot. plotly's to_json writes < > & as \u escapes, so no
    # text inside can close the block.
    env.filters["figure_json"] = lambda fig: fig.to_json(remove_uids=True)
    env.globals["floor_speedup"] = floor_speedup
    return env.get_template("report.html.j2").render(
        d=report_data(rows), source=source, run=run, plotly_js=get_plotlyjs(),
        generated=datetime.now(timezone.utc).isoformat(timespec="seconds"), max_bars=MAX_BARS,
        task_charts=TASK_CHARTS)


JSON_KEYS = ("task", "level", "problem", "backend", "device", "size", "time_ms", "eager_ms", "compile_ms",
             "speedup_eager", "speedup_compile", "floor_fraction", "model", "id")


def report_json(rows: list[dict[str, Any]], *, source: str = "", run: str | None = None) -> dict[str, Any]:
    """The report's numbers without the page: KernelBench's metrics per level, each task's best verified
    kernel (None where it has none), and attempts per verdict."""
    best = best_per_task(rows)
    return {"source": source, "run": run, "attempts": len(rows),
            "levels": level_metrics(rows, REPORT_PS),
            "tasks": [{"task": t, "attempts": sum(r["task"] == t for r in rows),
                       "best": {k: best[t].get(k) for k in JSON_KEYS} if best[t] else None}
                      for t in _task_order(rows)],
            "verdicts": dict(Counter(r["verdict"] for r in rows))}
