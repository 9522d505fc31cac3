"""A clock forged to a tenth on a task whose output is as large as its inputs (tests/tasks/big_add, an
elementwise add), on the cpu in the forward. The time recorded is the parent's window less a null
request's, and the null hands back one result a set, so it writes no output a call does: an honest
add reads about eager, and the forger reads as its twin, its claims never read. A Bound request
hands each output over as it comes, so its allocations are a timed block's (held to its end, an
honest add read 1.6x its calls at 512 x 512). The GPU's twin: tests/test_gpu_outputs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.child import tasks
from pipeline.config import EvalConfig
from pipeline.records import Verdict

from forgers import UNEARNED_X, forged_clock, gains_nothing, judge_in_turn, no_figure

ROOT = Path(__file__).resolve().parent.parent
ADD = "def forward(self, a, b):\n        return a + b"
# A 1 MB output, about 0.1 ms a call on one core of the 2-core box. (16 MB outputs, 2048 x 2048, took
# 140-210 s of the suite beside its other worker and showed nothing 1 MB does not: outputs of a
# gigabyte are tests/test_big_output.py's.)
SIZES = {"512": {"rows": 512, "cols": 512}}
SETTINGS = EvalConfig(compile_baseline=False, trials=5, timed_calls=10, timed_ms=0, warmup_calls=2, timeout_s=60,
                      check_shapes=False)


def honest_and_earned(r) -> None:
    """Correct and trusted, and about eager's speed (the same add) unless the load left no figure."""
    assert r.verdict is Verdict.correct and r.trusted, (r.verdict, r.error, r.bound_note)
    assert no_figure(r) or 1 / UNEARNED_X < r.speedup_eager < UNEARNED_X, (r.time_ms, r.speedup_eager, r.eager_beside)


@pytest.mark.parametrize("size", list(SIZES))
def test_a_clock_forged_on_a_large_output_gains_nothing_on_the_cpu(tmp_path, size):
    task = tasks.discover(ROOT / "tests" / "tasks", ["big_add"])[0]
    (tmp_path / "forged.py").write_text(forged_clock(0.1, ADD))
    (tmp_path / "honest.py").write_text(f"import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    {ADD}\n")
    (tmp_path / "build").mkdir()
    codes = {name: (tmp_path / f"{name}.py", tmp_path / "build") for name in ("honest", "forged")}
    results = judge_in_turn(task, SIZES[size], "cpu", SETTINGS, codes, 1, f"add@{size}")
    honest_and_earned(results[0][1])
    gains_nothing(results[1][1])
