"""The reference process's own state across attempts (pipeline.judge.reference.Reference), on the cpu:
what it keeps from one attempt to the next, and that what it keeps computes what a fresh one would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import numpy as np
import torch

from pipeline.child import tasks
from pipeline.judge import refproto as R
from pipeline.judge.compiling import stateless as _stateless
from pipeline.judge.reference import Reference, _as64, _parts

ROOT = Path(__file__).resolve().parent.parent
WEIGHTED = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return self.linear(x)


batch_size = 8
features = 16


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
'''
DRAWN = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """No weights, but a constant drawn at construction: a new init seed is another computation."""

    def __init__(self):
        super().__init__()
        self.scale = float(torch.rand(()))

    def forward(self, x):
        return x * self.scale


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
'''


def _reference(path: Path) -> Reference:
    return Reference(R.Start(task_path=str(path), device="cpu"))


def test_a_model_without_weights_and_its_compile_are_kept_across_attempts():
    """A loss has no weights: every attempt's fresh instance computes the same thing, so the first
    instance and its torch.compile serve the next attempts (each compiled anew cost 0.2-0.3 s of an
    attempt on the H200) and survive `release`. torch.compile is lazy: nothing is compiled here."""
    ref = _reference(ROOT / "reference_tasks" / "mse.py")
    key = json.dumps("small")
    _, first, _ = ref.models_for("small", 1)
    compiled = ref.compiled_for(key, first)
    ref.release()
    _, again, _ = ref.models_for("small", 2)  # the next attempt's init seed
    assert again is first and ref.compiled_for(key, again) is compiled
    assert ref.warmed == set()  # its first block there still has the attempt's warm-up calls


def test_a_model_with_weights_or_a_drawn_constant_is_built_anew_per_attempt(tmp_path):
    """Weights, or a constant drawn at construction, differ with the init seed: nothing is kept, and
    each attempt's compile wraps its own instance."""
    for name, text in (("weighted", WEIGHTED), ("drawn", DRAWN)):
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        ref = _reference(path)
        key = json.dumps("default")
        _, first, _ = ref.models_for("default", 1)
        compiled = ref.compiled_for(key, first)
        _, second, _ = ref.models_for("default", 2)
        assert second is not first and ref.compiled_for(key, second) is not compiled, name
        assert (_stateless(first) is None) == (name == "weighted")
        if name == "drawn":
            assert _stateless(first) != _stateless(second)


def _values(meta: dict) -> np.ndarray:
    fd = meta.pop("values_fd")
    try:
        return np.frombuffer(os.pread(fd, os.fstat(fd).st_size, 0), dtype=np.float64)
    finally:
        os.close(fd)


def test_expected_values_are_the_float64_forward_whether_the_inputs_are_kept_or_drawn_again():
    """mse's float inputs were all copied into float64, so they stay while the float64 forward runs;
    cross_entropy's int64 targets are shared with it, so its inputs are drawn again afterwards. Either
    way the values are the float64 forward of the call's inputs, and the error report is PyTorch's
    float32 run against them."""
    for name, kept in (("mse", True), ("cross_entropy", False)):
        ref = _reference(ROOT / "reference_tasks" / f"{name}.py")
        module, m32, m64 = ref.models_for("small", 3)
        inputs = tasks.make_inputs(module, 11, "heavy", "cpu")
        assert ref._room(inputs, _as64(inputs)) is kept, name
        meta = ref.expected("small", 3, 11, "heavy")
        with torch.no_grad():
            want = _parts(m64(*_as64(tasks.make_inputs(module, 11, "heavy", "cpu"))))[0]
            own = _parts(m32(*tasks.make_inputs(module, 11, "heavy", "cpu")))[0]
        got = _values(meta)
        assert np.array_equal(got, want.double().reshape(-1).numpy()), name
        assert meta["fp32_rel_err"] == float((own.double() - want).abs().max() / want.abs().max()), name


