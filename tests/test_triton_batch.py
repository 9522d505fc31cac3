"""The Triton throughput batch: fixtures/replay/batch_triton.jsonl holds 7 tasks x 8
samples of honest Triton kernels, one text per sample, written by fixtures/replay/make_batch.py and
run by examples/config-batch-triton.yaml. These checks read the file only; the kernels themselves are judged
by `kgen eval --backend triton`: on Triton's interpreter one base kernel at the small size takes
about 27 s even with the fewest trials and timed calls (mse, check_shapes off), past what one CI
test may cost, so none is judged here (tests/test_triton.py judges a Triton kernel at the odd size)."""

from __future__ import annotations

import ast
import asyncio
import collections
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from pipeline import backends
from pipeline.config import load_config
from pipeline.generate.extract import extract
from pipeline.generate.llm import ChatRequest, ReplayProvider

ROOT = Path(__file__).resolve().parent.parent
REPLAY = ROOT / "fixtures" / "replay"
TASKS = sorted(p.stem for p in (ROOT / "reference_tasks").glob("*.py"))


def _make_batch():
    spec = importlib.util.spec_from_file_location("kgen_fixture_make_batch", REPLAY / "make_batch.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while being defined
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def entries() -> list[dict]:
    return [json.loads(line) for line in (REPLAY / "batch_triton.jsonl").read_text(encoding="utf-8").splitlines()]


def test_seven_tasks_times_eight_distinct_triton_completions(entries):
    assert len(entries) == 56
    assert {e["backend"] for e in entries} == {"triton"}
    assert collections.Counter(e["task"] for e in entries) == {task: 8 for task in TASKS}
    assert len({e["text"] for e in entries}) == 56  # no two samples build the same code


def test_each_completion_extracts_to_triton_kernels_and_a_modelnew(entries):
    blocks = collections.defaultdict(list)
    for e in entries:
        ex = extract(e["text"])
        assert ex.error is None, (e["task"], ex.error)
        code = ex.code
        tree = ast.parse(code)
        assert "@triton.jit" in code and "load_inline" not in code, e["task"]
        assert "ModelNew" in {n.name for n in tree.body if isinstance(n, ast.ClassDef)}, e["task"]
        kernels = backends.triton_kernels(code)
        assert len(kernels) == 2 and "finish_kernel" in kernels, kernels  # partial sums, then the final sum
        assert "tl.sum(" in code and "mask=" in code, e["task"]
        blocks[e["task"]].append(int(re.search(r"^BLOCK = (\d+)  #", code, re.MULTILINE).group(1)))
    # Sample i of every task gets the i-th block size, each a power of two (tl.arange needs one).
    sizes = list(_make_batch().TRITON_BLOCK_SIZES)
    assert all(b & (b - 1) == 0 for b in sizes) and len(set(sizes)) == 8
    assert dict(blocks) == {task: sizes for task in TASKS}


def test_cross_entropy_reads_its_targets_as_int64(entries):
    code = extract(next(e for e in entries if e["task"] == "cross_entropy")["text"]).code
    assert "targets.dtype == torch.int64" in code and "int32" not in code


def test_make_batch_writes_exactly_the_checked_in_files():
    """Both fixtures are the generator's output, byte for byte (the CUDA one unchanged by the
    Triton half); nothing is written here."""
    make_batch = _make_batch()
    for path, rows in ((make_batch.OUT, make_batch.variants()), (make_batch.TRITON_OUT, make_batch.triton_variants())):
        text = "\n".join(json.dumps(v, ensure_ascii=False) for v in rows) + "\n"
        assert text == path.read_text(encoding="utf-8"), path.name


def test_the_triton_batch_config_replays_one_distinct_kernel_per_sample(entries):
    cfg = load_config(ROOT / "examples" / "config-batch-triton.yaml")
    assert cfg.backend == "triton" and cfg.samples == 8 and cfg.tasks.size == "default"
    assert cfg.path(cfg.database).resolve() == ROOT / "db" / "h100-triton.db"
    provider = ReplayProvider(cfg.models[0], cfg.base_dir)

    async def answers() -> list[str]:
        requests = [ChatRequest(task=task, backend="triton", messages=[{"role": "user", "content": "x"}], sample=i)
                    for task in TASKS for i in range(cfg.samples)]
        return [(await provider.complete(r)).text for r in requests]

    texts = asyncio.run(answers())
    assert len(set(texts)) == 56 and set(texts) == {e["text"] for e in entries}
