"""`kgen report`: its numbers, its charts (every chart has marks, every mark inside its axes), a page that
needs no network, untrusted text escaped, and (where a chromium binary exists) the page drawn in
headless Chromium. Attempts are written into a real temp SQLite database through the Store."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from markupsafe import escape

from pipeline.cli.inspect import report
from pipeline.records import Baselines, EvalResult, Flag, Provenance, Timing, Verdict
from pipeline.report.page import render, report_data
from pipeline.store.store import Store

# Text a model, a task file or a candidate could send: markup for HTML, for plotly's pseudo-HTML and for rich.
EVIL_MODEL = '<script>alert("model")</script><b>bold</b> [red]x[/x]'
EVIL_TASK = "t<i>ask</i>&"
EVIL_ERROR = 'main.cpp:37:18: error: <img src=x onerror=alert(1)> & "</script>"'


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, n=20)


def _correct(ms, eager, compiled, floor=0.1, flags=()) -> EvalResult:
    return EvalResult(verdict=Verdict.correct, flags=list(flags), timing=_timing(ms),
                      baselines=Baselines(eager=_timing(eager), compiled=_timing(compiled), floor_ms=floor),
                      device="cpu: Test CPU", torch_version="2.13.0", cuda_version=None)


def _failed(verdict: Verdict, error: str | None = None) -> EvalResult:
    return EvalResult(verdict=verdict, error=error or f"{verdict.value} happened", device="cpu: Test CPU",
                      torch_version="2.13.0")


def _fill(path: Path) -> dict:
    """Run A: seven attempts over two tasks and two models (the numbers test_report_numbers checks).
    Run B, a search by turn, looks like an H100 run: speedups of 0.6-12 with floors at 40-90x, a slow
    kernel, a task with no correct attempt, and hostile text in a model name, a task name and an error."""
    ids: dict[str, str] = {}
    with Store.open(path) as store:
        run_a = store.start_run("{}", "[]", "cpu", "cpu: Test CPU", "2.13.0", None)
        run_b = store.start_run("{}", "[]", "cpu", "cpu: Test CPU", "2.13.0", None)
        plan = [
            ("mse_m1_0", run_a, "mse", "m1", 0, 0, _correct(0.5, 1.0, 0.8)),           # x2.0, x1.6
            ("mse_m1_1", run_a, "mse", "m1", 1, 0, _correct(0.25, 1.0, 0.8, flags=[Flag.no_custom_kernel])),
            ("mse_m2_0", run_a, "mse", "m2", 0, 0, _correct(0.4, 1.0, 0.8)),           # x2.5, x2.0
            ("mse_m2_1", run_a, "mse", "m2", 1, 0, _failed(Verdict.mismatch)),
            ("hinge_m1_0", run_a, "hinge", "m1", 0, 0, _failed(Verdict.build_failed)),
            ("hinge_m2_0", run_a, "hinge", "m2", 0, 0, _correct(2.0, 1.0, 0.8, floor=0.5)),  # x0.5, x0.4
            ("ce_m1_0", run_a, "cross_entropy", "m1", 0, 0, _correct(1.5, 1.0, 0.5)),  # x0.67: slower
            # run B: turns 0 and 1 of a refine search
            ("gemm_t0", run_b, "gemm", "m1", 0, 0, _correct(1.0, 1.2, 1.0, floor=0.015)),    # x1.2, floor 80x
            ("gemm_t1", run_b, "gemm", "m1", 0, 1, _correct(0.1, 1.2, 1.0, floor=0.015)),    # x12
            ("gemm_evil_t0", run_b, "gemm", EVIL_MODEL, 0, 0, _failed(Verdict.build_failed, EVIL_ERROR)),
            ("gemm_evil_t1", run_b, "gemm", EVIL_MODEL, 0, 1, _correct(0.4, 1.2, 1.0, floor=0.015)),
            ("evil_t0", run_b, EVIL_TASK, "m1", 0, 0, _failed(Verdict.runtime_error, EVIL_ERROR)),
            ("evil_t1", run_b, EVIL_TASK, "m1", 0, 1, _correct(1.0, 0.6, 0.9, floor=0.01)),  # x0.6, floor 60x
            ("bad_t0", run_b, "softmax", EVIL_MODEL, 0, 0, _failed(Verdict.mismatch, EVIL_ERROR)),
            ("bad_t1", run_b, "softmax", EVIL_MODEL, 0, 1, _failed(Verdict.timeout)),
        ]
        for key, run, task, model, sample, turn, result in plan:
            task_id = store.upsert_task(task, f"{task}.py", f"# {task}\n")
            ids[key] = store.save_attempt(Provenance(run_id=run, task_id=task_id, task=task, model=model,
                                                     sample=sample, backend="cpu", template="t", completion_id=None,
                                                     code_hash=f"{key:0<16}"[:16], size="small", turn=turn), result)
    return {"path": str(path), "ids": ids, "run_a": run_a, "run_b": run_b}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return _fill(tmp_path_factory.mktemp("report") / "kgen.db")


@pytest.fixture(scope="module")
def page(db):
    """The report over both runs, rendered once for the module."""
    with Store.open(db["path"]) as store:
        rows = store.attempts()
    return {"rows": rows, "html": render(rows, source=db["path"])}


def _figures(page_html: str) -> dict[str, dict]:
    """Each chart's figure JSON, by the id of the <div> it is drawn into, exactly as the page holds it."""
    blocks = re.findall(r'<script type="application/json" class="kgen-figure" data-target="([^"]+)">(.*?)</script>',
                        page_html, flags=re.S)
    return {target: json.loads(text) for target, text in blocks}


