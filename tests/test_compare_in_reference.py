"""Past POLICY.ahead_bytes of an attempt's expected values, a checked call's output is compared in the
reference process, where its float64 values are computed (refproto.Compare): the parent hands over
the outbox's memfd and gets back the comparison's figures, never the values. Here, on the cpu, with
real reference processes and children: the figures are those of the parent's own comparison of the
same bytes, and an attempt judged that way gets the verdicts it gets when judged in the parent."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.child import memfd, tasks
from pipeline.child import protocol as P
from pipeline.config import EvalConfig
from pipeline.judge import evaluate, judge
from pipeline.judge import refproto as R
from pipeline.judge.bench import prepare
from pipeline.policy import POLICY
from pipeline.records import Verdict

TEST_TASKS = Path(__file__).resolve().parent / "tasks"
SETTINGS = EvalConfig(compile_baseline=False, trials=2, timed_calls=6, timed_ms=0, warmup_calls=1, timeout_s=90)
SHAPE = [512, 512]


@pytest.fixture(scope="module")
def add_bench():
    task = tasks.discover(TEST_TASKS, ["big_add"])[0]
    bench = prepare(task, "small", "cpu", SETTINGS)
    yield bench
    bench.close()


def _both(bench, values: np.ndarray, slot: int = 1, device: str = "cpu"):
    """The parent's comparison of `values` (float32, in an outbox slot) against a call's float64
    values, and the reference's comparison of the same slot."""
    spec = {"size": "small", "seed": 7, "variant": "base"}
    want = bench.expected_for(11, "trial0", spec)
    fd = memfd.Outbox.create(values.size * 8 * 3)
    box = memfd.Outbox(fd, values.size, 3)
    try:
        assert box.write_tensors(slot, [torch.from_numpy(np.ascontiguousarray(values))])
        header = P.OutputHeader(type="Tensor", exact_tensor=True, shape=SHAPE, dtype="float32", device=device,
                                numel=values.size, written=True, packed=["float32"])
        got = judge.Slot.of(box, slot, ["float32"], [values.size])
        here = judge.compare(header, got, want, bench.tolerance, bench.device)
        parts = [(at, "float32", end - first) for first, end, at, _, _ in got.parts]
        reply = bench.compare(11, R.Spec(key="trial0", **spec), fd, parts, None)
        there = judge.compare(header, got, judge.Expected(reply.shape, reply.numel, reply.ref_dtype, None,
                                                          reply.fp32_rel_err, None, reply.rel_errs, reply.dtypes,
                                                          reply.own_errs),
                              bench.tolerance, bench.device, stats=reply.stats)
        return here, there, judge.mapped(want.fd, np.float64, want.numel)
    finally:
        box.close()
        os.close(fd)
        os.close(want.fd)


def test_the_references_comparison_reads_what_the_parents_reads(add_bench):
    """The same bytes judged both ways: right values correct with the same errors; one value far off
    found at the same index with the same expected and got values; a NaN non-finite either way."""
    _agree(add_bench, "cpu")


@pytest.mark.gpu
def test_on_a_gpu_the_references_comparison_reads_what_the_parents_reads():
    """The same on a GPU: the reference reads the slot into the device and compares it there."""
    bench = prepare(tasks.discover(TEST_TASKS, ["big_add"])[0], "small", "cuda", SETTINGS)
    try:
        _agree(bench, "cuda:0")
    finally:
        bench.close()


def _agree(bench, device: str) -> None:
    spec = {"size": "small", "seed": 7, "variant": "base"}
    want = bench.expected_for(11, "trial0", spec)
    right = judge.mapped(want.fd, np.float64, want.numel).astype(np.float32)
    os.close(want.fd)
    here, there, _ = _both(bench, right, device=device)
    assert here.ok and there.ok, (here.error, there.error)
    assert there.max_abs_err == pytest.approx(here.max_abs_err, rel=1e-9, abs=1e-12)
    assert there.max_rel_err == pytest.approx(here.max_rel_err, rel=1e-9, abs=1e-12)
    off = right.copy()
    off[1_000] += 0.25
    off[200_000] += 3.0  # the furthest past its bound
    here, there, ref = _both(bench, off, device=device)
    assert here.verdict is there.verdict is Verdict.mismatch
    assert there.worst_index == here.worst_index == [200_000 // 512, 200_000 % 512]
    assert there.expected == here.expected == ref[200_000] and there.got == here.got == float(off[200_000])
    assert there.error == here.error
    nan = right.copy()
    nan[-1] = np.nan
    here, there, _ = _both(bench, nan, device=device)
    assert here.verdict is there.verdict is Verdict.non_finite


HONEST = """
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return a + b
"""
# Right on every call but one element, off by far more than the tolerance: found only by a
# comparison of every value, wherever it runs.
ONE_OFF = """
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = a + b
        out[300, 7] += 1.0
        return out
"""


@pytest.mark.parametrize("code,verdict", [(HONEST, (Verdict.correct, Verdict.impossible_timing)), (ONE_OFF, (Verdict.mismatch,))],
                         ids=["honest", "one_off"])
def test_an_attempt_whose_values_are_compared_in_the_reference_gets_its_verdict(add_bench, tmp_path, monkeypatch,
                                                                                 code, verdict):
    """Every expected value past the ahead limit (0 here): each trial and checked call is compared in
    the reference. The honest add is correct (or refused by the floor on a busy box: a timing verdict,
    reached only after every check passed); one element off is a mismatch naming that element."""
    monkeypatch.setattr(evaluate, "POLICY", POLICY.model_copy(update={"ahead_bytes": 0}))
    plan = evaluate.AttemptPlan.draw(add_bench)
    assert not plan.ahead, "the plan would compare in the parent: this test would test nothing"
    path = tmp_path / "model_new.py"
    path.write_text(code)
    build = tmp_path / "build"
    build.mkdir()
    result = evaluate.evaluate(add_bench, path, build, SETTINGS)
    assert result.verdict in verdict, result.error
    if result.verdict is Verdict.mismatch:
        assert result.trials[0].worst_index == [300, 7], result.trials