UNCOMPILABLE = '''
import torch
import torch._inductor.config
import torch.nn as nn

torch._inductor.config.cpp.cxx = ("/nonexistent/c++",)  # inductor's C++ cannot build here


class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 2


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''


def test_a_torch_compile_that_failed_is_not_kept_for_the_next_attempt(tmp_path):
    """A weightless model whose torch.compile fails (its C++ cannot build): the baseline reports the
    failure, and the kept model holds no compile of it, so the next attempt compiles anew as it did
    before compiles were kept; kept, a failure once would have been every attempt's."""
    path = tmp_path / "uncompilable.py"
    path.write_text(UNCOMPILABLE)
    ref = Reference(R.Start(task_path=str(path), device="cpu"))
    sent = []
    ref.baselines(R.MeasureBaselines(size="default", init_seed=1, baseline_seeds=[1, 2, 3, 4], warmup=1, timed_ms=1,
                                     timed_calls=4, max_timed_calls=4, compile_baseline=True), sent.append)
    assert sent[0].baselines.compile_error and sent[0].baselines.compiled is None, sent[0]
    key = json.dumps("default")
    assert ref.kept[key].compiled is None and key not in ref.compiled
    _, m32, _ = ref.models_for("default", 2)
    assert m32 is ref.kept[key].model  # the model itself is still kept: only its compile is gone


def test_a_paired_estimate_s_note_names_each_term_it_was_made_of():
    """The stored note of a replayed bound (beside.paired_terms): the child's calibration median and
    the reference's null median, then each request's window and its null, which is what the next GPU
    call needs to tell which term moved where the estimates scattered."""
    from pipeline.judge import clocks
    from pipeline.judge.beside import paired_terms

    calibration = [clocks.Window(2.0, 512), clocks.Window(2.4, 512), clocks.Window(9.0, 512)]
    windows = [clocks.Window(5.0, 512), clocks.Window(6.5, 512)]
    note = paired_terms(calibration, [1.0, 1.2, None], windows, [1.5, 1.25])
    assert note == (" (calibration 2.400 ms over 3, the reference's null 1.100 ms over 2, offset 1.100 ms over "
                    "the pairs; window/null 5.000/1.500, 6.500/1.250)")
    per_call = clocks.paired_per_call(calibration, [1.0, 1.2, None], windows, [1.5, 1.25])
    assert per_call == [pytest.approx((5.0 - (1.1 + 1.5)) / 512), pytest.approx((6.5 - (1.1 + 1.25)) / 512)]


def test_the_two_sides_of_a_pair_see_one_draw_per_call_and_a_fresh_one_each_call():
    """timing.time_sides as the reference's paired block uses it (eager then torch.compile on each
    set once drawn): both callables see the very same values in a call, no two calls see the same
    values, and the set list is the one the block holds (tasks.redraw_inputs drops, then draws)."""
    from pipeline.child.timing import Clock, time_sides

    module = tasks.load_module(tasks.load_file(ROOT / "reference_tasks" / "mse.py"), "small", "float32")
    sets = tasks.block_sets(module, tasks.make_inputs(module, 1, "base", "cpu"), "cpu")
    held = [id(s) for s in sets]
    seen: dict[str, list[float]] = {"a": [], "b": []}

    def side(name):
        return lambda x: seen[name].append(float(x[0].reshape(-1)[0]))

    seeds = list(range(100, 106))  # six calls: a second block of two
    times = time_sides(Clock("cpu"), [side("a"), side("b")], sets, len(seeds), lambda i, n: seeds[i:i + n],
                       lambda x, seed: tasks.redraw_inputs(x, module, seed, "cpu"))
    assert [len(t) for t in times] == [6, 6] and all(t > 0 for t in times[0] + times[1])
    assert seen["a"] == seen["b"]
    assert len(set(seen["a"])) == 6
    want = [float(tasks.make_inputs(module, s, "base", "cpu")[0].reshape(-1)[0]) for s in seeds]
    assert seen["a"] == want
    assert [id(s) for s in sets] == held


def test_a_paired_block_whose_torch_compile_fails_is_timed_eager_alone(tmp_path):
    """The reference process itself (its `time_block` op with `pair`): where torch.compile fails
    beside eager, the block comes back with eager's times, no compiled ones and the compile's
    error, not as a failed block; a compilable model gets both sides, call for call."""
    from pipeline.config import EvalConfig
    from pipeline.judge.bench import open_bench

    settings = EvalConfig(compile_baseline=True, trials=2, timed_calls=4, timed_ms=0, warmup_calls=1, timeout_s=120,
                          profile=False)
    for name, text, compiles in (("uncompilable", UNCOMPILABLE, False), ("mse", None, True)):
        path = tmp_path / f"{name}.py"
        path.write_text(text if text else (ROOT / "reference_tasks" / "mse.py").read_text())
        bench = open_bench(tasks.load_file(path), "small" if compiles else "default", "cpu", settings)
        try:
            for first in (True, False):
                msgs = bench.request(R.TimeBlock(size=bench.size, init_seed=3, seeds=[11, 12, 13, 14, 15], pair=True,
                                                 warmup=1 if first else 0), 120)
                blocks = [m for m in msgs if isinstance(m, R.Block)]
                assert len(blocks) == 1 == len(msgs), msgs  # a Block, never a failed one
                assert len(blocks[0].times_ms) == 5 and min(blocks[0].times_ms) > 0
                if compiles:
                    assert len(blocks[0].compiled_ms) == 5 and min(blocks[0].compiled_ms) > 0
                    assert not blocks[0].compile_error
                else:
                    assert blocks[0].compiled_ms is None and blocks[0].compile_error, blocks[0]
        finally:
            bench.close()


def test_the_reference_module_pays_the_flop_counter_s_first_use_where_it_is_imported():
    """The compute floor counts a call's flops with FlopCounterMode, whose first use imports torch._dynamo
    and some 800 modules (about a second here). The reference's zygote imports pipeline.judge.reference
    once; every task's reference is forked from it and counts at once."""
    probe = ("import sys, time, torch; import pipeline.judge.reference; from pipeline.child.timing import flop_count; "
             "t = time.perf_counter(); n = flop_count(lambda: torch.nn.functional.linear(torch.ones(8, 64), torch.ones(32, 64))); "
             "print('torch._dynamo' in sys.modules, n, time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    imported, flops, seconds = out.stdout.split()
    assert imported == "True" and int(flops) == 2 * 8 * 64 * 32
    assert float(seconds) < 0.3, seconds  # the first use cost 0.95-1.45 s on this box