def _inside(value: float, bounds: list[float], log: bool) -> bool:
    v = math.log10(value) if log else value
    return bounds[0] - 1e-9 <= v <= bounds[1] + 1e-9


def _marks(trace: dict) -> list[tuple[float, float]]:
    """Every (x, y) point a trace draws; a vertical bar is its top at both of its edges (it rises from the
    axis' bottom: a log axis has no 0)."""
    xs, ys = trace.get("x") or [], trace.get("y") or []
    if trace["type"] == "bar":
        if trace.get("orientation") == "h":
            return [(x, y) for x, y in zip(xs, ys) if x is not None]
        assert "base" not in trace
        if "width" not in trace:  # a bar per category (the per-level distribution): its top at its category
            return [(x, y) for x, y in zip(xs, ys) if y is not None]
        width, offset = trace["width"], trace["offset"]
        return [p for x, y in zip(xs, ys) if y is not None for p in ((x + offset, y), (x + offset + width, y))]
    return [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]


def test_report_numbers(db):
    with Store.open(db["path"]) as store:
        data = report_data(store.attempts(run=db["run_a"]))
    assert (data["n"], data["n_correct"]) == (7, 5)
    mse = next(t for t in data["tasks"] if t["name"] == "mse")
    # Every figure counts verified attempts (leaderboard.is_verified): the flagged 4x is listed, not ranked.
    assert [r["speedup_eager"] for r in mse["verified"]] == [2.5, 2.0] and mse["correct"] == 3
    assert [(item["rank"], item["row"]["verdict"]) for item in mse["listed"]] == [
        (1, "correct"), (2, "correct"), (None, "correct"), (None, "mismatch")]
    assert data["n_verified"] == 4 and data["why_none"] is None
    points = {p["p"]: p for p in data["fast_p"]["points"]}
    assert data["fast_p"]["points"][0]["p"] == 0 and data["fast_p"]["points"][-1]["p"] == 2.6
    assert (points[1.0]["eager_n"], points[1.0]["compile_n"]) == (2, 2)
    assert (points[2.0]["eager_n"], points[2.0]["compile_n"]) == (1, 0)
    assert points[2.0]["eager"] == pytest.approx(1 / 7) and points[0]["eager"] == pytest.approx(4 / 7)
    models = {m["model"]: dict(m["counts"]) for m in data["verdicts"]["models"]}
    assert models == {"m1": {"correct": 3, "build_failed": 1}, "m2": {"correct": 2, "mismatch": 1}}
    assert data["search"] is None and data["search_figure"] is None  # one turn: no search section
    empty = render([])  # the CLI writes no report for no rows, but the page itself still renders
    assert "No verified attempt: no attempts." in empty and 'class="kgen-figure"' not in empty


