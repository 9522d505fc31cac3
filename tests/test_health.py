"""Device fitness (pipeline.judge.health): the rule, an attempt on a device that stopped being fit, and the
resume that re-times it. On the cpu the probe is real (the reference process measures bandwidth);
a device that "went bad" is one whose run-start figure it can no longer reach."""

from __future__ import annotations

import os
import sqlite3

import pytest

from pipeline.judge import evaluate, health
from pipeline.config import EvalConfig
from pipeline.judge.health import Probe
from pipeline.leaderboard import is_verified
from pipeline.records import Verdict

from forgers import no_figure
from test_run import RIGHT, replay, run, write_config

SETTINGS = EvalConfig(compile_baseline=False, trials=2, timed_calls=4, timed_ms=0, warmup_calls=1, timeout_s=60,
                      check_shapes=False, profile=False)
H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("probe,start,device,words", [
    (Probe(bandwidth_gbs=2990, hold_ms=1.001), Probe(bandwidth_gbs=2995, hold_ms=1.0), H100, None),
    (Probe(bandwidth_gbs=673, hold_ms=1.002), Probe(bandwidth_gbs=2995, hold_ms=1.0), H100, "673 GB/s"),
    (Probe(bandwidth_gbs=673, hold_ms=1.002), None, H100, "on a healthy"),  # sick from the start
    (Probe(bandwidth_gbs=2990, hold_ms=1.9), None, H100, "1 ms hold took 1.900"),
    (Probe(bandwidth_gbs=2990, hold_ms=1.0, others=["4242 python busy.py"]), None, H100, "4242 python busy.py"),
    (Probe(bandwidth_gbs=2990, hold_ms=1.0, throttle=["power brake"]), None, H100, "power brake"),
    (Probe(bandwidth_gbs=500, hold_ms=1.0), None, "Some Other GPU", None),  # no stored figure, no start
], ids=["fit", "slower_than_at_start", "sick_from_the_start", "shared", "other_process", "throttled", "unknown_model"])
def test_unfit_reason(probe, start, device, words):
    reason = health.unfit_reason(probe, start, device)
    if words is None:
        assert reason is None
    else:
        assert reason is not None and words in reason


def test_an_attempt_on_an_unfit_device_is_judged_but_not_timed(mse_bench, tmp_path):
    code = tmp_path / "honest.py"
    code.write_text(RIGHT.split("```python\n")[1].split("```")[0])
    (tmp_path / "build").mkdir()
    fit = health.Watch(None)
    result = evaluate.evaluate(mse_bench, code, tmp_path / "build", SETTINGS, watch=fit)
    # Timed. On a busy box the timing may be marked unfit for its load (pipeline.verdicts), or
    # for a machine that changed while it ran: the watch's probe after it read less bandwidth than at
    # its start (a fresh clone beside a busy loop: 9 GB/s against 13). Never for a device unfit before.
    unfit = result.device_unfit or ""
    assert result.verdict is Verdict.correct and (result.timing is not None or no_figure(result)), result.error
    assert not unfit or unfit.startswith("the cpu was loaded") or "when the run began" in unfit, unfit
    assert fit.start is not None and fit.start.bandwidth_gbs > 0  # the first fit probe is the run's figure
    gone_bad = health.Watch(None, start=Probe(bandwidth_gbs=fit.start.bandwidth_gbs * 100))
    result = evaluate.evaluate(mse_bench, code, tmp_path / "build", SETTINGS, watch=gone_bad)
    assert result.verdict is Verdict.correct, result.error
    assert result.timing is None and result.speedup_eager is None  # nothing timed on it
    assert result.device_unfit and "when the run began" in result.device_unfit


