"""`kgen best` and `kgen export` against a real database filled through the Store (`kgen report`:
tests/test_report.py)."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from click.testing import CliRunner

from pipeline.cli.inspect import best, export, report
from pipeline.leaderboard import best_rows, is_verified, rank_key
from pipeline.records import Baselines, EvalResult, Flag, Provenance, Timing, Verdict
from pipeline.store.store import Store

def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, n=20)


def _correct(ms, eager, compiled, floor=0.1, flags=(), device="cpu: Test CPU") -> EvalResult:
    return EvalResult(verdict=Verdict.correct, flags=list(flags), timing=_timing(ms),
                      baselines=Baselines(eager=_timing(eager), compiled=_timing(compiled), floor_ms=floor),
                      device=device, torch_version="2.13.0", cuda_version=None)


def _failed(verdict: Verdict) -> EvalResult:
    return EvalResult(verdict=verdict, error=f"{verdict.value} happened", device="cpu: Test CPU",
                      torch_version="2.13.0")


@pytest.fixture
def db(tmp_path):
    """Two runs; run A on the cpu holds seven attempts over two tasks and two models, run B one on a GPU."""
    path = tmp_path / "kgen.db"
    ids: dict[str, str] = {}
    with Store.open(path) as store:
        run_a = store.start_run("{}", "[]", "cpu", "cpu: Test CPU", "2.13.0", None)
        run_b = store.start_run("{}", "[]", "cuda", "Test GPU", "2.13.0", "12.4")
        plan = [
            ("mse_m1_0", run_a, "mse", "m1", 0, "cpu", _correct(0.5, 1.0, 0.8)),           # x2.0, x1.6
            ("mse_m1_1", run_a, "mse", "m1", 1, "cpu", _correct(0.25, 1.0, 0.8, flags=[Flag.no_custom_kernel])),
            ("mse_m2_0", run_a, "mse", "m2", 0, "cpu", _correct(0.4, 1.0, 0.8)),           # x2.5, x2.0: best
            ("mse_m2_1", run_a, "mse", "m2", 1, "cpu", _failed(Verdict.mismatch)),
            ("hinge_m1_0", run_a, "hinge", "m1", 0, "cpu", _failed(Verdict.build_failed)),
            ("hinge_m2_0", run_a, "hinge", "m2", 0, "cpu", _correct(2.0, 1.0, 0.8, floor=0.5)),  # x0.5, x0.4
            ("mse_gpu", run_b, "mse", "m1", 0, "cuda", _correct(0.1, 0.3, 0.2, floor=0.01, device="Test GPU")),
        ]
        for key, run, task, model, sample, backend, result in plan:
            task_id = store.upsert_task(task, f"{task}.py", f"# {task}\n")
            ids[key] = store.save_attempt(Provenance(run_id=run, task_id=task_id, task=task, model=model,
                                                     sample=sample, backend=backend, template="t", completion_id=None,
                                                     code_hash=f"{key:0<16}"[:16], size="small"), result)
    return {"path": str(path), "ids": ids, "run_a": run_a, "run_b": run_b}


def _invoke(command, *args):
    result = CliRunner().invoke(command, [str(a) for a in args])
    return result


def test_verified_and_ranking():
    rows = [{"id": "b", "verdict": "correct", "flags": [], "time_ms": 1.0, "code_hash": "h", "task": "t",
             "backend": "cpu", "device": "d", "size": "s", "speedup_eager": 2.0, "trusted": 1},
            {"id": "a", "verdict": "correct", "flags": [], "time_ms": 1.0, "code_hash": "h", "task": "t",
             "backend": "cpu", "device": "d", "size": "s", "speedup_eager": 2.0, "trusted": 1},
            {"id": "c", "verdict": "correct", "flags": ["shape_specialized"], "time_ms": 0.1, "code_hash": "h",
             "task": "t", "backend": "cpu", "device": "d", "size": "s", "speedup_eager": 20.0, "trusted": 1}]
    assert [is_verified(r) for r in rows] == [True, True, False]
    # Judged by a child below the required confinement, or by the evaluator before it was sealed.
    assert not is_verified({**rows[0], "trusted": 0}) and not is_verified({**rows[0], "trusted": None})
    assert [r["id"] for r in best_rows(rows)] == ["a"]  # the tie goes to the earlier id
    assert sorted(rows[:2], key=rank_key)[0]["id"] == "a"


def test_best_json(db):
    result = _invoke(best, "--db", db["path"], "--json")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["task"], r["backend"], r["attempt"]) for r in lines] == [
        ("hinge", "cpu", db["ids"]["hinge_m2_0"]), ("mse", "cpu", db["ids"]["mse_m2_0"]),
        ("mse", "cuda", db["ids"]["mse_gpu"])]
    mse_cpu = lines[1]
    assert (mse_cpu["time_ms"], mse_cpu["speedup_eager"], mse_cpu["speedup_compile"]) == (0.4, 2.5, 2.0)
    assert mse_cpu["floor_fraction"] == pytest.approx(0.25)
    assert (mse_cpu["model"], mse_cpu["run"], mse_cpu["device"]) == ("m2", db["run_a"], "cpu: Test CPU")
    assert lines[2]["speedup_eager"] == pytest.approx(3.0)


def test_best_filters_and_table(db):
    result = _invoke(best, "--db", db["path"], "--task", "mse", "--backend", "cpu", "--json")
    assert [json.loads(line)["attempt"] for line in result.output.splitlines()] == [db["ids"]["mse_m2_0"]]
    table = _invoke(best, "--db", db["path"], "--backend", "cpu")
    assert table.exit_code == 0
    assert "best verified kernels" in table.output
    assert re.search(r"mse .*2\.5 .*2 ", table.output) and re.search(r"hinge .*0\.5 .*0\.4 ", table.output)
    assert "cuda" not in table.output
    empty = _invoke(best, "--db", db["path"], "--task", "mse", "--backend", "triton")
    assert empty.output == "No verified attempt for task mse.\n"
    unknown = _invoke(best, "--db", db["path"], "--task", "nothing")  # a typo is not "nothing verified"
    assert unknown.exit_code == 2 and "'nothing' is not a task" in unknown.output


@pytest.mark.parametrize("command", [best, export, report])
def test_missing_database_is_one_line(command, tmp_path):
    result = _invoke(command, "--db", tmp_path / "none.db")
    assert result.exit_code == 1
    assert result.output == f"Error: {tmp_path / 'none.db'}: no database (run `kgen run` first, or pass --db)\n"
    assert not (tmp_path / "none.db").exists()


def test_export_jsonl(db):
    result = _invoke(export, "--db", db["path"])
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert len(rows) == 7
    assert {r["id"] for r in rows} == set(db["ids"].values())
    flagged = next(r for r in rows if r["id"] == db["ids"]["mse_m1_1"])
    assert flagged["flags"] == ["no_custom_kernel"] and flagged["time_ms"] == 0.25
    assert flagged["speedup_eager"] == 4.0 and flagged["run"] == flagged["run_id"] == db["run_a"]
    assert "result_json" not in flagged and "detail" not in flagged
    only = _invoke(export, "--db", db["path"], "--verdict", "correct", "--run", db["run_b"])
    assert [json.loads(line)["id"] for line in only.output.splitlines()] == [db["ids"]["mse_gpu"]]


def test_export_csv_to_file(db, tmp_path):
    out = tmp_path / "attempts.csv"
    result = CliRunner().invoke(export, ["--db", db["path"], "--format", "csv", "-o", str(out),
                                         "--verdict", "correct"])
    assert result.exit_code == 0 and f"wrote 5 attempts to {out}" in result.output
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 5
    by_id = {r["id"]: r for r in rows}
    assert by_id[db["ids"]["mse_m1_1"]]["flags"] == "no_custom_kernel"
    assert float(by_id[db["ids"]["hinge_m2_0"]]["speedup_eager"]) == 0.5
    assert by_id[db["ids"]["mse_gpu"]]["backend"] == "cuda"
    header = out.read_text().splitlines()[0].split(",")
    assert header[:4] == ["id", "run_id", "task_id", "task"] and header[-1] == "run"
    empty = _invoke(export, "--db", db["path"], "--format", "csv", "--verdict", "timeout")
    assert empty.stdout.splitlines() == [",".join(header)]  # an empty CSV still has its header
    assert empty.stderr == "No attempts match verdict timeout.\n"

