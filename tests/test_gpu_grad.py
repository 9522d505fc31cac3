"""Gradient mode's bound on a GPU (issue 27, items 3 and 5 together): forward plus backward replayed
from CUDA graphs (pipeline.child.replays), so the parent's clock bounds a call's device time down to
short calls, where the eager bound, which counts autograd's host work, refused nothing below 0.5 ms
and kept such results untrusted. Skipped without CUDA (CI); run on the device machine by
bench/gpu_check.sh."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.child import tasks
from pipeline.config import EvalConfig
from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.records import Verdict

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
REDTEAM = Path(__file__).parent / "redteam"
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
    forged = (REDTEAM / "forged_time_blocks.py").read_text().replace("FACTOR = 0.1\n", "FACTOR = 0.5\n")
    assert "FACTOR = 0.5\n" in forged
    (tmp_path / "forged.py").write_text(forged)
    (tmp_path / "honest.py").write_text(task.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n")
    (tmp_path / "build").mkdir()
    bench = prepare(task, SIZES[size], "cuda", SETTINGS)
    try:
        results = [(name, evaluate.evaluate(bench, tmp_path / f"{name}.py", tmp_path / "build", SETTINGS))
                   for name in ("honest", "forged") * FORGE_ROUNDS]
    finally:
        bench.close()
    for name, r in results:
        print(f"\nREDTEAM grad {name}@{size}: {r.verdict.value} time_ms={r.time_ms} parent_ms={r.wall_ms_per_call} "
              f"trusted={r.trusted} error={r.error} bound={r.bound_note} untrusted={r.untrusted_reason}")
    for (name, r), (_, twin) in zip(results, [results[0]] + results[:-1]):
        assert r.grad
        if name == "honest":
            assert r.verdict is Verdict.correct and r.trusted, (r.error, r.untrusted_reason, r.bound_note)
            assert "replayed from CUDA graphs" in (r.bound_note or ""), r.bound_note
        elif r.verdict is not Verdict.impossible_timing:
            assert r.verdict is Verdict.correct and r.time_ms * 1.3 >= twin.time_ms, (r.verdict, r.time_ms, twin.time_ms)
