"""Gradient mode's bound on a GPU: forward plus backward replayed from CUDA graphs
(pipeline.child.replays), so the parent's clock bounds a call's device time down to short calls,
where the eager bound, which counts autograd's host work, refused nothing below 0.5 ms and kept such
results untrusted. Skipped without CUDA (CI); run on the device machine by
bench/gpu_check.sh."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.child import tasks
from pipeline.config import EvalConfig

from forgers import assert_refused_or_near_twin, forged_clock, honest_and_trusted, judge_in_turn

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = EvalConfig(trials=5, timed_calls=20, warmup_calls=3, timeout_s=120, compile_baseline=False,
                      check_shapes=False, grad=True)
# mse forward plus backward: about 30 us, 60 us and 0.3 ms a call on an H200.
SIZES = {"short": {"batch_size": 64, "input_shape": (4096,)}, "small": "small",
         "mid": {"batch_size": 4096, "input_shape": (8192,)}}
FORGE_ROUNDS = int(os.environ.get("KGEN_FORGE_ROUNDS", "2"))


@pytest.mark.parametrize("size", list(SIZES))
def test_a_clock_forged_to_half_is_refused_in_gradient_mode_on_a_gpu(tmp_path, size):
    """The reference's own mse as the candidate is correct and trusted, its bound replayed from
    graphs; the same with a clock that claims half of each call's time (the red team's
    forged_time_blocks) is impossible_timing, or judged within 1.3x of its honest twin."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    (tmp_path / "forged.py").write_text(forged_clock(0.5))
    (tmp_path / "honest.py").write_text(task.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n")
    (tmp_path / "build").mkdir()
    codes = {name: (tmp_path / f"{name}.py", tmp_path / "build") for name in ("honest", "forged")}
    results = judge_in_turn(task, SIZES[size], "cuda", SETTINGS, codes, FORGE_ROUNDS, f"grad@{size}")
    assert all(r.grad for _, r in results)

    def honest(r):
        honest_and_trusted(r)
        assert "replayed from CUDA graphs" in (r.bound_note or ""), r.bound_note

    assert_refused_or_near_twin(results, honest)
