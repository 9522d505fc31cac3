"""The report's charts, as plotly figures (pipeline/report/page.py puts them on the page).

Why plotly rather than matplotlib's inline SVG: a report is opened to ask "which attempt is that bar?",
and plotly answers on hover (model, attempt id, size, numbers) at no cost to the layout; its figure JSON
states every axis range, so a test can check that each mark lies inside its axes. plotly.js (~4.8 MB)
is inlined once per page, so the file opens offline; nothing is fetched at view time.

plotly.js reads a subset of HTML in every text it draws (titles, ticks, legend, hover), so text that
came from models or tasks goes through `_text` first: it is shown literally, never as markup.
"""

from __future__ import annotations

import html
import math
from typing import Any

import plotly.graph_objects as go

from ..records import Verdict

# One fixed colour per verdict, so a colour means the same thing in every report.
VERDICT_COLOURS = {
    "correct": "#228833", "mismatch": "#ee7733", "wrong_shape": "#cc6677", "wrong_dtype": "#aa4499",
    "wrong_type": "#882255", "non_finite": "#ddcc77", "inputs_mutated": "#999933", "nondeterministic": "#44aa99",
    "impossible_timing": "#000000", "extract_failed": "#bbbbbb", "build_failed": "#cc3311",
    "build_timeout": "#ee3377", "load_failed": "#661100", "runtime_error": "#ee6677", "timeout": "#0077bb",
    "crashed": "#33bbee", "model_error": "#777777", "waiting_gpu": "#dddddd",
    "no_gradient": "#117733", "missing_gradient": "#88ccee", "wrong_gradient": "#882200",
}
EAGER, COMPILE, FLOOR = "#4477aa", "#ee6677", "#111111"
LOG_TICKS = dict(dtick="D2", ticksuffix="x", tickformat="~g")  # log ticks at 1, 2, 5 per decade: no crowding
HALF = 0.4  # each bar's width in rank units: eager in [rank - HALF, rank], compile in [rank, rank + HALF]


def _text(value: Any) -> str:
    """Untrusted text as plotly text: its pseudo-HTML tags become entities, which plotly shows as they are."""
    return html.escape(str(value), quote=False)


def _layout(height: int, **extra: Any) -> dict[str, Any]:
    return dict(template="plotly_white", height=height, margin=dict(l=70, r=20, t=40, b=50),
                legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0), hoverlabel=dict(align="left"),
                **extra)


def floor_speedup(row: dict[str, Any], baseline: str = "eager_ms") -> float | None:
    """The speedup a kernel running at the memory-bandwidth floor would have: eager_ms / floor_ms (or, with
    baseline="compile_ms", over torch.compile)."""
    if row.get(baseline) and row.get("floor_ms"):
        return row[baseline] / row["floor_ms"]
    return None


def log_range(values: list[float], below: float = 0.05) -> list[float]:
    """A log10 axis range holding every value and 1x, padded by 6% of its span (and at least `below`
    decades under the smallest value: bars rise from the bottom, so the shortest one must still show)."""
    logs = [math.log10(v) for v in values if v and v > 0] + [0.0]
    lo, hi = min(logs), max(logs)
    margin = max((hi - lo) * 0.06, 0.05)
    return [lo - max(margin, below), hi + margin]


