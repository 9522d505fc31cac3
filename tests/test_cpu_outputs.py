"""A clock forged to half on a task whose output is as large as its inputs (tests/tasks/big_add, an
elementwise add), on the cpu in the forward: the bound subtracts a null model's Bound requests, and
a null that writes its output afresh each call takes the write of the output off the estimate too,
a third of an add's traffic (a clock forged to half passed 3 of 3 at 2048 x 2048). The null now
hands back one result a set, and a Bound request hands each output over as it comes, so its
allocations are a timed block's (before, every output of a request was held to its end, and an
honest add's estimate read 1.6x its calls at 512 x 512). The GPU's twin: tests/test_gpu_outputs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.child import tasks
from pipeline.config import EvalConfig
from pipeline.records import Verdict

from forgers import assert_refused_or_near_twin, forged_clock, judge_in_turn, load_unfit

ROOT = Path(__file__).resolve().parent.parent
ADD = "def forward(self, a, b):\n        return a + b"
# 1 MB and 16 MB outputs: about 0.1 ms and 3 ms a call on one core of the 2-core box.
SIZES = {"512": {"rows": 512, "cols": 512}, "2048": {"rows": 2048, "cols": 2048}}
SETTINGS = EvalConfig(compile_baseline=False, trials=5, timed_calls=10, timed_ms=0, warmup_calls=2, timeout_s=60,
                      check_shapes=False)


def honest_and_estimated(r) -> None:
    """Correct and trusted, and the estimate reads about its own calls (0.96-1.04 of them at 512 x 512
    on the idle box) unless the load made the timing unfit."""
    assert r.verdict is Verdict.correct and r.trusted, (r.verdict, r.error, r.bound_note)
    assert load_unfit(r) or r.wall_ms_per_call < 1.5 * r.time_ms, (r.time_ms, r.wall_ms_per_call)


@pytest.mark.parametrize("size", list(SIZES))
def test_a_clock_forged_to_half_on_a_large_output_is_refused_on_the_cpu(tmp_path, size):
    task = tasks.discover(ROOT / "tests" / "tasks", ["big_add"])[0]
    (tmp_path / "forged.py").write_text(forged_clock(0.5, ADD))
    (tmp_path / "honest.py").write_text(f"import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    {ADD}\n")
    (tmp_path / "build").mkdir()
    codes = {name: (tmp_path / f"{name}.py", tmp_path / "build") for name in ("honest", "forged")}
    results = judge_in_turn(task, SIZES[size], "cpu", SETTINGS, codes, 1, f"add@{size}")
    assert_refused_or_near_twin(results, honest_and_estimated)
