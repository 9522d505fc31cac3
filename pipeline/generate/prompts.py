"""Prompts: a jinja2 template per strategy in prompts/, rendered for one task and backend.

    text = render("one_shot.j2", task, "cuda", Path("prompts"))
    request_messages = messages(text)

The template gets `task_name`, `task_source` (the reference file's full text), `backend`
("cuda", "triton" or "cpu") and the worked example for that backend, `example_model` and
`example_model_new`, read from prompts/examples/model.py and {backend}_model_new.py (in gradient
mode {backend}_model_new_grad.py, a torch.autograd.Function with kernels both ways), `grad` and
`dtype` (the run's evaluation mode), `level` (the task's KernelBench level, None for other tasks:
at levels 2 and 3 a convolution or GEMM may stay in PyTorch, as KernelBench allows, and the kernels
fuse what surrounds it; level 1 and every other task ask for the operator itself), and `facts`: what
the task is (`task_facts`), so that the
notes fit it: the int64 hint only where an input is integer, the probabilities hint only for simplex
inputs, the reduction hints only where the reference reduces, a matmul or elementwise hint where it
is one of those. `render_file` derives `facts` too wherever it is given a `task_source` (evolve.j2
includes the same notes), and `level` (None unless given).
Rendering is strict: a variable the template names but is not given is an error, never an
empty string in a prompt sent to a model.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any, Literal

import torch
from jinja2 import (Environment, FileSystemLoader, StrictUndefined, Template, TemplateNotFound,
                    TemplateSyntaxError, UndefinedError)
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.backends import BACKENDS
from pipeline.child import sizes, tasks
from pipeline.child.tasks import TaskFile
from pipeline.records import Record

EXAMPLES_DIR = "examples"


class PromptError(ValueError):
    """A prompt that cannot be rendered; the message names the template or file."""


def example_paths(backend: str, prompts_dir: Path, grad: bool = False) -> tuple[Path, Path]:
    """The worked example for a backend: (reference model, its optimized ModelNew). Both backends
    start from the same reference model; only the optimized version differs."""
    examples = Path(prompts_dir) / EXAMPLES_DIR
    return examples / "model.py", examples / f"{backend}_model_new{'_grad' if grad else ''}.py"


def _environment(prompts_dir: Path) -> Environment:
    """Strict: a variable a template names but is not given is an error, never an empty string."""
    return Environment(loader=FileSystemLoader(prompts_dir), undefined=StrictUndefined,
                       keep_trailing_newline=True)


def render(template: str, task: TaskFile, backend: str, prompts_dir: Path, grad: bool = False,
           dtype: str = "float32") -> str:
    """The prompt text for `task` on `backend` from the template file `template` in `prompts_dir`,
    for the run's evaluation mode (gradient mode, dtype)."""
    prompts_dir = Path(prompts_dir)
    if backend not in BACKENDS:
        raise PromptError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    tmpl = load(template, prompts_dir)
    examples = []
    for path in example_paths(backend, prompts_dir, grad):
        if not path.is_file():
            raise PromptError(f"prompt example {path.name!r} not found in {path.parent}")
        examples.append(path.read_text())
    return fill(tmpl, template, task_name=task.name, task_source=task.source, backend=backend,
                example_model=examples[0], example_model_new=examples[1], grad=grad, dtype=dtype,
                facts=task_facts(task), level=task.level)


def render_file(template: str, prompts_dir: Path, **context: Any) -> str:
    """Any template in `prompts_dir` (the feedback and evolve ones too) with `context`, strictly.
    Given a `task_source` and no `facts`, the facts are derived from that source, as `render` does."""
    if "task_source" in context and "facts" not in context:
        name = str(context.get("task_name") or "task")
        context["facts"] = task_facts(TaskFile(name, Path(f"{name}.py"), context["task_source"]))
    if "task_source" in context:
        context.setdefault("level", None)
    return fill(load(template, Path(prompts_dir)), template, **context)


def load(template: str, prompts_dir: Path) -> Template:
    try:
        return _environment(prompts_dir).get_template(template)
    except TemplateNotFound:
        raise PromptError(f"prompt template {template!r} not found in {prompts_dir}") from None
    except TemplateSyntaxError as exc:
        raise PromptError(f"prompt template {template!r} line {exc.lineno}: {exc.message}") from None


