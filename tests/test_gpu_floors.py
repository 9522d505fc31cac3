"""The compute floor on a GPU: a matmul whose inputs are read in microseconds, so
its bandwidth floor says nothing, and whose arithmetic at the device's best measured matmul rate
does. Skipped without CUDA (CI); run on the device machine by bench/gpu_check.sh."""

from __future__ import annotations

import pytest

from pipeline.child import tasks
from pipeline.config import EvalConfig
from pipeline.records import Verdict

from forgers import assert_refused_or_near_twin, forged_clock, honest_and_trusted, judge_in_turn

pytestmark = pytest.mark.gpu

N = 2048  # float32, no TF32: about 0.3 ms a call on an H200; 17 GFLOP

TASK = f'''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn({N}, {N}), torch.randn({N}, {N})]


def get_init_inputs():
    return []
'''


@pytest.mark.parametrize("factor", ["0.02", "0.5"])
def test_a_forged_clock_on_a_gpu_matmul_gains_nothing_and_the_honest_one_is_correct(tmp_path, factor):
    """The floor the reference measured lies below eager (the fastest matmul rate of float32,
    bfloat16 and float16 at 8192), and the honest `a @ b` is correct and trusted. A clock forged to a
    fiftieth or to half of its time is never read (the parent's replay windows are the only clock):
    it is judged within 1.3x of its honest twin."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "matmul.py").write_text(TASK)
    task = tasks.discover(tmp_path / "tasks", ["matmul"])[0]
    (tmp_path / "forged.py").write_text(forged_clock(factor, "def forward(self, a, b):\n        return a @ b"))
    (tmp_path / "honest.py").write_text("import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                                        "    def forward(self, a, b):\n        return a @ b\n")
    (tmp_path / "build").mkdir()
    settings = EvalConfig(trials=5, timed_calls=20, warmup_calls=3, timeout_s=120, compile_baseline=False,
                          check_shapes=False)
    codes = {name: (tmp_path / f"{name}.py", tmp_path / "build") for name in ("honest", "forged")}
    results = judge_in_turn(task, "default", "cuda", settings, codes, 3, f"floor@{factor}")
    b = next(r.baselines for _, r in results if r.baselines)  # the bench's, as every attempt stores them
    print(f"\nREDTEAM floor matmul {N}: eager {b.eager.median_ms:.4f} ms, compute floor {b.compute_floor_ms} ms "
          f"({b.flops} flop at {b.flops_per_s / 1e12 if b.flops_per_s else None} TFLOP/s), bandwidth floor {b.floor_ms}")
    assert b.flops == 2 * N ** 3 and b.flops_per_s > 1e14, b  # a Hopper's bfloat16 matmuls: hundreds of TFLOP/s
    assert b.floor_ms < b.compute_floor_ms < b.eager.median_ms, b
    assert_refused_or_near_twin(results, honest_and_trusted)
    assert all(r.verdict is Verdict.correct for _, r in results), [(n, r.verdict, r.error) for n, r in results]
