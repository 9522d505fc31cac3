"""KernelBench's metrics: fast_0, fast_1, fast_p and the geometric-mean speedups per
level, from a real SQLite database written by the Store, in `kgen best` (table and JSON) and `kgen report`
(HTML and JSON); and a report over 250 tasks that stays one page with a handful of charts."""

from __future__ import annotations

import json
import math
import re

import pytest
from click.testing import CliRunner

from pipeline.cli.main import main
from pipeline.report.kbmetrics import level_metrics
from pipeline.records import Baselines, EvalResult, Flag, Provenance, Timing, Verdict
from pipeline.report.page import render
from pipeline.store.store import Store


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, n=20)


def _correct(ms: float, eager: float, compiled: float, flags=()) -> EvalResult:
    return EvalResult(verdict=Verdict.correct, flags=list(flags), timing=_timing(ms),
                      baselines=Baselines(eager=_timing(eager), compiled=_timing(compiled), floor_ms=0.01),
                      device="cpu: Test CPU", torch_version="2.13.0")


def _failed(verdict: Verdict) -> EvalResult:
    return EvalResult(verdict=verdict, error=verdict.value, device="cpu: Test CPU", torch_version="2.13.0")


# (task, level, problem, sample, result): speedup over eager = eager / ms, over compile = compiled / ms.
PLAN = [
    ("1_A", 1, 1, 0, _correct(1.0, 2.0, 1.5)),     # 2x eager, 1.5x compile
    ("1_A", 1, 1, 1, _correct(2 / 3, 2.0, 1 / 3)),  # 3x, 0.5x: A's best (fastest, highest speedup)
    ("2_B", 1, 2, 0, _correct(2.0, 1.0, 0.5)),     # 0.5x, 0.25x
    ("3_C", 1, 3, 0, _failed(Verdict.mismatch)),   # attempted, never correct
    ("4_D", 1, 4, 0, _correct(0.5, 1.0, 1.0, flags=[Flag.no_custom_kernel])),  # correct but flagged: not counted
    ("7_E", 2, 7, 0, _correct(1.0, 4.0, 2.0)),     # level 2: one task, 4x and 2x
    ("mse", None, None, 0, _correct(1.0, 1.2, 1.0)),  # a plain-folder task
]


def _store(path, plan=PLAN, backend="cpu"):
    with Store.open(path) as store:
        run = store.start_run("{}", "[]", backend, "cpu: Test CPU", "2.13.0", None)
        for task, level, problem, sample, result in plan:
            task_id = store.upsert_task(task, f"level{level}/{task}.py", f"# {task}\n")
            store.save_attempt(Provenance(run_id=run, task_id=task_id, task=task, model="m", sample=sample,
                                          backend=backend, template="t", completion_id=None,
                                          code_hash=f"{task}{sample:0>14}"[:16], size="default", level=level,
                                          problem=problem), result)
    return str(path)


@pytest.fixture()
def db(tmp_path):
    return _store(tmp_path / "kgen.db")


def test_kernelbench_definitions_per_level(db):
    with Store.open(db) as store:
        groups = level_metrics(store.attempts(), ps=(0.5, 2.0))
    by = {g["level"]: g for g in groups}
    assert [g["level"] for g in groups] == [1, 2, None]  # plain-folder tasks last
    one = by[1]
    assert (one["tasks"], one["correct"]) == (4, 2)       # D's flagged kernel is not correct here
    assert one["fast_0"] == pytest.approx(2 / 4)
    assert one["fast_1"] == pytest.approx(1 / 4)          # A at 3x; B is slower than eager
    assert one["fast_p"] == {"0.5": pytest.approx(1 / 4), "2": pytest.approx(1 / 4)}  # B's 0.5 is not above 0.5
    # Over the correct kernels only, each task by its best: A 3x (not its 2x), B 0.5x.
    assert one["geomean_eager"] == pytest.approx(math.sqrt(3.0 * 0.5))
    assert one["geomean_compile"] == pytest.approx(math.sqrt(0.5 * 0.25))  # A's best kernel's compile ratio
    assert one["fast_1_compile"] == 0.0
    two = by[2]
    assert (two["tasks"], two["fast_0"], two["fast_1"], two["geomean_eager"], two["geomean_compile"]) == \
        (1, 1.0, 1.0, pytest.approx(4.0), pytest.approx(2.0))
    assert by[None]["geomean_eager"] == pytest.approx(1.2)


def test_a_level_with_no_correct_kernel_has_no_geomean(tmp_path):
    path = _store(tmp_path / "none.db", [("3_C", 1, 3, 0, _failed(Verdict.build_failed))])
    with Store.open(path) as store:
        (g,) = level_metrics(store.attempts())
    assert (g["fast_0"], g["fast_1"], g["geomean_eager"], g["geomean_compile"]) == (0.0, 0.0, None, None)


