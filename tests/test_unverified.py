"""Where correct attempts exist but none is verified (a loaded box timed them, or they are flagged or
untrusted), every place that says "no verified attempt" says why and what to run: `kgen best`,
`kgen attempts` (table, --wide, --json), the run summary, the run log's verdict line, the report and
the library. Where only `kgen eval` results exist, `kgen report`, `kgen best` and the library say so.

The databases are real SQLite files written through the Store; nothing is built or judged.
"""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import markupsafe
import pytest
import torch
from click.testing import CliRunner
from rich.console import Console

from pipeline import library
from pipeline.cli.inspect import best, report
from pipeline.cli.main import main
from pipeline.cli.progress import _verdict
from pipeline.cli.tables import run_summary
from pipeline.library.kernels import LibraryError
from pipeline.records import Flag, Provenance, Standing
from pipeline.report.page import render
from pipeline.store.store import Store
from tests.test_best import DEVICE, MSE_TASK, _correct, _hash, _source

LOADED = "the cpu was loaded (30% of the windows' time waiting for a core)"


def _fill(tmp: Path, results, kind: str = "batch", model: str = "replay-demo") -> tuple[Path, str]:
    """A database whose one run holds `results` (EvalResults) for task mse, their code on disk."""
    (tmp / "generated").mkdir(parents=True, exist_ok=True)
    db = tmp / "db" / "kgen.db"
    db.parent.mkdir(exist_ok=True)
    with Store.open(db) as store:
        run = store.start_run("{}", "[]", "cpu", DEVICE, torch.__version__, None, kind=kind)
        task_id = store.upsert_task("mse", str(MSE_TASK), MSE_TASK.read_text())
        for sample, result in enumerate(results):
            text = _source(f"{kind} {sample}")
            (tmp / "generated" / f"{_hash(text)}.py").write_text(text)
            store.save_attempt(Provenance(run_id=run, task_id=task_id, task="mse", model=model, sample=sample,
                                          backend="cpu", template="t", completion_id=None, code_hash=_hash(text),
                                          size="small"), result)
        store.finish_run(run, "done")
    return db, run


def _unfit():
    result = _correct(1.0, 12.8)
    return result.model_copy(update={"outcome": result.outcome.model_copy(update={"standing": Standing.unfit, "why": LOADED})})


@pytest.fixture
def loaded(tmp_path):
    """Three correct attempts, each timed on a device unfit to time it: none has a figure."""
    db, run = _fill(tmp_path, [_unfit() for _ in range(3)])
    return {"db": db, "run": run, "tmp": tmp_path}


def test_best_and_attempts_say_why_none_is_verified(loaded):
    db = str(loaded["db"])
    out = CliRunner().invoke(best, ["--db", db])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("No verified attempt: 3 correct attempts, none verified: 3 were timed on a device "
                                 "unfit to time them") and LOADED in out.output
    assert "`kgen run` again on a quiet machine re-times them" in out.output
    as_json = CliRunner().invoke(best, ["--db", db, "--json"])
    assert as_json.stdout == "" and "none verified" in as_json.stderr  # stdout stays JSON lines

    listed = [json.loads(line) for line in CliRunner().invoke(main, ["attempts", "--db", db, "--json"]).stdout
              .splitlines()]
    assert [(r["not_verified"], r["time_ms"], r["speedup_eager"]) for r in listed] == [(f"unfit: {LOADED}", None,
                                                                                         None)] * 3
    for wide in ([], ["--wide"]):
        table = CliRunner().invoke(main, ["attempts", "--db", db, *wide], env={"COLUMNS": "200"})
        assert table.exit_code == 0, table.output
        rows = [line for line in table.stdout.splitlines() if line.startswith("01")]
        assert " ".join(table.stdout.split()).count(f"not verified: unfit: {LOADED}") == 3, table.stdout
        assert len(rows) == 3 and all(" - " in r and "12.8" not in r for r in rows)  # no figure, only "-"
        assert "error / not verified" in table.stdout and "none verified" in table.stdout


