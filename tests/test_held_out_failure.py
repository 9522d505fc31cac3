"""Nothing is timed at a held-out size (policy 5, docs/decisions/held-out-sizes.md): a reference
that dies in any eager block there costs nothing. (Under policy 4 an H100 batch's huber reference
failed there every attempt, and each next attempt waited about 17 s for a new reference process.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.child import tasks
from pipeline.config import EvalConfig
from pipeline.records import Verdict

SETTINGS = EvalConfig(compile_baseline=False, trials=3, timed_calls=8, timed_ms=0, warmup_calls=2, timeout_s=120,
                      profile=False)
TASK = '''
import os
import sys

import torch
import torch.nn as nn

DIE = {die}


def _in_reference_block():
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "time_block" and f.f_code.co_filename.endswith("reference.py"):
            return True
        f = f.f_back
    return False


class Model(nn.Module):
    def forward(self, predictions, targets):
        if tuple(predictions.shape) != (256, 4096) and _in_reference_block():
            if DIE:
                os._exit(1)
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return torch.nn.functional.smooth_l1_loss(predictions, targets)


batch_size = 32768
input_shape = (32768,)
KGEN_SIZES = {{"small": {{"batch_size": 256, "input_shape": (4096,)}}}}
KGEN_DOMAINS = ["real", "real"]


def get_inputs():
    return [torch.rand(batch_size, *input_shape), torch.rand(batch_size, *input_shape)]


def get_init_inputs():
    return []
'''
CANDIDATE = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.nn.functional.smooth_l1_loss(predictions, targets)
'''


def test_no_eager_block_is_timed_at_a_held_out_size(tmp_path):
    task_path = tmp_path / "held_out_oom.py"
    task_path.write_text(TASK.format(die=True))
    code = tmp_path / "candidate.py"
    code.write_text(CANDIDATE)
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    bench = prepare(tasks.load_file(task_path), "small", "cpu", SETTINGS)
    try:
        result = evaluate.evaluate(bench, code, build_dir, SETTINGS)
    finally:
        bench.close()
    # An honest call, about 4.6 times its bandwidth floor idle and beside two busy loops: correct, each
    # held-out size judged, its reference never asked to time there.
    assert result.verdict is Verdict.correct, result.error
    assert len(result.shapes) == 2 and all(run.correct and run.error is None for run in result.shapes), result.shapes


def test_a_reference_that_fails_while_starting_is_not_left_running(monkeypatch):
    """A failure while the reference process starts (in the sweep, the reader's select() on a
    descriptor past 1023) ended open_bench with the process still running, out of reach of
    TaskBench.close: on the GPU it kept its task's inputs in memory, and the children after it ran
    out. The process is killed before the error leaves. The fault is injected at the first reply."""
    import os

    from pipeline import sandbox
    from pipeline.judge.bench import open_bench

    started = []
    real_start = sandbox.start

    def start(*args, **kwargs):
        child = real_start(*args, **kwargs)
        started.append(child)
        return child

    def receive(self, parse):
        raise ValueError("filedescriptor out of range in select()")

    monkeypatch.setattr(sandbox, "start", start)
    monkeypatch.setattr(sandbox.Child, "receive", receive)
    task = tasks.discover(Path(__file__).resolve().parent.parent / "reference_tasks", ["mse"])[0]
    with pytest.raises(ValueError, match="out of range"):
        open_bench(task, "small", "cpu", SETTINGS)
    assert len(started) == 1
    pid = started[0].proc.pid
    assert started[0].proc.poll() is not None, "the reference process is still running"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
