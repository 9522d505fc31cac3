"""The triton backend without a GPU: prompts, extraction and whole verdicts, the kernels run by
Triton's interpreter on the CPU (TRITON_INTERPRET=1, set by kgen in the candidate's child only).
On a GPU machine the same candidates are compiled by Triton's JIT and judged on the device."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pipeline import backends
from pipeline.build import build
from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.generate import prompts
from pipeline.child import tasks
from pipeline.child.profiling import torch_kernel
from pipeline.cli.main import main
from pipeline.config import EvalConfig
from pipeline.records import Flag, Verdict

from forgers import no_figure

ROOT = Path(__file__).resolve().parent.parent
needs_triton = pytest.mark.skipif(not backends.triton_present(), reason="triton is not installed")
SETTINGS = EvalConfig(trials=2, timed_calls=3, max_timed_calls=3, timed_ms=0, warmup_calls=1,
                      compile_baseline=False, check_shapes=False, timeout_s=240)

KERNELS = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def {name}(p_ptr, t_ptr, part_ptr, n, STEP: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK * STEP + tl.arange(0, BLOCK) * STEP
    mask = {mask}
    p = tl.load(p_ptr + offsets, mask=mask, other=0.0)
    t = tl.load(t_ptr + offsets, mask=mask, other=0.0)
    d = p - t
    tl.store(part_ptr + pid, tl.sum(d * d, axis=0) * STEP)


@triton.jit
def finish(part_ptr, out_ptr, parts, n, BLOCK: tl.constexpr):
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, parts, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        total += tl.load(part_ptr + offsets, mask=offsets < parts, other=0.0)
    tl.store(out_ptr, tl.sum(total, axis=0) / n)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        p, t = predictions.contiguous(), targets.contiguous()
        n = p.numel()
        BLOCK, STEP = 8192, {step}
        parts = triton.cdiv({launch}, BLOCK * STEP)
        part = torch.empty(parts, device=p.device, dtype=torch.float32)
        out = torch.empty((), device=p.device, dtype=torch.float32)
        {name}[(parts,)](p, t, part, {launch}, STEP=STEP, BLOCK=BLOCK)
        finish[(1,)](part, out, parts, n, BLOCK=1024)
        {tail}
'''

CANDIDATES = {
    # name: (kernel name, mask, step, tail, what the evaluator must conclude); the kernel reads n elements
    "honest": ("sq_err", "offsets < n", 1, "return out", {Verdict.correct}),
    # Named like inductor's kernels: still the candidate's own (it defines it).
    "honest_named_like_torch": ("triton_sq_err", "offsets < n", 1, "return out", {Verdict.correct}),
    "partial_read": ("sq_err", "offsets < n", 16, "return out", {Verdict.mismatch}),
    # Off by a block: the last block is masked off, 8% of the input never read.
    "wrong_mask": ("sq_err", "offsets < n - BLOCK", 1, "return out", {Verdict.mismatch}),
    # Launches its kernel on one block, then returns PyTorch's answer.
    "falls_back": ("sq_err", "offsets < n", 1, "return torch.mean((predictions - targets) ** 2)",
                   {Verdict.correct}),
}


def candidate(name: str) -> str:
    kernel, mask, step, tail, _ = CANDIDATES[name]
    launch = "min(n, BLOCK)" if name == "falls_back" else "n"
    return KERNELS.format(name=kernel, mask=mask, step=step, tail=tail, launch=launch)


def _write(tmp: Path, name: str) -> tuple[Path, str]:
    code = candidate(name)
    code_hash = hashlib.sha256(code.encode()).hexdigest()[:16]
    path = tmp / f"{code_hash}.py"
    path.write_text(code)
    return path, code_hash


@pytest.fixture(scope="module")
def bench():
    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    bench = prepare(task, "odd", "triton", SETTINGS)  # 97 x 1023: the interpreter is slow
    yield bench
    bench.close()


def test_the_prompt_shows_a_worked_triton_example_and_its_rules():
    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    text = prompts.render("one_shot.j2", task, "triton", ROOT / "prompts")
    assert "custom Triton kernels" in text and "@triton.jit" in text and "fma_kernel[grid]" in text
    assert "load_inline" not in text.split("You are given")[1].split("Notes:")[0]
    assert "no `load_inline`" in text and "Mask every load and store" in text


def test_the_parent_reads_the_candidates_own_kernel_names():
    assert backends.triton_kernels(candidate("honest_named_like_torch")) == ["triton_sq_err", "finish"]
    assert backends.triton_kernels("def broken(:") == []
    # Inductor's kernels count as PyTorch's; one the candidate defines never does.
    assert torch_kernel("triton_poi_fused_sub_0", []) and not torch_kernel("triton_sq_err", ["triton_sq_err"])
    assert not torch_kernel("sq_err", ["sq_err"]) and torch_kernel("void at::native::reduce_kernel<512>", ["sq_err"])


@needs_triton
@pytest.mark.parametrize("name", list(CANDIDATES))
def test_triton_redteam_on_the_interpreter(name, bench, tmp_path):
    path, code_hash = _write(tmp_path, name)
    built = build.build(path, code_hash, tmp_path / "builds", build.BuildOptions(timeout_s=120))
    assert built.ok, built.log[-2000:]
    result = evaluate.evaluate(bench, path, Path(built.build_dir), SETTINGS)
    print(f"\nTRITON {name}: {result.verdict.value} flags={[f.value for f in result.flags]} error={result.error}")
    assert result.verdict in CANDIDATES[name][4], result.error
    if name.startswith("honest"):
        assert Flag.no_custom_kernel not in result.flags and (no_figure(result) or result.time_ms > 0)
    if name == "falls_back":
        assert Flag.no_custom_kernel in result.flags


@needs_triton
@pytest.mark.skipif(backends.gpu_present(), reason="with a GPU, Triton compiles instead")
def test_the_interpreter_is_set_for_the_child_only(bench, tmp_path):
    """TRITON_INTERPRET reaches the candidate's child, never this process or a build."""
    import os

    assert "TRITON_INTERPRET" not in os.environ
    code = candidate("honest").replace("        {tail}", "").replace(
        "return out", "assert os.environ.get('TRITON_INTERPRET') == '1'\n        return out")
    code = "import os\n" + code
    path = tmp_path / "env.py"
    path.write_text(code)
    built = build.build(path, "env-check", tmp_path / "builds", build.BuildOptions(timeout_s=120, reuse=False))
    result = evaluate.evaluate(bench, path, Path(built.build_dir), SETTINGS)
    assert result.verdict is Verdict.correct, result.error