def test_flagged_and_untrusted_attempts_say_which(tmp_path):
    db, _ = _fill(tmp_path, [_correct(1.0, 2.0, flags=[Flag.no_custom_kernel]), _correct(1.0, 2.0, trusted=False)])
    listed = CliRunner().invoke(main, ["attempts", "--db", str(db), "--json"]).stdout.splitlines()
    assert sorted(json.loads(line)["not_verified"] for line in listed) == [
        "flagged: no_custom_kernel", "untrusted: test: not confined"]
    out = CliRunner().invoke(best, ["--db", str(db)]).output
    assert "1 was flagged, not counted as kernels (no_custom_kernel)" in out
    assert "1 was judged by a child confined below what the config requires (first: test: not confined)" in out


def test_the_run_summary_and_the_run_log_say_not_timed(loaded):
    with Store.open(loaded["db"], reader=True) as store:
        out = io.StringIO()
        for part in run_summary(store, loaded["run"], "cpu"):
            Console(file=out, width=80).print(part)
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0] == f"run {loaded['run']} (cpu, model replay-demo)"  # one line, not wrapped at the table's width
    assert not [line for line in lines if line != line.rstrip()], text  # no trailing spaces
    (row,) = [line for line in lines if line.startswith("mse")]
    assert row.split() == ["mse", "3", "3", "0", "0", "-", "-"]  # n, correct, verified, fast_1, best, attempt
    assert "3 correct attempts, none verified" in text and "quiet machine" in text
    assert _verdict(_unfit()) == f"correct, not timed (unfit: {LOADED})"
    assert _verdict(_correct(1.0, 2.0, trusted=False)) == ("correct, 2x eager, 4x torch.compile, not verified "
                                                           "(untrusted: test: not confined)")


def test_fast_1_counts_only_verified_attempts(tmp_path):
    """A flagged 5x and an untrusted 8x are not verified: fast_1 is 0 where best is "-"."""
    db, run = _fill(tmp_path, [_correct(0.2, 1.0, flags=[Flag.no_custom_kernel]), _correct(0.1, 0.8, trusted=False)])
    with Store.open(db, reader=True) as store:
        out = io.StringIO()
        for part in run_summary(store, run, "cpu"):
            Console(file=out, width=80).print(part)
    (row,) = [line for line in out.getvalue().splitlines() if line.startswith("mse")]
    assert row.split() == ["mse", "2", "2", "0", "0", "-", "-"]


def test_the_report_says_why_and_counts_verified_attempts(loaded):
    with Store.open(loaded["db"], reader=True) as store:
        page = render(store.attempts())
    assert '<span id="n-correct">3</span>' in page and '<span id="n-verified">0</span>' in page
    assert '<p id="why-none"><b>No verified attempt</b>: 3 correct attempts, none verified: 3 were timed' in page
    assert f"not verified: unfit: {markupsafe.escape(LOADED)}" in page and "No verified attempt, so no chart." in page
    out = loaded["tmp"] / "not" / "there" / "report.html"  # a folder that does not exist yet
    result = CliRunner().invoke(report, ["--db", str(loaded["db"]), "-o", str(out)])
    assert result.exit_code == 0 and result.output == f"wrote {out}: 3 attempts, 1 tasks\n" and out.is_file()


def test_the_library_says_why_it_runs_the_reference(loaded):
    tmp = loaded["tmp"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mse = library.load("mse", db=loaded["db"], backend="cpu", generated_dir=tmp / "generated",
                           builds_dir=tmp / "builds")
        p = torch.rand(4, 8)
        assert torch.equal(mse(p, p), torch.zeros(()))
    (said,) = [str(w.message) for w in caught if issubclass(w.category, library.KgenFallbackWarning)]
    assert "none verified: 3 were timed on a device unfit to time them" in said and "quiet machine" in said


def test_only_eval_results_are_named(tmp_path):
    db, _ = _fill(tmp_path, [_correct(1.0, 2.0)], kind="eval")
    out = CliRunner().invoke(report, ["--db", str(db), "-o", str(tmp_path / "r.html")])
    assert out.exit_code == 0 and "`kgen report --evals` includes" in out.output and "; no report written." in out.output
    assert "only `kgen eval` results are stored" in CliRunner().invoke(best, ["--db", str(db)]).output
    with pytest.raises(LibraryError, match=r"has only `kgen eval` results, which the library never uses; a `kgen run`"):
        library.load("mse", db=db, backend="cpu", generated_dir=tmp_path / "generated", builds_dir=tmp_path / "b")
