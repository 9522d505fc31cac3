""""Best" means one thing everywhere: `kgen best`, the run summary, the report, `kgen export --best`,
KernelBench's metrics and the library name the same kernel (pipeline.leaderboard.rank_key).

The database is real (SQLite through the Store API) and holds the case that split them before: a
verified kernel with the highest side-by-side speedup, another with a lower time from a faster
evaluation, and a flagged and an untrusted one with higher speedups than either.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from rich.console import Console

from pipeline.library.export import export_best
from pipeline.cli.inspect import best
from pipeline.report.kbmetrics import best_per_task
from pipeline.leaderboard import is_verified
from pipeline.records import Baselines, EvalResult, Flag, Provenance, ShapeRun, Timing, TrialResult, Verdict
from pipeline.report.page import report_data, report_json
from pipeline.library.selection import from_db
from pipeline.store.store import Store
from pipeline.cli.tables import run_summary

ROOT = Path(__file__).resolve().parent.parent
MSE_TASK = ROOT / "reference_tasks" / "mse.py"
DEVICE = "cpu: Test CPU"


def _source(label: str) -> str:
    # Distinct texts, so distinct code hashes; never built or imported here.
    return (f"# kernel {label}\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
            "    def forward(self, predictions, targets):\n        return ((predictions - targets) ** 2).mean()\n")


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, n=20)


def _correct(ms: float, eager: float, flags: list[Flag] | None = None, trusted: bool = True) -> EvalResult:
    trials = [TrialResult(index=i, variant=v, ok=True) for i, v in enumerate(("base", "scaled", "heavy"))]
    shapes = [ShapeRun(size="odd", correct=True, own_ran=True, time=_timing(ms / 10), eager=_timing(eager / 10),
                       faster=True)]
    trials.append(TrialResult(index=3, variant="scaled@odd", ok=True))
    return EvalResult(verdict=Verdict.correct, trials=trials, timing=_timing(ms), shapes=shapes, sizes=["small", "odd"],
                      baselines=Baselines(eager=_timing(eager), compiled=_timing(eager * 2), floor_ms=0.05),
                      flags=flags or [], trusted=trusted, untrusted_reason=None if trusted else "test: not confined",
                      device=DEVICE, torch_version=torch.__version__)


# label: (kernel ms, eager ms timed beside it, flags, trusted)
ATTEMPTS = {
    "ratio": (1.0, 2.0, [], True),        # 2.0x: the highest side-by-side speedup among verified kernels
    "time": (0.8, 1.2, [], True),         # 1.5x: the lowest time, from an evaluation whose eager ran faster
    "flagged": (0.2, 1.0, [Flag.no_custom_kernel], True),  # 5x, but not a kernel we vouch for
    "untrusted": (0.1, 0.8, [], False),   # 8x, judged by a child below the required confinement
}


@pytest.fixture
def filled(tmp_path):
    generated = tmp_path / "generated"
    generated.mkdir()
    db = tmp_path / "kgen.db"
    ids = {}
    with Store.open(db) as store:
        run = store.start_run("{}", "[]", "cpu", DEVICE, torch.__version__, None)
        task_id = store.upsert_task("mse", str(MSE_TASK), MSE_TASK.read_text())
        for sample, (label, (ms, eager, flags, trusted)) in enumerate(ATTEMPTS.items()):
            text = _source(label)
            (generated / f"{_hash(text)}.py").write_text(text)
            ids[label] = store.save_attempt(Provenance(run_id=run, task_id=task_id, task="mse", model="m",
                                                       sample=sample, backend="cpu", template="t", completion_id=None,
                                                       code_hash=_hash(text), size="small"), _correct(ms, eager,
                                                       flags, trusted))
        store.finish_run(run, "done")
        rows = store.attempts()
    return {"db": db, "generated": generated, "run": run, "ids": ids, "rows": rows}


def test_the_old_rules_disagreed_on_this_database(filled):
    """The case itself: lowest time, highest ratio among verified, and highest ratio among all
    correct attempts are three different attempts (what `kgen best`, export and the run summary
    each used to report)."""
    rows, ids = filled["rows"], filled["ids"]
    verified = [r for r in rows if is_verified(r)]
    lowest_time = min(verified, key=lambda r: (r["time_ms"], r["id"]))["id"]
    highest_ratio = max(verified, key=lambda r: r["speedup_eager"])["id"]
    summary_max = max(r["speedup_eager"] for r in rows if r["verdict"] == "correct")
    assert (lowest_time, highest_ratio, summary_max) == (ids["time"], ids["ratio"], 8.0)


def test_best_summary_report_export_metrics_and_library_name_one_kernel(filled, tmp_path):
    ids, db, rows = filled["ids"], filled["db"], filled["rows"]
    want = ids["ratio"]

    listed = CliRunner().invoke(best, ["--db", str(db), "--json"])
    assert listed.exit_code == 0, listed.output
    (board,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (board["attempt"], board["speedup_eager"]) == (want, 2.0)

    with Store.open(db, reader=True) as store:
        out = io.StringIO()
        for part in run_summary(store, filled["run"], "cpu"):
            Console(file=out, width=200).print(part)
    summary = out.getvalue()
    assert want in summary and ids["time"] not in summary and ids["flagged"] not in summary
    (line,) = [ln for ln in summary.splitlines() if want in ln]
    # n, correct, verified (the flagged and the untrusted are not), fast_1 (verified and above 1x eager)
    assert line.split()[:5] == ["mse", "4", "4", "2", "2"] and "8" not in line.split()

    assert [r["id"] for r in report_data(rows)["best"]] == [want]
    assert report_json(rows)["tasks"][0]["best"]["id"] == want
    assert best_per_task(rows)["mse"]["id"] == want

    manifest = export_best(db, tmp_path / "export", generated_dir=filled["generated"])
    assert [k.attempt_id for k in manifest.tasks["mse"]] == [want]

    choice = from_db("mse", db, "cpu", "cpu", filled["generated"], tmp_path / "builds")
    assert choice.entry is not None and choice.entry.attempt_id == want