@needs_triton
def test_kgen_eval_judges_a_triton_file(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "models": [{"name": "none", "provider": "replay", "replay_file": str(tmp_path / "none.jsonl")}],
        "tasks": {"names": ["mse"], "size": "small", "directory": str(ROOT / "reference_tasks")},
        "prompts_dir": str(ROOT / "prompts"), "backend": "triton",
        "evaluation": SETTINGS.model_dump(include={"trials", "timed_calls", "max_timed_calls", "timed_ms",
                                                   "warmup_calls", "compile_baseline", "check_shapes",
                                                   "timeout_s"})}))
    (tmp_path / "none.jsonl").write_text("")
    code = tmp_path / "mine.py"
    code.write_text(candidate("honest"))
    result = CliRunner().invoke(main, ["eval", str(code), "--task", "mse", "--backend", "triton", "--size", "odd",
                                       "-c", str(config), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["verdict"] == "correct" and "no_custom_kernel" not in out["flags"], out


@needs_triton
def test_kgen_run_on_the_triton_backend(tmp_path):
    """The whole path: the triton prompt goes to the model, the code is extracted from the answer,
    built (imported), judged on the interpreter and stored under backend triton."""
    import asyncio

    from pipeline.config import load_config
    from pipeline.run.batch import Runner
    from pipeline.store.store import Store

    answers = {"honest": candidate("honest"), "partial_read": candidate("partial_read")}
    replay = tmp_path / "replay.jsonl"
    replay.write_text("".join(json.dumps({"task": "mse", "backend": "triton",
                                          "text": f"A Triton kernel:\n```python\n{code}```\n"}) + "\n"
                              for code in answers.values()))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "models": [{"name": "recorded", "provider": "replay", "replay_file": str(replay)}],
        "tasks": {"names": ["mse"], "size": "odd", "directory": str(ROOT / "reference_tasks")},
        "prompts_dir": str(ROOT / "prompts"), "samples": 2, "backend": "auto", "auto_backends": ["triton", "cpu"],
        "evaluation": SETTINGS.model_dump(include={"trials", "timed_calls", "max_timed_calls", "timed_ms",
                                                   "warmup_calls", "compile_baseline", "check_shapes",
                                                   "timeout_s"})}))
    cfg = load_config(config)
    store = Store.open(cfg.path(cfg.database))
    runner = Runner(cfg, store)
    # auto takes triton only where a GPU is visible; on the CPU it falls to cpu. Ask for triton.
    assert runner.backend == ("triton" if backends.gpu_present() else "cpu")
    runner = Runner(cfg, store, backend="triton")
    run_id = asyncio.run(runner.run())
    rows = sorted(store.attempts(run=run_id), key=lambda a: a["sample"])
    assert [(a["backend"], a["verdict"]) for a in rows] == [("triton", "correct"), ("triton", "mismatch")]
    sent = json.loads(store.attempt(rows[0]["id"])["messages_json"])
    assert "custom Triton kernels" in sent[-1]["content"]


def test_triton_builds_precompile_no_torch_headers():
    """A Triton candidate compiles no C++: its builds never wait for kgen's precompiled headers (on
    the H100 a Triton batch spent its first 34 s making them), while cuda and cpu builds still use them."""
    from pipeline.run.executor import LocalExecutor

    assert LocalExecutor("triton").fast["fast"] is False
    assert LocalExecutor("cpu").fast["fast"] is True
    assert LocalExecutor("cpu", fast_builds=False).fast["fast"] is False