def test_a_fit_check_just_taken_stands_for_the_next_attempt_s_own(mse_bench, tmp_path, monkeypatch):
    """In a batch the check after one attempt (its child dead) comes a second or two before the next
    attempt's: within POLICY.recent_s the next attempt takes it for its own and the lane skips a
    probe; past it, or after a check that found the device unfit, it probes again."""
    code = tmp_path / "honest.py"
    code.write_text(RIGHT.split("```python\n")[1].split("```")[0])
    (tmp_path / "build").mkdir()
    watch = health.Watch(None)
    # An attempt may be judged twice (a claim the cpu's bound doubts: pipeline.judge.evaluate), each
    # evaluation with its own checks; the count is per evaluation.
    evaluations, real_judge = [], evaluate._judge
    monkeypatch.setattr(evaluate, "_judge", lambda *a, **k: evaluations.append(1) or real_judge(*a, **k))
    evaluate.evaluate(mse_bench, code, tmp_path / "build", SETTINGS, watch=watch)
    # Before and after; a second evaluation's own "before" may be the first's "after" (POLICY.recent_s).
    assert len(watch.history) == 2 if len(evaluations) == 1 else 3 <= len(watch.history) <= 4, watch.history
    for recent_s, taken in ((3600.0, 1), (0.0, 2)):
        monkeypatch.setattr(health, "POLICY", health.POLICY.model_copy(update={"recent_s": recent_s}))
        fit = watch.history[-1][1] is None  # a loaded box may read its bandwidth low: then no reuse
        before, evaluations[:] = len(watch.history), []
        result = evaluate.evaluate(mse_bench, code, tmp_path / "build", SETTINGS, watch=watch)
        assert result.verdict is Verdict.correct, result.error
        checks = len(watch.history) - before
        if result.timing is not None:
            assert checks == (taken if fit else 2) * len(evaluations), (recent_s, fit, len(evaluations), watch.history[before:])
    assert watch.recent(3600.0) is (watch.history[-1][1] is None)
    watch._record(None, "the reference process sent no health figures")  # as a failed check records it
    assert not watch.recent(3600.0)


def test_a_resume_retimes_what_an_unfit_device_judged(tmp_path):
    config = write_config(tmp_path, [replay(tmp_path, [("mse", RIGHT)])], samples=1)
    run_id, store = run(config)
    db = tmp_path / "db" / "kgen.db"
    bad = "bandwidth 673 GB/s against 2995 GB/s"
    with sqlite3.connect(db) as conn:  # as a run on a device that went bad would have stored it
        conn.execute("UPDATE attempts SET device_unfit = ?, time_ms = NULL", (bad,))
    again, store = run(config)
    (row,) = store.attempts(run=run_id)
    assert again == run_id and row["verdict"] == "correct"
    # Timed again: the bad device's mark is gone. On a busy box the new timing may carry the judge's
    # own load mark instead (pipeline.verdicts), which the next resume re-times in turn.
    assert row["device_unfit"] != bad and row["time_ms"] > 0
    assert row["device_unfit"] is None or row["device_unfit"].startswith("the cpu was loaded"), row["device_unfit"]


def test_a_timing_from_an_unfit_device_is_never_best():
    row = {"verdict": "correct", "flags": [], "time_ms": 0.1, "code_hash": "abc", "trusted": 1, "device_unfit": None}
    assert is_verified(row)
    assert not is_verified({**row, "device_unfit": "a 1 ms hold took 1.900 ms"})


def test_the_baselines_say_where_their_seconds_went(mse_bench):
    """The reference times each part of a task's baselines (Baselines.seconds), and the bench's phases
    carry them to the run's `reference` line: on KernelBench's sizes they took 15-41 s a task."""
    seconds = mse_bench.baselines.seconds
    assert {"eager", "bandwidth_floor", "compute_floor"} <= set(seconds), seconds
    assert all(s >= 0 for s in seconds.values()) and sum(seconds.values()) <= mse_bench.phases["baselines"] + 0.05
    assert {f"baselines_{part}" for part in seconds} <= set(mse_bench.phases), mse_bench.phases


def test_the_gpu_memory_each_process_holds_is_read_from_the_driver(tmp_path, monkeypatch):
    """health.memory_by_process: the lane's GPU's compute processes and their MiB, from nvidia-smi
    (a stand-in on PATH here), other GPUs' left out; what a capture that ran out of memory reports."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$*\" in\n"
                   "  *index,uuid*) printf '0, GPU-a\\n1, GPU-b\\n' ;;\n"
                   "  *compute-apps*) printf 'GPU-a, 101, 41900\\nGPU-b, 102, 500\\nGPU-a, 103, 38912\\n' ;;\nesac\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert health.memory_by_process("0") == {101: 41900, 103: 38912}
    assert health.memory_by_process("1") == {102: 500}
