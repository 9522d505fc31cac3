"""Reference tasks: the KernelBench contract, sizes, input domains, and a dropped-in task with weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline import evaluate
from pipeline.child import tasks
from pipeline.config import EvalConfig
from pipeline.records import Verdict

ROOT = Path(__file__).resolve().parent.parent
SEVEN = ["cosine", "cross_entropy", "hinge", "huber", "kl_div", "mse", "triplet"]


def _module(name: str, size: str = "small"):
    return tasks.load_module(tasks.discover(ROOT / "reference_tasks", [name])[0], size)


def test_the_seven_loss_tasks_are_there_and_follow_the_contract():
    found = [t.name for t in tasks.discover(ROOT / "reference_tasks", ["*"])]
    assert sorted(found) == SEVEN
    for name in SEVEN:
        module = _module(name)
        model = tasks.make_model(module, module.Model, 0, "cpu")
        out = model(*tasks.make_inputs(module, 1, "base", "cpu"))
        assert out.shape == () and out.dtype == torch.float32


@pytest.mark.parametrize("variant", tasks.VARIANTS)
def test_inputs_are_deterministic_and_stay_in_their_domain(variant):
    for name in SEVEN:
        module = _module(name, "odd")
        a = tasks.make_inputs(module, 7, variant, "cpu")
        b = tasks.make_inputs(module, 7, variant, "cpu")
        assert all(torch.equal(x, y) for x, y in zip(a, b)), name
        assert all(torch.isfinite(x.double()).all() for x in a), name
        if name == "cross_entropy":
            assert a[1].dtype == torch.int64 and 0 <= a[1].min() and a[1].max() < module.num_classes
        if name == "kl_div":
            for p in a:
                assert (p > 0).all() and torch.allclose(p.double().sum(-1), torch.ones(p.shape[0], dtype=torch.float64),
                                                        atol=1e-5)
        if name == "hinge":
            assert set(a[1].unique().tolist()) <= {-1.0, 1.0} and a[1].shape == (module.batch_size,)


def test_trials_move_the_answer_by_far_more_than_the_tolerance():
    """A constant cannot pass: the answer differs between variants by orders of magnitude more than 1e-4."""
    for name in SEVEN:
        module = _module(name)
        model = tasks.make_model(module, module.Model, 0, "cpu").double()
        answers = [float(model(*[x.double() if x.is_floating_point() else x
                                 for x in tasks.make_inputs(module, s, v, "cpu")]))
                   for s, v in enumerate(tasks.VARIANTS)]
        spread = (max(answers) - min(answers)) / max(abs(a) for a in answers)
        assert spread > 1e-2, (name, answers)


def test_sizes_come_from_the_config_not_the_file():
    assert _module("mse", "small").batch_size == 256
    assert _module("mse", "default").batch_size == 32768
    assert _module("mse", {"batch_size": 3, "input_shape": (5,)}).batch_size == 3
    assert tasks.other_sizes(_module("mse"), "small") == ["odd"]


KERNELBENCH_LEVEL2 = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """A KernelBench level-2 style task with weights: Linear, then ReLU, then a scale."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return torch.relu(self.linear(x)) * self.scale


batch_size = 16
in_features = 64
out_features = 32
scale = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
'''

SAME_WEIGHTS = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return torch.clamp(x @ self.linear.weight.t() + self.linear.bias, min=0) * self.scale
'''

OTHER_WEIGHTS = SAME_WEIGHTS.replace("super().__init__()", "super().__init__()\n        torch.rand(7)")


def test_a_dropped_in_kernelbench_task_with_weights_runs_unchanged(tmp_path):
    """Model and ModelNew are built under the same seed, so the same layers get the same weights;
    a ModelNew that draws random numbers first gets other weights and is caught."""
    (tmp_path / "41_Linear_ReLU_Scale.py").write_text(KERNELBENCH_LEVEL2)
    task = tasks.discover(tmp_path, ["41_*"])[0]
    settings = EvalConfig(trials=3, timed_calls=5, timed_ms=0, warmup_calls=1, compile_baseline=False, timeout_s=120)
    bench = evaluate.prepare(task, "default", "cpu", settings)
    assert bench.expected[0]["shape"] == [16, 32]
    for code, verdict in ((SAME_WEIGHTS, Verdict.correct), (OTHER_WEIGHTS, Verdict.mismatch)):
        path = tmp_path / f"cand_{verdict.value}.py"
        path.write_text(code)
        result = evaluate.evaluate(bench, path, tmp_path / "build", settings)
        assert result.verdict is verdict, result.error