def test_every_chart_has_marks_inside_its_axes(page):
    figures = _figures(page["html"])
    # One chart per task with a correct attempt (softmax has none), outcomes, fast_p, the search by turn.
    tasks = sorted({r["task"] for r in page["rows"]})
    drawn = [t for t in tasks if t != "softmax"]
    assert sorted(figures) == sorted([f"chart-task-{tasks.index(t) + 1}" for t in drawn]
                                     + ["chart-distribution", "chart-verdicts", "chart-fast-p", "chart-search"])
    for target, fig in figures.items():
        assert f'<div class="chart" id="{target}"' in page["html"], target
        layout, traces = fig["layout"], fig["data"]
        assert traces and all(_marks(t) for t in traces), f"{target}: an empty trace"
        xaxis, yaxis = layout["xaxis"], layout["yaxis"]
        for trace in traces:
            for x, y in _marks(trace):
                if yaxis.get("type") == "category":  # outcomes: a stacked bar per model
                    assert y in yaxis["categoryarray"], (target, y)
                    continue
                if xaxis.get("type") == "category":  # the distribution: a bar of counts per speedup bin
                    assert x in xaxis["categoryarray"] and _inside(y, yaxis["range"], False), (target, x, y)
                    continue
                assert _inside(x, xaxis["range"], xaxis.get("type") == "log"), (target, trace["name"], x)
                assert _inside(y, yaxis["range"], yaxis.get("type") == "log"), (target, trace["name"], y)
        for shape in layout.get("shapes", []):  # the 1x lines
            assert _inside(shape["y0"], yaxis["range"], yaxis.get("type") == "log") if shape["yref"] == "y" \
                else _inside(shape["x0"], xaxis["range"], False), (target, shape)
        if yaxis.get("type") == "category":
            totals = {}
            for trace in traces:
                for x, y in zip(trace["x"], trace["y"]):
                    totals[y] = totals.get(y, 0) + (x or 0)
            assert max(totals.values()) <= xaxis["range"][1] <= 1.06 * max(totals.values()), target
            assert sorted(yaxis["range"]) == [-0.5, len(yaxis["categoryarray"]) - 0.5]


def test_axes_are_sized_to_the_data_and_hold_the_floor(page, db):
    figures = _figures(page["html"])
    tasks = sorted({r["task"] for r in page["rows"]})
    gemm = figures[f"chart-task-{tasks.index('gemm') + 1}"]
    floor = next(t for t in gemm["data"] if t["name"] == "memory-bandwidth floor")
    # A floor dash over each bar of the three correct attempts: eager 1.2 / 0.015 = 80x, compile 1.0 / 0.015.
    assert sorted({round(y, 3) for y in floor["y"] if y is not None}) == [66.667, 80.0]
    bars = [y for t in gemm["data"] if t["type"] == "bar" for y in t["y"] if y is not None]
    assert max(bars) == pytest.approx(12.0) and min(bars) == pytest.approx(1.0)
    lo, hi = gemm["layout"]["yaxis"]["range"]
    # Log axis from the data: the floor (80x) is inside, and it ends close above it, not at a round 100 or more.
    assert gemm["layout"]["yaxis"]["type"] == "log" and lo <= 0 and math.log10(80) < hi < math.log10(80) + 0.2
    slow = figures[f"chart-task-{tasks.index('cross_entropy') + 1}"]
    lo, _ = slow["layout"]["yaxis"]["range"]
    # The 0.67x eager and 0.33x compile bars: the axis starts a quarter decade under the shorter (so it shows),
    # not at 0.01x.
    assert lo == pytest.approx(math.log10(1 / 3) - 0.25)
    fast_p = figures["chart-fast-p"]
    y_top = fast_p["layout"]["yaxis"]["range"][1]
    assert max(y for t in fast_p["data"] for y in t["y"]) <= y_top <= 1.08
    assert fast_p["layout"]["xaxis"]["range"] == [0, 12]  # the largest speedup in these rows (gemm, turn 2)
    search = figures["chart-search"]
    assert search["layout"]["xaxis"]["title"]["text"] == "turn"
    # A line per task with a correct attempt at some turn; softmax has none.
    assert {t["name"] for t in search["data"]} == {html.escape(t, quote=False)
                                                   for t in ("gemm", EVIL_TASK, "mse", "hinge", "cross_entropy")}


def test_the_page_needs_no_network(page):
    text = page["html"]
    assert not re.search(r"<(script|link|img|iframe|embed|object)\b[^>]*\b(src|href)\s*=", text, flags=re.I)
    assert not re.search(r"@import|url\(\s*['\"]?https?:", text, flags=re.I)
    assert "plotly.js v" in text[:2000]  # plotly.js itself is inline, in the head
    assert "Plotly.newPlot" in text and "displaylogo: false" in text  # no link out to plotly's site