def fill(tmpl: Template, template: str, **context: Any) -> str:
    try:
        return tmpl.render(**context)
    except UndefinedError as exc:
        raise PromptError(f"prompt template {template!r}: {exc.message}") from None
    except TemplateSyntaxError as exc:  # an {% include %} of a broken file surfaces at render time
        raise PromptError(f"prompt template {exc.name or template!r} line {exc.lineno}: "
                          f"{exc.message}") from None


def messages(text: str) -> list[dict[str, str]]:
    """The chat messages for one prompt: a single user turn."""
    return [{"role": "user", "content": text}]


# --------------------------------------------------------------------------------------------
# what the task is: the facts the notes are chosen by

# aten ops (overload packet names, as a dispatch mode sees them after decomposition) by what they do.
# A matrix-vector product or a dot product reduces along K with no reuse to tile for: a reduction.
MATMUL_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "_scaled_mm"})
CONVOLUTION_OPS = frozenset({"convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution",
                             "convolution_overrideable", "_slow_conv2d_forward", "slow_conv3d_forward"})
REDUCTION_OPS = frozenset({
    "sum", "nansum", "mean", "nanmean", "prod", "amax", "amin", "aminmax", "logsumexp", "_softmax",
    "_log_softmax", "linalg_vector_norm", "norm", "var", "std", "var_mean", "std_mean", "argmax", "argmin",
    "any", "all", "count_nonzero", "cumsum", "cumprod", "logcumsumexp", "cummax", "cummin", "median",
    "nanmedian", "mode", "kthvalue", "topk", "nll_loss_forward", "nll_loss2d_forward", "mse_loss",
    "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "soft_margin_loss",
    "multi_margin_loss", "multilabel_margin_loss_forward", "native_layer_norm", "native_batch_norm",
    "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "native_group_norm",
    "_fused_rms_norm", "cosine_similarity", "mv", "addmv", "dot", "vdot"})
# max and min are reductions without a second tensor (max.default, max.dim), elementwise with one.
REDUCTION_OVERLOADS = {"max": {"default", "dim", "names_dim"}, "min": {"default", "dim", "names_dim"}}

Output = Literal["scalar", "reduced", "same_shape", "matmul", "convolution", "other", "unknown"]


class InputFacts(Record):
    """One input of the reference's forward, as get_inputs() makes it."""

    name: str
    """The forward argument it is passed as (`input 2` where the signature does not say)."""
    dtype: str | None
    """Its torch dtype without the `torch.` prefix (`float32`, `int64`); None for a non-tensor."""
    domain: str
    """Its KGEN_DOMAINS entry (`real`, `positive`, `simplex:-1`, `index:num_classes`, `sign`), or
    `fixed` where the task declares none (a KernelBench file: its values as the file draws them)."""

    @property
    def kind(self) -> str:
        """The domain without its argument: `index` for `index:num_classes`."""
        return self.domain.partition(":")[0]

    @property
    def arg(self) -> str:
        """The domain's argument: `num_classes` for `index:num_classes`, `-1` for `simplex:-1`."""
        return self.domain.partition(":")[2]

    @property
    def integer(self) -> bool:
        return self.dtype is not None and self.dtype in INTEGER_DTYPES

    @property
    def c_type(self) -> str:
        """The C++ type a kernel reads it as (`int64_t` for int64)."""
        return INTEGER_DTYPES.get(self.dtype or "", "float")


INTEGER_DTYPES = {"int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
                  "uint8": "uint8_t", "bool": "bool"}


class TaskFacts(Record):
    """What a task is, found by running its reference once on the meta device (nothing allocated,
    at the file's own size): what the notes of a prompt are chosen by."""

    inputs: list[InputFacts] = []
    """The inputs of forward, in order; empty where get_inputs() cannot run on the meta device."""
    output: Output = "unknown"
    """What forward computes: `scalar` (a 0-dim result, e.g. a mean loss), `reduced` (fewer values
    than its largest input, by a reduction), `same_shape` (an input's shape), `matmul` (a matrix
    product: mm, bmm, a linear layer), `convolution`, `other`, or `unknown` where the meta device
    cannot run it."""
    reduces: bool = False
    """Forward reduces over some dimension (sum, mean, softmax, a norm, a loss), even where the
    output keeps an input's shape (softmax)."""

    @property
    def integer_inputs(self) -> list[InputFacts]:
        return [i for i in self.inputs if i.integer]

    @property
    def simplex_inputs(self) -> list[InputFacts]:
        return [i for i in self.inputs if i.kind == "simplex"]

    @property
    def positive_inputs(self) -> list[InputFacts]:
        return [i for i in self.inputs if i.kind == "positive" and i.dtype is not None]

    @property
    def sign_inputs(self) -> list[InputFacts]:
        return [i for i in self.inputs if i.kind == "sign"]

    @property
    def real_inputs(self) -> list[InputFacts]:
        """Inputs the judge draws at any scale, sign and distribution (the `real` domain)."""
        return [i for i in self.inputs if i.kind == "real" and i.dtype is not None]

    @property
    def elementwise(self) -> bool:
        """One output value per input position, nothing reduced: a single pass over memory."""
        return self.output == "same_shape" and not self.reduces


