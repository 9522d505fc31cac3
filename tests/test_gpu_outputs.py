"""A clock forged to half on a task whose output is as large as its inputs (tests/tasks/big_add, an
elementwise add), on a GPU: the replayed bound subtracts a null model's replays, and a null that
writes its output afresh each call takes the write of the output off the estimate too, which is a
third of an add's traffic. Skipped without CUDA (CI); run on the device machine by bench/gpu_check.sh."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.child import tasks
from pipeline.config import EvalConfig

from forgers import assert_refused_or_near_twin, forged_clock, honest_and_trusted, judge_in_turn

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
ADD = "def forward(self, a, b):\n        return a + b"
# 16 MB and 256 MB outputs: about 12 us and 0.2 ms a call on an H200.
SIZES = {"2048": {"rows": 2048, "cols": 2048}, "8192": {"rows": 8192, "cols": 8192}}
FORGE_ROUNDS = int(os.environ.get("KGEN_FORGE_ROUNDS", "2"))


@pytest.mark.parametrize("size", list(SIZES))
def test_a_clock_forged_to_half_on_a_large_output_is_refused(tmp_path, size):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    task = tasks.discover(ROOT / "tests" / "tasks", ["big_add"])[0]
    (tmp_path / "forged.py").write_text(forged_clock(0.5, ADD))
    (tmp_path / "honest.py").write_text(f"import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    {ADD}\n")
    (tmp_path / "build").mkdir()
    settings = EvalConfig(trials=5, timed_calls=20, warmup_calls=3, timeout_s=120, compile_baseline=False,
                          check_shapes=False)
    codes = {name: (tmp_path / f"{name}.py", tmp_path / "build") for name in ("honest", "forged")}
    results = judge_in_turn(task, SIZES[size], "cuda", settings, codes, FORGE_ROUNDS, f"add@{size}")
    assert_refused_or_near_twin(results, honest_and_trusted)