def test_untrusted_text_is_escaped(page):
    text = page["html"]
    for raw in (EVIL_MODEL, EVIL_ERROR, EVIL_TASK):
        assert raw not in text
    assert "<img" not in text and "<b>bold" not in text and "<i>ask" not in text
    assert all(str(escape(s)) in text for s in (EVIL_MODEL, EVIL_ERROR, EVIL_TASK))  # as Jinja writes them
    # The page's only <script> elements: plotly.js, one JSON block per figure, the loop that draws them.
    assert text.count("<script") == 1 + len(_figures(text)) + 1
    # In the charts, hostile text reaches plotly as entities, which plotly shows as they are.
    figures = _figures(text)
    assert html.escape(EVIL_MODEL, quote=False) in figures["chart-verdicts"]["layout"]["yaxis"]["categoryarray"]
    hovers = [h for t in figures.values() for tr in t["data"] for h in (tr.get("hovertext") or []) if h]
    assert any(html.escape(EVIL_MODEL, quote=False) in h for h in hovers)
    assert not any(EVIL_MODEL in h or "<script" in h for h in hovers)


def test_every_attempt_is_listed(page):
    text = page["html"]
    for task in {r["task"] for r in page["rows"]}:
        mine = [r for r in page["rows"] if r["task"] == task]
        table = re.search(rf'<table class="speedups" data-task="{re.escape(html.escape(task))}">(.*?)</table>',
                          text, flags=re.S)
        assert table, task
        assert table.group(1).count("<tr>") == len(mine) + 1, task  # a header and every attempt, failed ones too
        assert all(r["id"] in table.group(1) for r in mine)


def test_a_task_with_many_attempts_charts_the_best_forty_full_width(tmp_path):
    with Store.open(tmp_path / "many.db") as store:
        run = store.start_run("{}", "[]", "cpu", "cpu: Test CPU", "2.13.0", None)
        task_id = store.upsert_task("mse", "mse.py", "# mse\n")
        for sample in range(45):
            store.save_attempt(Provenance(run_id=run, task_id=task_id, task="mse", model="m1", sample=sample,
                                          backend="cpu", template="t", completion_id=None, code_hash=f"{sample:016d}",
                                          size="small"), _correct(1.0 / (1 + sample / 10), 1.0, 0.8, floor=0.02))
        rows = store.attempts()
    text = render(rows)
    fig = _figures(text)["chart-task-1"]
    assert [len([y for y in t["y"] if y is not None]) for t in fig["data"] if t["type"] == "bar"] == [40, 40]
    assert fig["data"][0]["y"][0] == pytest.approx(5.4) and "width" not in fig["layout"]  # the best; page-wide
    assert fig["layout"]["xaxis"]["range"] == [0.5, 40.5]
    assert "The chart shows the best 40 verified attempts; 5 more are in the table." in text


def test_report_command(db, tmp_path):
    out = tmp_path / "report.html"
    result = CliRunner().invoke(report, ["--db", db["path"], "-o", str(out), "--run", db["run_a"]])
    assert result.exit_code == 0 and result.output == f"wrote {out}: 7 attempts, 3 tasks\n"
    text = out.read_text()
    assert '<h3 id="task-mse">mse</h3>' in text and db["ids"]["gemm_t0"] not in text  # another run
    assert '<span id="n-attempts">7</span>' in text and '<span id="n-correct">5</span>' in text
    assert '<span id="n-verified">4</span>' in text  # the flagged one is correct, not verified
    # The error column wraps on the page (no scrolling box); a correct attempt not verified says why.
    assert 'class="scroll"' not in text and "not verified: flagged: no_custom_kernel" in text
    assert "Search, by turn" not in text
    tight = re.sub(r">\s+<", "><", text)
    # mse's best unflagged attempt, row 2 of its table: x eager, x compile, floor x eager (1.0 / 0.1), floor fraction.
    assert re.search(r"<td>2.50</td><td>2.00</td><td>10.00</td><td>0.250</td>", tight)
    assert "<tr><td>1</td><td>0.286</td><td>2</td><td>0.286</td><td>2</td></tr>" in tight  # fast_p at p = 1: 2 of 7
    latest = CliRunner().invoke(report, ["--db", db["path"], "-o", str(out), "--run", "latest"])
    assert latest.output == f"wrote {out}: 8 attempts, 3 tasks\n" and "Search, by turn" in out.read_text()
    bad = CliRunner().invoke(report, ["--db", db["path"], "-o", str(out), "--run", "NOPE"])
    assert bad.exit_code == 1 and bad.output == "Error: no run with id NOPE\n"