def task_facts(task: TaskFile) -> TaskFacts:
    """The facts of `task` (see TaskFacts); neutral ones (`unknown`, no inputs) where its file cannot
    be run on the meta device: the judge, not the prompt, says what is wrong with a task file."""
    return _facts(task.name, str(task.path), task.source)


@functools.lru_cache(maxsize=256)
def _facts(name: str, path: str, source: str) -> TaskFacts:
    try:
        module = tasks.load_module(TaskFile(name, Path(path), source))
    except Exception:  # noqa: BLE001 - a broken task file gets neutral notes; its run says why
        return TaskFacts()
    with sizes.meta():
        try:
            inputs = list(module.get_inputs())
        except Exception:  # noqa: BLE001 - get_inputs needs real data: no facts without memory
            return TaskFacts()
        names = _input_names(module, len(inputs))
        described = [InputFacts(name=n, dtype=_dtype(x), domain=d)
                     for n, x, d in zip(names, inputs, tasks.domains(module, len(inputs)))]
        try:
            model = module.Model(*module.get_init_inputs())
            with _OpRecorder() as recorder:
                out = model(*inputs)
        except Exception:  # noqa: BLE001 - an op without a meta kernel, or too many: the inputs are still known
            return TaskFacts(inputs=described)
    return TaskFacts(inputs=described, output=_output_kind(out, inputs, recorder.ops),
                     reduces=any(_is_reduction(op) for op in recorder.ops))


def _output_kind(out: Any, inputs: list[Any], ops: set[tuple[str, str]]) -> Output:
    packets = {packet for packet, _ in ops}
    if packets & MATMUL_OPS:
        return "matmul"
    if packets & CONVOLUTION_OPS:
        return "convolution"
    if not isinstance(out, torch.Tensor):
        return "other"
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if out.dim() == 0:
        return "scalar"
    if any(x.shape == out.shape for x in tensors):
        return "same_shape"
    if tensors and out.numel() < max(x.numel() for x in tensors) and any(_is_reduction(op) for op in ops):
        return "reduced"
    return "other"


def _is_reduction(op: tuple[str, str]) -> bool:
    packet, overload = op
    if packet in REDUCTION_OVERLOADS:
        return overload in REDUCTION_OVERLOADS[packet]
    return packet in REDUCTION_OPS


def _input_names(module: Any, count: int) -> list[str]:
    """forward's argument names for the inputs, in order (`input N` past what the signature names)."""
    try:
        params = [p for p in inspect.signature(module.Model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]  # past self
    except (TypeError, ValueError):
        params = []
    return [params[i].name if i < len(params) else f"input {i + 1}" for i in range(count)]


def _dtype(x: Any) -> str | None:
    return str(x.dtype).removeprefix("torch.") if isinstance(x, torch.Tensor) else None


# A forward is traced on the meta device for its facts at most this far: KernelBench's bidirectional
# LSTM decomposes into 92,000 meta ops (10-26 s of Python), which a run's first prompts would wait on
# (docs/decisions/spares-and-startup.md). ResNet101's forward is under 1,000.
OP_BUDGET = 5000


class _OpRecorder(TorchDispatchMode):
    """The aten ops forward calls, as (overload packet, overload) after decomposition: cross_entropy
    shows as _log_softmax and nll_loss_forward, a linear layer as addmm."""

    def __init__(self, budget: int = OP_BUDGET) -> None:
        super().__init__()
        self.ops: set[tuple[str, str]] = set()
        self.left = budget

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.left -= 1
        if self.left < 0:
            raise RuntimeError(f"more than {OP_BUDGET} ops on the meta device")
        self.ops.add((func.overloadpacket.__name__, func._overloadname))
        return func(*args, **(kwargs or {}))
