"""`kgen report`: one self-contained HTML page (inline CSS and SVG, no script, no network).

    html = render(store.attempts(run=run_id), source="db/kgen.db", run=run_id)

The numbers are computed here and drawn as plain SVG shapes by the template; every chart has a
table beside it with the same numbers as text, so the page can be checked, searched and diffed.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2

from .leaderboard import best_rows
from .records import Verdict

MAX_BARS = 40  # attempts drawn per task chart (the table lists all)

# One fixed colour per verdict, so a colour means the same thing in every report.
VERDICT_COLOURS = {
    "correct": "#228833", "mismatch": "#ee7733", "wrong_shape": "#cc6677", "wrong_dtype": "#aa4499",
    "wrong_type": "#882255", "non_finite": "#ddcc77", "inputs_mutated": "#999933", "nondeterministic": "#44aa99",
    "impossible_timing": "#000000", "extract_failed": "#bbbbbb", "build_failed": "#cc3311",
    "build_timeout": "#ee3377", "load_failed": "#661100", "runtime_error": "#ee6677", "timeout": "#0077bb",
    "crashed": "#33bbee", "model_error": "#777777", "waiting_gpu": "#dddddd",
    "no_gradient": "#117733", "missing_gradient": "#88ccee", "wrong_gradient": "#882200",
}
EAGER, COMPILE = "#4477aa", "#ee6677"


def _nice_step(span: float, target: int = 5) -> float:
    """A 1-2-5 step giving about `target` intervals over span."""
    raw = max(span, 1e-12) / target
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def _ticks(top: float) -> list[float]:
    step = _nice_step(top)
    return [round(i * step, 10) for i in range(int(top / step + 1e-9) + 1)]


def floor_speedup(row: dict[str, Any]) -> float | None:
    """The speedup over eager a kernel running at the bandwidth floor would have: eager_ms / floor_ms."""
    if row.get("eager_ms") and row.get("floor_ms"):
        return row["eager_ms"] / row["floor_ms"]
    return None


def _task_chart(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Two bars per correct attempt (x eager, x compile) and a floor mark over each pair."""
    shown = rows[:MAX_BARS]
    values = [v for r in shown for v in (r["speedup_eager"], r["speedup_compile"], floor_speedup(r)) if v]
    ticks = _ticks(max(values + [1.0]) * 1.1)
    top = ticks[-1] if ticks[-1] > 0 else 1.0
    left, height, bar, group = 48, 200, 12, 34
    width = left + group * len(shown) + 10

    def y(v: float) -> float:
        return round(10 + height * (1 - v / top), 2)

    bars, floors, labels = [], [], []
    for i, r in enumerate(shown):
        x = left + 5 + group * i
        for j, (key, colour) in enumerate((("speedup_eager", EAGER), ("speedup_compile", COMPILE))):
            v = r[key]
            if v is not None:
                bars.append({"x": x + j * bar, "y": y(v), "w": bar, "h": round(10 + height - y(v), 2),
                             "fill": colour, "title": f"#{i + 1} {r['model']} {key} {v:.2f}"})
        f = floor_speedup(r)
        if f is not None:
            floors.append({"x1": x - 3, "x2": x + 2 * bar + 3, "y": y(f), "title": f"#{i + 1} floor x{f:.2f}"})
        labels.append({"x": x + bar, "text": str(i + 1)})
    return {"width": width, "height": height + 40, "base": 10 + height, "left": left, "right": width - 10,
            "ticks": [{"y": y(t), "text": f"{t:g}"} for t in ticks], "one": y(1.0) if top >= 1 else None,
            "bars": bars, "floors": floors, "labels": labels, "cut": len(rows) - len(shown)}