def speedup_figure(correct: list[dict[str, Any]]) -> go.Figure:
    """One task's correct attempts, best first: bars over eager and over torch.compile, and the speedups a
    kernel at the memory-bandwidth floor would have (eager_ms / floor_ms, compile_ms / floor_ms) as short
    dashed lines over each bar. A log axis, because floors often sit 10-100x above the bars, and 0.5x is
    then as far below the dotted 1x line as 2x is above it."""
    ranks = list(range(1, len(correct) + 1))
    fig = go.Figure()
    values: list[float] = []
    floor_x: list[float | None] = []
    floor_y: list[float | None] = []
    floor_hover: list[str | None] = []
    for key, name, colour, offset, baseline in (("speedup_eager", "over eager", EAGER, -HALF, "eager_ms"),
                                                ("speedup_compile", "over torch.compile", COMPILE, 0.0, "compile_ms")):
        ys = [r[key] for r in correct]
        values += [v for v in ys if v]
        hover = [f"#{i} {_text(r['model'])}<br>attempt {_text(r['id'])}, size {_text(r['size'])}<br>"
                 f"{name}: {'-' if v is None else format(v, '.3g')}x" for i, r, v in zip(ranks, correct, ys)]
        # Bars rise from the axis' bottom (on a log axis plotly draws base 0 there), so each one shows,
        # also one at exactly 1x.
        fig.add_bar(x=ranks, y=ys, width=HALF, offset=offset,
                    name=name, marker_color=colour, hovertext=hover, hoverinfo="text")
        for i, r in zip(ranks, correct):
            floor = floor_speedup(r, baseline)
            if floor:
                values.append(floor)
                floor_x += [i + offset, i + offset + HALF, None]
                floor_y += [floor, floor, None]
                text = f"#{i} floor {name}: {floor:.3g}x (at the memory-bandwidth floor)"
                floor_hover += [text, text, None]
    if floor_x:
        fig.add_scatter(x=floor_x, y=floor_y, mode="lines", name="memory-bandwidth floor", hovertext=floor_hover,
                        hoverinfo="text", line=dict(color=FLOOR, width=2, dash="dash"))
    fig.add_hline(y=1, line=dict(color="#888888", width=1, dash="dot"))
    # Few attempts get a narrower chart (about 80 px a pair, 560 px at least, so the legend fits on one
    # line) rather than bars half the page wide; from a dozen on it takes the page's width.
    width = max(560, 140 + 80 * len(correct)) if len(correct) < 12 else None
    fig.update_layout(**_layout(380, barmode="overlay", width=width))
    fig.update_xaxes(range=[0.5, len(correct) + 0.5], tickvals=ranks, ticktext=[f"#{i}" for i in ranks],
                     title_text="correct attempts, best first (hover for model and attempt id)")
    fig.update_yaxes(type="log", range=log_range(values, below=0.25), title_text="speedup (x, log scale)",
                     **LOG_TICKS)
    return fig


def verdict_figure(models: list[dict[str, Any]]) -> go.Figure:
    """Per model, its attempts as one stacked bar of counts, a segment per verdict in the enum's order."""
    names = [_text(m["model"]) for m in models]
    order = [v.value for v in Verdict]
    seen = {v for m in models for v in m["counts"]}
    fig = go.Figure()
    for verdict in order + sorted(seen - set(order)):
        counts = [m["counts"].get(verdict, 0) for m in models]
        if not any(counts):
            continue
        hover = [f"{n}: {_text(verdict)} {c} of {m['total']}" for n, c, m in zip(names, counts, models)]
        fig.add_bar(y=names, x=[c or None for c in counts], orientation="h", name=_text(verdict), hovertext=hover,
                    hoverinfo="text",  # None, not 0: no empty segment, nor a hover saying "0 of"
                    marker_color=VERDICT_COLOURS.get(verdict, "#aaaaaa"))
    top = max(m["total"] for m in models)
    fig.update_layout(**_layout(140 + 40 * len(models), barmode="stack"))
    fig.update_layout(legend_traceorder="normal")  # plotly reverses a stack's legend; keep the table's order
    fig.update_xaxes(range=[0, top * 1.05], title_text="attempts")
    # A reversed range puts the first model (alphabetically) at the top, as in the table below.
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=names, range=[len(names) - 0.5, -0.5],
                     automargin=True)
    return fig


def fast_p_curve(speedups: list[float], n: int, top: float) -> tuple[list[float], list[float]]:
    """fast_p as the exact step function (drawn with shape hv): at p, the share of n attempts with a speedup
    above p, which changes only at each speedup."""
    xs = [0.0] + sorted({v for v in speedups if 0 < v <= top}) + [top]
    return xs, [sum(v > p for v in speedups) / n if n else 0.0 for p in xs]


