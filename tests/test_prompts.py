"""Prompt rendering (prompts/one_shot.j2 through pipeline.generate.prompts) and the demo replay fixture."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from pipeline.generate.extract import extract
from pipeline.generate.prompts import PromptError, TaskFacts, example_paths, messages, render, task_facts
from pipeline.child.tasks import TaskFile, load_file

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "prompts"
TASKS_DIR = ROOT / "reference_tasks"
FIXTURE = ROOT / "fixtures" / "replay" / "demo.jsonl"
TASK_NAMES = ("mse", "cross_entropy", "huber", "cosine", "kl_div", "triplet", "hinge")


def _task(name: str = "cross_entropy"):
    return load_file(TASKS_DIR / f"{name}.py")


# --------------------------------------------------------------------------------------------
# rendering


@pytest.mark.parametrize("backend", ["cuda", "cpu"])
def test_render_holds_task_instruction_and_the_backends_example(backend):
    task = _task()
    text = render("one_shot.j2", task, backend, PROMPTS)
    model_src, new_src = (p.read_text() for p in example_paths(backend, PROMPTS))

    assert task.source.strip() in text
    assert "(cross_entropy)" in text
    assert model_src.strip() in text
    assert new_src.strip() in text
    assert text.index("Input architecture:") < text.index("Optimized with custom operators:")
    assert text.index(new_src.strip()) < text.index(task.source.strip())
    assert "Name your optimized output architecture ModelNew" in text
    assert "one final ```python code block" in text
    assert "NO testing code" in text
    assert "0-dim float32 tensor" in text and "(1,)" in text
    assert "int64" in text
    assert "torch.nn.functional" in text
    assert "{{" not in text and "{%" not in text


def test_render_cuda_asks_for_cuda_with_declarations_in_cpp_sources():
    text = render("one_shot.j2", _task("mse"), "cuda", PROMPTS)
    assert "custom CUDA kernels" in text
    assert "`cpp_sources` must declare the functions and `cuda_sources` define them" in text
    assert "C++ CPU" not in text
    assert "cuda_sources=" in text  # the CUDA example
    assert "fused_fma_example" in text


def test_render_cpu_asks_for_cpp_sources_only():
    text = render("one_shot.j2", _task("mse"), "cpu", PROMPTS)
    assert "custom C++ CPU kernels" in text
    assert "`cpp_sources` only" in text
    assert "cuda_sources=" not in text  # the CPU example builds from cpp_sources alone
    assert "fused_fma_cpu_example" in text
    assert "__global__" not in text


def test_render_every_reference_task_on_both_backends():
    for name in TASK_NAMES:
        for backend in ("cuda", "cpu"):
            text = render("one_shot.j2", _task(name), backend, PROMPTS)
            assert f"({name})" in text
            assert text.endswith("\n")


def test_examples_are_valid_python_with_model_and_modelnew():
    for backend in ("cuda", "cpu"):
        model_path, new_path = example_paths(backend, PROMPTS)
        model = ast.parse(model_path.read_text())
        new = ast.parse(new_path.read_text())
        assert {"Model", "get_inputs", "get_init_inputs"} <= _top_level_names(model)
        assert "ModelNew" in _top_level_names(new)
        assert "load_inline(" in new_path.read_text()
    assert "cuda_sources=" not in example_paths("cpu", PROMPTS)[1].read_text()
    assert "cuda_sources=" in example_paths("cuda", PROMPTS)[1].read_text()


def _top_level_names(tree: ast.Module) -> set[str]:
    return {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}


def test_missing_template_is_a_prompt_error(tmp_path):
    with pytest.raises(PromptError, match=r"prompt template 'nope.j2' not found in "):
        render("nope.j2", _task(), "cuda", PROMPTS)


def test_undefined_variable_raises_with_jinja_message(tmp_path):
    _examples(tmp_path)
    (tmp_path / "bad.j2").write_text("Task {{ task_name }} with {{ no_such_variable }}\n")
    with pytest.raises(PromptError, match="no_such_variable.*is undefined"):
        render("bad.j2", _task(), "cpu", tmp_path)


def test_undefined_attribute_raises_too(tmp_path):
    _examples(tmp_path)
    (tmp_path / "bad.j2").write_text("{{ backend.no_such_attribute }}\n")
    with pytest.raises(PromptError, match="no_such_attribute"):
        render("bad.j2", _task(), "cpu", tmp_path)


def test_template_syntax_error_is_a_prompt_error(tmp_path):
    _examples(tmp_path)
    (tmp_path / "broken.j2").write_text("{% if backend %}never closed\n")
    with pytest.raises(PromptError, match="broken.j2"):
        render("broken.j2", _task(), "cpu", tmp_path)


def test_custom_template_gets_all_variables_and_keeps_trailing_newline(tmp_path):
    _examples(tmp_path)
    (tmp_path / "t.j2").write_text(
        "{{ task_name }}|{{ backend }}|{{ example_model }}|{{ example_model_new }}|"
        "{{ task_source | length > 0 }}\n")
    text = render("t.j2", _task("huber"), "cuda", tmp_path)
    assert text == "huber|cuda|MODEL|NEW cuda|True\n"


def test_missing_example_is_a_prompt_error(tmp_path):
    (tmp_path / "t.j2").write_text("{{ task_name }}\n")
    with pytest.raises(PromptError, match="model.py"):
        render("t.j2", _task(), "cpu", tmp_path)


def test_unknown_backend_is_a_prompt_error():
    with pytest.raises(PromptError, match="unknown backend 'rocm'"):
        render("one_shot.j2", _task(), "rocm", PROMPTS)


def test_messages_is_one_user_turn():
    assert messages("hello") == [{"role": "user", "content": "hello"}]


def _examples(directory: Path) -> None:
    examples = directory / "examples"
    examples.mkdir(exist_ok=True)
    (examples / "model.py").write_text("MODEL")
    for backend in ("cuda", "cpu"):
        (examples / f"{backend}_model_new.py").write_text(f"NEW {backend}")


# --------------------------------------------------------------------------------------------
# the demo replay fixture


def _fixture() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_fixture_has_two_entries_per_task_and_backend():
    entries = _fixture()
    counts: dict[tuple[str, str], int] = {}
    for e in entries:
        assert set(e) == {"task", "backend", "text", "reasoning", "usage"}
        assert e["backend"] in ("cpu", "cuda")
        assert e["reasoning"] is None or isinstance(e["reasoning"], str)
        assert e["usage"]["prompt_tokens"] > 0 and e["usage"]["completion_tokens"] > 0
        counts[(e["task"], e["backend"])] = counts.get((e["task"], e["backend"]), 0) + 1
    assert counts == {(t, b): 2 for t in TASK_NAMES for b in ("cpu", "cuda")}


def test_fixture_texts_hold_a_final_python_block_with_modelnew():
    for e in _fixture():
        where = f"{e['task']}/{e['backend']}"
        assert "```python" in e["text"], where
        ex = extract(e["text"])
        assert ex.error is None, f"{where}: {ex.error}"
        code = ex.code
        assert "class ModelNew(nn.Module)" in code, where
        assert "load_inline(" in code, where
        assert "def get_inputs" not in code, where
        if e["backend"] == "cpu":
            assert "cuda_sources" not in code, where
        else:
            assert "cuda_sources=" in code, where
        if e["task"] == "triplet":
            assert "def __init__(self, margin=1.0)" in code, where


def test_fixture_load_inline_names_are_distinct():
    names = []
    for e in _fixture():
        code = extract(e["text"]).code
        tree = ast.parse(code)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "load_inline":
                names += [kw.value.value for kw in node.keywords if kw.arg == "name"]
    assert len(names) == len(_fixture())
    assert len(set(names)) == len(names)


def test_fixture_covers_the_extraction_quirks():
    entries = _fixture()
    texts = [e["text"] for e in entries]
    assert any(t.lstrip().startswith("<think>") and "</think>" in t for t in texts)
    assert any(t.rstrip().endswith("return self.cosine_ext.cosine_similarity_loss(predictions, targets)")
               for t in texts)  # the unclosed final fence
    assert sum("\n    ```python\n" in t for t in texts) >= 2  # indented final blocks
    assert any(e["reasoning"] for e in entries)


def test_fixture_is_what_the_generator_writes(monkeypatch):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("kgen_make_demo", FIXTURE.with_name("make_demo.py"))
    make_demo = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, make_demo)  # dataclasses look their module up
    spec.loader.exec_module(make_demo)
    texts = [e["text"] for e in make_demo.ordered()]
    assert texts == [e["text"] for e in _fixture()]


def test_replay_provider_serves_the_fixture_in_order():
    import asyncio

    from pipeline.config import ModelConfig
    from pipeline.generate.llm import ChatRequest, ReplayProvider

    provider = ReplayProvider(ModelConfig(name="demo", provider="replay", replay_file=str(FIXTURE)), ROOT)
    recorded = [e for e in _fixture() if e["task"] == "kl_div" and e["backend"] == "cuda"]

    async def ask(sample: int):
        return await provider.complete(ChatRequest(task="kl_div", backend="cuda",
                                                   messages=messages("x"), sample=sample))

    first, second = asyncio.run(ask(0)), asyncio.run(ask(1))
    assert first.error is None and second.error is None
    assert [first.text, second.text] == [e["text"] for e in recorded]
    assert first.reasoning == recorded[0]["reasoning"]


@pytest.mark.parametrize("backend", ["cuda", "cpu", "triton"])
def test_gradient_mode_prompt_shows_the_backward_example_and_asks_for_both_directions(backend):
    text = render("one_shot.j2", _task("huber"), backend, PROMPTS, grad=True)
    grad_example = example_paths(backend, PROMPTS, grad=True)[1].read_text()
    assert "autograd.Function" in grad_example and "def backward" in grad_example
    assert grad_example.strip() in text
    assert example_paths(backend, PROMPTS)[1].read_text().strip() not in text  # the forward-only one is not
    assert "Gradient mode" in text and "backward" in text and "upstream gradient" in text
    forward = render("one_shot.j2", _task("huber"), backend, PROMPTS)
    assert "Gradient mode" not in forward and "autograd.Function" not in forward


def test_bf16_prompt_asks_for_float32_accumulation_and_a_bf16_result():
    text = render("one_shot.j2", _task("mse"), "cuda", PROMPTS, dtype="bfloat16")
    assert "0-dim bfloat16 tensor" in text and "accumulate in float32" in text
    assert "accumulate in float32" not in render("one_shot.j2", _task("mse"), "cuda", PROMPTS)


def test_gradient_mode_without_an_example_for_the_backend_is_one_clear_error(tmp_path):
    shutil.copytree(PROMPTS, tmp_path / "p")
    (tmp_path / "p" / "examples" / "triton_model_new_grad.py").unlink()
    with pytest.raises(PromptError, match="triton_model_new_grad.py"):
        render("one_shot.j2", _task("huber"), "triton", tmp_path / "p", grad=True)


# --------------------------------------------------------------------------------------------
# notes chosen by what the task is (pipeline.generate.prompts.task_facts)

# KernelBench level-1 files as KernelBench writes them: no KGEN_SIZES, no KGEN_DOMAINS.
KERNELBENCH = {
    "gemm": ("A, B", "return torch.matmul(A, B)", "M = 1024\nK = 4096\nN = 2048\n",
             "[torch.randn(M, K), torch.randn(K, N)]", "[]"),
    "relu": ("x", "return torch.relu(x)", "batch_size = 4096\ndim = 16384\n", "[torch.randn(batch_size, dim)]", "[]"),
    "softmax": ("x", "return torch.softmax(x, dim=1)", "batch_size = 16\ndim = 16384\n",
                "[torch.randn(batch_size, dim)]", "[]"),
    "row_sum": ("x", "return torch.sum(x, dim=1, keepdim=True)", "batch_size = 16\ndim = 256\n",
                "[torch.randn(batch_size, dim)]", "[]"),
    "linear_gelu": ("x", "return torch.nn.functional.gelu(self.fc(x))", "batch_size = 128\nfeatures = 512\n",
                    "[torch.randn(batch_size, features)]", "[features]"),
    "conv": ("x", "return self.conv(x)", "batch_size = 4\nchannels = 3\n",
             "[torch.randn(batch_size, channels, 32, 32)]", "[channels]"),
    "gather_rows": ("table, idx", "return table[idx]", "rows = 1000\ndim = 64\nn = 4096\n",
                    "[torch.randn(rows, dim), torch.randint(0, rows, (n,))]", "[]"),
    "item": ("x", "return x * float(x.sum().item())", "n = 8\n", "[torch.randn(n)]", "[]"),
}
LAYERS = {"linear_gelu": "self.fc = nn.Linear(args[0], args[0])",
          "conv": "self.conv = nn.Conv2d(args[0], 8, 3)"}


def _kernelbench(directory: Path, name: str):
    args, body, sizes, inputs, init = KERNELBENCH[name]
    source = (f"import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
              f"    def __init__(self, *args):\n        super().__init__()\n"
              f"        {LAYERS.get(name, 'pass')}\n\n"
              f"    def forward(self, {args}):\n        {body}\n\n\n{sizes}\n\n"
              f"def get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return {init}\n")
    path = directory / f"{name}.py"
    path.write_text(source)
    return load_file(path)


def _notes(text: str) -> str:
    return text[text.index("Notes:"):]


# The loss tasks' hints; "int64" alone would match the Triton note on `tl.int64` offsets.
LOSS_HINTS = ("`torch.long`", "int64_t", "class indices", "reduction", "0-dim", "loss", "probabilities")


@pytest.mark.parametrize("backend", ["cuda", "triton", "cpu"])
def test_a_loss_with_int64_class_targets_gets_the_int64_and_reduction_hints(backend):
    notes = _notes(render("one_shot.j2", _task("cross_entropy"), backend, PROMPTS))
    assert "`targets` is int64 (`torch.long`): class indices in [0, num_classes)" in notes
    if backend == "triton":
        assert "`tl.load` gives int64 values" in notes and "int64_t" not in notes
    else:
        assert "Read it as `int64_t` (`data_ptr<int64_t>()`), never as `int`" in notes
    assert "0-dim float32 tensor" in notes and "numerically careful reduction" in notes
    assert "loss and reduction ops" in notes
    assert "`predictions` may be of any scale" in notes
    assert "matrix product" not in notes and "one pass over memory" not in notes


def test_a_loss_without_integer_inputs_gets_no_int64_hint():
    for name in ("mse", "huber", "cosine", "triplet", "hinge", "kl_div"):
        notes = _notes(render("one_shot.j2", _task(name), "cuda", PROMPTS))
        assert "int64" not in notes, name
        assert "0-dim float32 tensor" in notes and "numerically careful reduction" in notes, name


def test_probability_and_sign_inputs_are_named_by_their_domain():
    kl = _notes(render("one_shot.j2", _task("kl_div"), "cpu", PROMPTS))
    assert "`predictions` and `targets` hold probabilities: positive and summing to 1 along dimension -1" in kl
    assert "any scale" not in kl  # neither input is drawn at any scale
    hinge = _notes(render("one_shot.j2", _task("hinge"), "cpu", PROMPTS))
    assert "`targets` holds only -1 and +1" in hinge and "probabilities" not in hinge
    assert "probabilities" not in _notes(render("one_shot.j2", _task("mse"), "cpu", PROMPTS))


@pytest.mark.parametrize("backend", ["cuda", "triton", "cpu"])
def test_a_gemm_gets_the_matmul_hint_and_none_of_the_loss_hints(tmp_path, backend):
    notes = _notes(render("one_shot.j2", _kernelbench(tmp_path, "gemm"), backend, PROMPTS))
    for hint in LOSS_HINTS:
        assert hint not in notes, hint
    assert "This is a matrix product" in notes
    assert "Do not call torch.matmul, torch.mm, torch.bmm, the `@` operator" in notes
    assert "Return a tensor of exactly the reference's shape and dtype" in notes
    assert ("`tl.dot`" in notes) == (backend == "triton")
    assert ("shared memory" in notes) == (backend == "cuda")
    assert "{{" not in notes and "{%" not in notes


@pytest.mark.parametrize("backend", ["cuda", "triton", "cpu"])
def test_an_elementwise_task_gets_the_one_pass_hint_and_no_reduction_hint(tmp_path, backend):
    notes = _notes(render("one_shot.j2", _kernelbench(tmp_path, "relu"), backend, PROMPTS))
    for hint in LOSS_HINTS:
        assert hint not in notes, hint
    assert "one pass over memory" in notes and "matrix product" not in notes
    assert "the torch ops the reference uses" in notes
    # a KernelBench file declares no domains: its inputs run as drawn, so no claim about their scale
    assert "any scale" not in notes


def test_task_facts_say_what_each_task_is(tmp_path):
    facts = {name: task_facts(_kernelbench(tmp_path, name)) for name in KERNELBENCH}
    got = {name: (f.output, f.reduces, f.elementwise) for name, f in facts.items()}
    assert got == {"gemm": ("matmul", False, False), "relu": ("same_shape", False, True),
                   "softmax": ("same_shape", True, False), "row_sum": ("reduced", True, False),
                   "linear_gelu": ("matmul", False, False), "conv": ("convolution", False, False),
                   "gather_rows": ("other", False, False),
                   "item": ("unknown", False, False)}  # .item() has no value on the meta device
    assert [(i.name, i.dtype, i.domain) for i in facts["gather_rows"].inputs] == [
        ("table", "float32", "fixed"), ("idx", "int64", "fixed")]
    assert [(i.name, i.dtype) for i in facts["item"].inputs] == [("x", "float32")]
    for name in TASK_NAMES:
        f = task_facts(_task(name))
        assert (f.output, f.reduces) == ("scalar", True), name
        assert [i.integer for i in f.inputs] == [False, name == "cross_entropy"] + [False] * (name == "triplet")


def test_an_integer_input_without_a_declared_domain_still_gets_its_dtype_hint(tmp_path):
    notes = _notes(render("one_shot.j2", _kernelbench(tmp_path, "gather_rows"), "cuda", PROMPTS))
    assert "`idx` is int64 (`torch.long`). Read it as `int64_t`" in notes
    assert "class indices" not in notes and "reduction" not in notes


def test_a_task_the_meta_device_cannot_run_gets_only_the_neutral_notes(tmp_path):
    notes = _notes(render("one_shot.j2", _kernelbench(tmp_path, "item"), "cuda", PROMPTS))
    for hint in LOSS_HINTS + ("matrix product", "one pass over memory", "Return a tensor"):
        assert hint not in notes, hint
    assert "read every element" in notes and "Do not call torch.nn.functional" in notes
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nraise RuntimeError('no')\n")
    assert task_facts(load_file(broken)) == TaskFacts()  # the judge, not the prompt, says why


def test_the_evolve_prompt_gets_the_same_task_notes(tmp_path):
    from pipeline.generate.feedback import ParentView, render_evolve

    gemm = _kernelbench(tmp_path, "gemm")
    parents = [ParentView(code="class ModelNew: pass", time_ms=1.0)]
    text = render_evolve("evolve.j2", PROMPTS, gemm.name, gemm.source, "cuda", 1, parents)
    assert _notes(text) == _notes(render("one_shot.j2", gemm, "cuda", PROMPTS))
    loss = render_evolve("evolve.j2", PROMPTS, "cross_entropy", _task().source, "cpu", 1, parents)
    assert "`targets` is int64" in _notes(loss) and "matrix product" not in _notes(loss)


# KernelBench's rule by level: level 1 asks for the operator itself; at levels 2
# and 3 a convolution or GEMM may stay in PyTorch and the kernels fuse what surrounds it.

KB = ROOT / "tests" / "kernelbench" / "KernelBench"


def test_a_level_2_task_may_keep_its_gemm_in_pytorch_and_a_level_1_task_may_not():
    from pipeline.child.tasks import task_file
    from pipeline.generate.feedback import ParentView, render_evolve

    gemm = task_file(KB / "level2" / "12_Gemm_Multiply_LeakyReLU.py")
    relu = task_file(KB / "level1" / "19_ReLU.py")
    assert (gemm.level, relu.level) == (2, 1)
    for backend in ("cuda", "triton", "cpu"):
        level2 = _notes(render("one_shot.j2", gemm, backend, PROMPTS))
        assert "KernelBench level-2 task" in level2 and "keep its heaviest operators in PyTorch" in level2
        assert "flagged `no_custom_kernel`" in level2
        assert "Do not call" not in level2 and "tile it" not in level2  # no hand-written GEMM demanded
        level1 = _notes(render("one_shot.j2", relu, backend, PROMPTS))
        assert "Do not call torch.nn.functional" in level1 and "KernelBench level" not in level1
    assert "cuBLAS" in _notes(render("one_shot.j2", gemm, "cuda", PROMPTS))
    assert "MKL" in _notes(render("one_shot.j2", gemm, "cpu", PROMPTS))
    # The same source outside a levelN/ folder (a bundled or user task: no level) keeps the strict rule.
    loose = TaskFile(gemm.name, Path("elsewhere") / gemm.path.name, gemm.source)
    strict = _notes(render("one_shot.j2", loose, "cuda", PROMPTS))
    assert loose.level is None and "Do not call torch.matmul" in strict and "KernelBench level" not in strict
    # An evolve prompt carries the task's level too (and none when not given).
    parents = [ParentView(code="class ModelNew: pass", time_ms=1.0)]
    evolved = render_evolve("evolve.j2", PROMPTS, gemm.name, gemm.source, "cuda", 1, parents, level=gemm.level)
    assert "KernelBench level-2 task" in evolved
    assert "Do not call torch.matmul" in render_evolve("evolve.j2", PROMPTS, gemm.name, gemm.source, "cuda", 1, parents)


def test_a_level_3_task_may_keep_its_convolution():
    source = (KB / "level2" / "12_Gemm_Multiply_LeakyReLU.py").read_text()
    net = TaskFile("1_Net", Path("KernelBench/level3/1_Net.py"), source, level=3, problem=1)
    notes = _notes(render("one_shot.j2", net, "cuda", PROMPTS))
    assert "KernelBench level-3 task" in notes and "a convolution in cuDNN" in notes