def _verdict_chart(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model, one bar of 100%: a segment per verdict, in the enum's order."""
    order = [v.value for v in Verdict]
    by_model: dict[str, Counter] = {}
    for r in rows:
        by_model.setdefault(r["model"], Counter())[r["verdict"]] += 1
    left, width, bar = 170, 460, 22
    models = []
    for k, (model, counts) in enumerate(sorted(by_model.items())):
        total, x = sum(counts.values()), float(left)
        segments = []
        for verdict in order + sorted(set(counts) - set(order)):
            if counts.get(verdict):
                w = width * counts[verdict] / total
                segments.append({"x": round(x, 2), "w": round(w, 2), "fill": VERDICT_COLOURS.get(verdict, "#aaaaaa"),
                                 "title": f"{model}: {verdict} {counts[verdict]} of {total}"})
                x += w
        models.append({"model": model, "y": 8 + k * (bar + 8), "h": bar, "total": total, "segments": segments,
                       "counts": counts})
    seen = [v for v in order if any(m["counts"].get(v) for m in models)]
    return {"models": models, "verdicts": seen, "colours": VERDICT_COLOURS, "left": left, "width": left + width + 10,
            "height": 16 + len(models) * (bar + 8)}


def fast_p(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """fast_p: the share of all attempts that are correct with a speedup above p, for a grid of p."""
    n = len(rows)
    correct = [r for r in rows if r["verdict"] == "correct"]
    top = max([v for r in correct for v in (r["speedup_eager"], r["speedup_compile"]) if v] + [1.0])
    step = _nice_step(top, 20)
    grid = [round(i * step, 10) for i in range(int(math.ceil(top / step - 1e-9)) + 1)]
    points = []
    for p in grid:
        e = sum(1 for r in correct if r["speedup_eager"] is not None and r["speedup_eager"] > p)
        c = sum(1 for r in correct if r["speedup_compile"] is not None and r["speedup_compile"] > p)
        points.append({"p": p, "eager_n": e, "compile_n": c, "eager": e / n if n else 0.0,
                       "compile": c / n if n else 0.0})
    left, width, height, pmax = 48, 480, 200, grid[-1] or 1.0

    def xy(p: float, f: float) -> str:
        return f"{left + width * p / pmax:.2f},{10 + height * (1 - f):.2f}"

    return {"n": n, "points": points, "left": left, "width": left + width + 10, "height": height + 40,
            "base": 10 + height, "right": left + width,
            "eager_line": " ".join(xy(q["p"], q["eager"]) for q in points),
            "compile_line": " ".join(xy(q["p"], q["compile"]) for q in points),
            "xticks": [{"x": round(left + width * t / pmax, 2), "text": f"{t:g}"} for t in _ticks(pmax) if t <= pmax],
            "yticks": [{"y": round(10 + height * (1 - f), 2), "text": f"{f:g}"} for f in (0, 0.25, 0.5, 0.75, 1)]}


def _step(row: dict[str, Any], evolve: bool) -> int:
    return row.get("generation", 0) if evolve else row.get("turn", 0)


def search_data(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A search's progress by step (turn, or generation when the rows evolved): per step, for every
    conversation (task, model, sample; a task's whole archive when evolving), whether its best so far
    is correct, faster than eager, faster than torch.compile; and per task the best-so-far speedup.
    Step 1 is the first answer to the plain prompt: the single-shot numbers of the same run."""
    evolve = any(r.get("generation") for r in rows)
    steps = sorted({_step(r, evolve) for r in rows})
    if steps in ([], [0]):
        return None

    def key(r: dict[str, Any]) -> tuple:
        return (r["task"], r["model"]) if evolve else (r["task"], r["model"], r["sample"])

    fair = [r for r in rows if r["verdict"] == "correct" and r.get("trusted", 1) != 0 and not r.get("device_unfit")]
    threads = sorted({key(r) for r in rows})
    task_names = sorted({r["task"] for r in rows})
    per_step, per_task = [], {}
    for step in steps:
        upto = [r for r in fair if _step(r, evolve) <= step]
        best: dict[tuple, dict[str, float]] = {}
        for r in upto:
            b = best.setdefault(key(r), {"eager": 0.0, "compile": 0.0})
            b["eager"] = max(b["eager"], r["speedup_eager"] or 0.0)
            b["compile"] = max(b["compile"], r["speedup_compile"] or 0.0)
        n = len(threads)
        per_step.append({"step": step + 1, "attempts": sum(1 for r in rows if _step(r, evolve) == step),
                         "correct": len(best) / n, "fast_1": sum(b["eager"] > 1 for b in best.values()) / n,
                         "fast_compile": sum(b["compile"] > 1 for b in best.values()) / n,
                         "best_eager": max((b["eager"] for b in best.values()), default=None)})
        for task in task_names:
            mine = [r["speedup_eager"] for r in upto if r["task"] == task and r["speedup_eager"]]
            per_task.setdefault(task, []).append(max(mine) if mine else None)
    return {"unit": "generation" if evolve else "turn", "steps": [s + 1 for s in steps], "per_step": per_step,
            "per_task": [{"task": t, "best": v} for t, v in per_task.items()], "conversations": len(threads)}


def report_data(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tasks = []
    for task in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == task]
        correct = sorted((r for r in mine if r["verdict"] == "correct"),
                         key=lambda r: (-(r["speedup_eager"] or 0.0), r["id"]))
        tasks.append({"name": task, "attempts": len(mine), "correct": correct,
                      "chart": _task_chart(correct) if correct else None})
    return {"n": len(rows), "n_correct": sum(r["verdict"] == "correct" for r in rows),
            "models": sorted({r["model"] for r in rows}), "runs": sorted({r["run_id"] for r in rows}),
            "tasks": tasks, "best": best_rows(rows), "verdicts": _verdict_chart(rows), "fast_p": fast_p(rows),
            "search": search_data(rows)}


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def render(rows: list[dict[str, Any]], *, source: str = "", run: str | None = None) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters["f"] = _fmt
    env.globals["floor_speedup"] = floor_speedup
    return env.get_template("report.html.j2").render(
        d=report_data(rows), source=source, run=run,
        generated=datetime.now(timezone.utc).isoformat(timespec="seconds"), max_bars=MAX_BARS)