def test_kgen_best_metrics_json_and_table(db):
    out = CliRunner().invoke(main, ["best", "--db", db, "--metrics", "--json", "-p", "0.5", "-p", "2"])
    assert out.exit_code == 0, out.output
    lines = [json.loads(line) for line in out.output.splitlines()]
    one = next(g for g in lines if g["level"] == 1)
    assert (one["fast_0"], one["fast_1"], one["fast_p"]) == (0.5, 0.25, {"0.5": 0.25, "2": 0.25})
    assert one["geomean_eager"] == pytest.approx(math.sqrt(1.5))
    table = CliRunner().invoke(main, ["best", "--db", db], terminal_width=80)
    assert table.exit_code == 0, table.output
    text = table.output
    assert "best verified kernels" in text and "KernelBench metrics per level" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("level 1"))
    assert row.split()[2:7] == ["4", "50%", "25%", "25%", "1.22"], row  # tasks, fast_0, fast_1, fast_2, geomean
    assert max(map(len, text.splitlines())) <= 80
    kernels = [json.loads(line) for line in CliRunner().invoke(main, ["best", "--db", db, "--json"]).output.splitlines()]
    assert {(k["task"], k["level"], k["problem"]) for k in kernels} >= {("1_A", 1, 1), ("7_E", 2, 7)}


def test_kgen_best_help_defines_each_term():
    text = CliRunner().invoke(main, ["best", "--help"], terminal_width=100).output
    for term in ("fast_0:", "fast_1:", "fast_p:", "geomean:", "speedup:"):
        assert term in text, term


def test_kgen_report_json_and_page(db, tmp_path):
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["report", "--db", db, "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    one = next(g for g in data["levels"] if g["level"] == 1)
    assert (one["fast_0"], one["fast_1"], one["fast_p"]["0.5"]) == (0.5, 0.25, 0.25)
    tasks = {t["task"]: t for t in data["tasks"]}
    assert [t["task"] for t in data["tasks"]] == ["1_A", "2_B", "3_C", "4_D", "7_E", "mse"]  # level, problem
    assert tasks["1_A"]["best"]["speedup_eager"] == pytest.approx(3.0) and tasks["3_C"]["best"] is None
    with Store.open(db) as store:
        page = re.sub(r">\s+<", "><", render(store.attempts()))
    assert page.index('id="levels"') < page.index('id="best"') < page.index("Speedups per task")
    # level 1: 4 tasks, fast_0 50%, fast_1 25%, fast_0.5 25%, fast_0.8 25%, fast_1.5 25%, fast_2 25%, geomean 1.22
    assert "<td>4</td><td>50%</td><td>25%</td><td>25%</td><td>25%</td><td>25%</td><td>25%</td><td>1.22</td>" in page


def test_a_report_over_250_tasks_stays_readable(tmp_path):
    """KernelBench's 250 tasks: the per-level table and one distribution chart first, no chart per task,
    each task's attempts one click away (a closed <details> the best table links to)."""
    plan = []
    for level, count in ((1, 100), (2, 100), (3, 50)):
        for problem in range(1, count + 1):
            name = f"{problem}_L{level}"
            speed = 0.5 + (problem % 7) * 0.4
            plan.append((name, level, problem, 0, _correct(1.0, speed, speed * 0.8) if problem % 5 else
                         _failed(Verdict.build_failed)))
    path = _store(tmp_path / "big.db", plan)
    with Store.open(path) as store:
        rows = store.attempts()
        page = render(rows)
    assert len(rows) == 250
    figures = re.findall(r'class="kgen-figure" data-target="([^"]+)"', page)
    assert figures == ["chart-distribution", "chart-verdicts", "chart-fast-p"]
    tasks = re.findall(r'<details class="attempts task" id="task-([^"]+)">', page)
    assert len(tasks) == 250 and tasks[:2] == ["1_L1", "2_L1"] and tasks[-1] == "50_L3"
    assert ' open' not in re.search(r'<details class="attempts task"[^>]*>', page).group(0)
    assert '<a href="#task-1_L1">1_L1</a>' in page
    assert page.index('id="levels"') < page.index("chart-distribution") < page.index('id="best"') \
        < page.index('id="task-1_L1"')
    levels = re.findall(r'<td class="l">level (\d)</td>', page)
    assert levels == ["1", "2", "3"]
    figure = json.loads(re.search(r'data-target="chart-distribution">(.*?)</script>', page, re.S).group(1))
    eager = next(t for t in figure["data"] if t["name"] == "over eager")
    assert sum(eager["y"]) == 200  # every task with a verified kernel, once