def _area(path: str) -> float:
    """The area of a bar as plotly draws it: M x0,y0 V y1 H x1 V y0 Z (0 for anything else)."""
    m = re.fullmatch(r"M([-\d.]+),([-\d.]+)V([-\d.]+)H([-\d.]+)V[-\d.]+Z", path)
    return abs(float(m[4]) - float(m[1])) * abs(float(m[3]) - float(m[2])) if m else 0.0


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary on PATH (apt-get install chromium to run it)")
def test_report_draws_in_headless_chromium(page, tmp_path):
    out = tmp_path / "report.html"
    out.write_text(page["html"])
    # Every host name resolves to nothing: a chart that needed the network would not be drawn.
    dom = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--host-resolver-rules=MAP * ~NOTFOUND",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom", out.as_uri()],
        capture_output=True, text=True, timeout=60).stdout
    figures = _figures(page["html"])
    starts = {m.group(1): m.start() for m in re.finditer(r'<div class="chart[^"]*" id="([^"]+)"', dom)}
    assert sorted(starts) == sorted(figures)
    ends = sorted(starts.values())[1:] + [len(dom)]
    for target, start in starts.items():
        drawn = dom[start:ends[sorted(starts.values()).index(start)]]
        assert 'class="main-svg"' in drawn, f"{target}: plotly drew nothing"
        bars = [d for d in re.findall(r'<g class="point"><path d="([^"]*)"', drawn) if _area(d) > 0]
        want_bars = sum(1 for t in figures[target]["data"] if t["type"] == "bar"
                        for v in (t["x"] if t.get("orientation") == "h" else t["y"]) if v)
        assert len(bars) == want_bars, (target, len(bars), want_bars)
        # Each line trace, in order: a line with a segment (L, or H/V for fast_p's steps) or marker points.
        scatter = [t for t in figures[target]["data"] if t["type"] == "scatter"]
        groups = drawn.split('<g class="trace scatter')[1:]
        assert len(groups) == len(scatter), target
        for trace, group in zip(scatter, groups):
            lines = [d for d in re.findall(r'<path class="js-line" d="([^"]*)"', group) if re.search("[LHV]", d)]
            points = re.findall(r'<path class="point"[^>]* d="M', group)
            assert lines or points, (target, trace["name"])
            if trace["name"] == "memory-bandwidth floor":  # one dash per floor value, each drawn
                assert len(lines) == sum(y is not None for y in trace["y"]) // 2, target
    # The hostile model name is drawn as its own text (a tick label of the outcomes chart), not as markup:
    # the DOM holds it as one text node, which the serializer writes with < > & as entities.
    assert f">{html.escape(EVIL_MODEL, quote=False)}</text>" in dom
    # Nor did any text become an element in the charts (plotly draws <b> as a bold tspan); the page's head,
    # which holds plotly.js's own source, is left out.
    charts = dom[min(starts.values()):].replace(" ", "")
    assert "<img" not in charts and "font-weight:bold" not in charts


def test_the_search_table_counts_verified_attempts_not_a_loaded_box_s():
    """A correct attempt whose timing the judge marked unfit (a loaded box) has no figure and is not
    verified: the search table counts it as the rest of the page does, for nothing."""
    from pipeline.report.page import search_data

    def row(turn, verdict, speedup, unfit=None, task="mse"):
        return {"task": task, "model": "m", "sample": 0, "turn": turn, "generation": 0, "verdict": verdict,
                "trusted": 1, "flags": [], "code_hash": "0" * 16, "device_unfit": unfit,
                "time_ms": None if unfit or speedup is None else 1.0,
                "speedup_eager": None if unfit else speedup, "speedup_compile": None if unfit else speedup}

    loaded = "the cpu was loaded (30% of the windows' time waiting for a core)"
    data = search_data([row(0, "mismatch", None), row(1, "correct", 5.0, loaded), row(2, "correct", 2.0),
                        row(0, "correct", 0.5, task="hinge")])
    steps = {s["step"]: s for s in data["per_step"]}
    assert (steps[1]["verified"], steps[1]["fast_1"], steps[1]["best_eager"]) == (0.5, 0.0, 0.5)
    assert (steps[2]["verified"], steps[2]["fast_1"], steps[2]["best_eager"]) == (0.5, 0.0, 0.5)  # the unfit one: none
    assert (steps[3]["verified"], steps[3]["fast_1"], steps[3]["best_eager"]) == (1.0, 0.5, 2.0)
    assert {t["task"]: t["best"] for t in data["per_task"]}["mse"] == [None, None, 2.0]
