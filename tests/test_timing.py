"""How many calls are timed: short calls get more (timing.calls_for), baselines and candidate alike."""

from __future__ import annotations

from pathlib import Path

from pipeline import evaluate
from pipeline.child import tasks
from pipeline.config import EvalConfig
from pipeline.records import Verdict
from pipeline.child.timing import calls_for

ROOT = Path(__file__).resolve().parent.parent

MSE_IN_TORCH = '''
import torch


class ModelNew(torch.nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
'''


def test_calls_for_adds_calls_for_short_kernels_within_bounds():
    assert calls_for(5.0, 100, 30, 256) == 30  # long calls: the least
    assert calls_for(0.8, 100, 30, 256) == 125  # about 100 ms of calls
    assert calls_for(0.25, 100, 30, 256) == 256  # capped
    assert calls_for(None, 100, 30, 256) == 30  # no estimate (no baseline): the least
    assert calls_for(0.25, 0, 30, 256) == 30  # timed_ms 0 turns it off
    assert calls_for(0.25, 100, 30, 20) == 30  # the least wins over a smaller cap


def test_a_short_task_is_timed_with_more_calls_on_both_sides(tmp_path):
    """A real reference process and a real child: the baselines and the candidate are each timed
    with the number of calls the rule gives their speed, not the configured least."""
    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    code = tmp_path / "cand.py"
    code.write_text(MSE_IN_TORCH)
    common = dict(trials=2, warmup_calls=1, compile_baseline=False, check_shapes=False, profile=False,
                  timeout_s=120, timed_calls=6, max_timed_calls=24)
    counts = {}
    for target in (0.0, 10_000.0):  # off, then far more milliseconds than 24 small calls take
        settings = EvalConfig(timed_ms=target, **common)
        bench = evaluate.prepare(task, "small", "cpu", settings)
        try:
            result = evaluate.evaluate(bench, code, tmp_path / "build", settings)
        finally:
            bench.close()
        assert result.verdict is Verdict.correct, result.error
        counts[target] = (bench.timed_calls, bench.baselines.eager.n, result.timing.n)
    assert counts[0.0] == (6, 6, 6)
    assert counts[10_000.0] == (24, 24, 24)