def fast_p_figure(eager: list[float], compiled: list[float], n: int, top: float) -> go.Figure:
    """The share of all n attempts that are correct and faster than p times eager (and torch.compile)."""
    fig = go.Figure()
    ys: list[float] = []
    for name, speedups, colour in (("over eager", eager, EAGER), ("over torch.compile", compiled, COMPILE)):
        x, y = fast_p_curve(speedups, n, top)
        ys += y
        fig.add_scatter(x=x, y=y, mode="lines", line=dict(color=colour, width=2, shape="hv"), name=name,
                        hovertemplate="p = %{x:.3g}: %{y:.1%} of all attempts<extra></extra>")
    fig.add_vline(x=1, line=dict(color="#888888", width=1, dash="dot"))
    fig.update_layout(**_layout(360))
    fig.update_xaxes(range=[0, top], title_text="p (speedup threshold, x baseline)")
    fig.update_yaxes(range=[0, min(1.0, max(ys)) * 1.08 or 1.0], tickformat=".0%",
                     title_text="fast_p: correct and faster than p x")
    return fig


def search_figure(search: dict[str, Any]) -> go.Figure | None:
    """Per task, the best speedup over eager found so far after each turn (or generation). Tasks with no
    correct attempt at any step have no line (the table beside lists them); None when no task has one."""
    found = [t for t in search["per_task"] if any(t["best"])]
    if not found:
        return None
    values = [v for t in found for v in t["best"] if v]
    fig = go.Figure()
    for t in found:
        fig.add_scatter(x=search["steps"], y=t["best"], mode="lines+markers", name=_text(t["task"]),
                        hovertext=[f"{_text(t['task'])}, {search['unit']} {s}: "
                                   f"{'no correct attempt yet' if v is None else format(v, '.3g') + 'x'}"
                                   for s, v in zip(search["steps"], t["best"])], hoverinfo="text")
    fig.add_hline(y=1, line=dict(color="#888888", width=1, dash="dot"))
    steps = search["steps"]
    fig.update_layout(**_layout(380))
    fig.update_xaxes(range=[min(steps) - 0.3, max(steps) + 0.3], tickvals=steps, title_text=search["unit"])
    fig.update_yaxes(type="log", range=log_range(values, below=0.1),
                     title_text="best speedup over eager so far (log scale)", **LOG_TICKS)
    return fig


def speedup_bins(speedups: list[float]) -> list[float]:
    """Bin edges for a histogram of speedups: powers of 2 in half steps (0.71x, 1x, 1.41x, 2x, ...), one
    edge at exactly 1x, from just below the smallest speedup to just above the largest."""
    logs = [math.log2(v) for v in speedups if v and v > 0] + [0.0]
    lo, hi = math.floor(2 * min(logs)), math.floor(2 * max(logs)) + 1
    return [2 ** (k / 2) for k in range(lo, hi + 1)]


def distribution_figure(eager: list[float], compiled: list[float]) -> go.Figure:
    """How many tasks' best kernels fall in each speedup bin (speedup_bins), over eager and over
    torch.compile side by side: one chart for any number of tasks."""
    edges = speedup_bins(eager + compiled)
    labels = [f"{a:.3g}-{b:.3g}x" for a, b in zip(edges, edges[1:])]
    fig = go.Figure()
    top = 1
    for name, speedups, colour in (("over eager", eager, EAGER), ("over torch.compile", compiled, COMPILE)):
        counts = [sum(a <= v < b for v in speedups) for a, b in zip(edges, edges[1:])]
        top = max(top, *counts) if counts else top
        fig.add_bar(x=labels, y=counts, name=name, marker_color=colour,
                    hovertemplate="%{x} " + name + ": %{y} tasks<extra></extra>")
    one = labels.index(f"{1:.3g}-{edges[edges.index(1.0) + 1]:.3g}x") if 1.0 in edges[:-1] else None
    if one is not None:  # the boundary between slower and faster than the baseline
        fig.add_vline(x=one - 0.5, line=dict(color="#888888", width=1, dash="dot"))
    fig.update_layout(**_layout(360, barmode="group", bargap=0.15))
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=labels, range=[-0.5, len(labels) - 0.5],
                     title_text="speedup of each task's best verified kernel (bins of x1.41)")
    fig.update_yaxes(range=[0, top * 1.1], title_text="tasks")
    return fig
