"""What one verified kernel is known to do: its provenance, numbers and validated envelope.

    entry = entry_from_attempt(store, row, source_sha256)   # a verified attempt row -> KernelEntry
    why = outside(entry.envelope, args)                      # None inside the envelope, else a reason

The envelope is what the evaluator actually exercised: the device kind, the input dtypes and the
shapes at the size the attempt was run at, and at each held-out size where the kernel was verified
correct and its own kernel ran (the child's profile, pipeline.judge.checks): `served`. Its speed is
verified at the timed size alone. The library runs a kernel only inside it; the export writes it to manifest.json.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

from ..child import tasks
from ..child.sizes import DEFAULT_SIZE
from ..leaderboard import faster
from ..records import Flag

# The evaluate.EVALUATOR_VERSION the kernels in this tree were judged by; kept here so that the
# library does not import the evaluator (and its sandbox) into a user's process.
EVALUATOR_VERSION = "1"


class LibraryError(Exception):
    """A kernel library that cannot be used (missing database or file, tampered export); one line."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class InputSpec(_Record):
    """One argument of forward() as the evaluator passed it."""

    kind: Literal["tensor", "int", "float", "bool"]
    """A tensor, or a Python scalar."""
    dtype: str | None = None
    """Tensor dtype without the torch. prefix (float32, int64, ...)."""
    shape: list[int] | None = None
    """Tensor shape at the validated size."""
    value: float | int | bool | None = None
    """A scalar's value: a kernel is only vouched for at the value it was checked with."""


class OutputSpec(_Record):
    """The tensor forward() returns for the validated inputs."""

    dtype: str
    """Output dtype (the evaluator rejects any dtype but the reference's)."""
    shape: list[int]
    """Output shape at the validated size; [] for a scalar loss."""


class Envelope(_Record):
    """The inputs a kernel was validated on; outside them the library runs the reference."""

    backend: Literal["cuda", "triton", "cpu"]
    """Where it ran."""
    device: str
    """The device kind: the CUDA device name, or "cpu" (any CPU) for the cpu backend."""
    inputs: list[InputSpec]
    """Per argument of forward()."""
    output: OutputSpec
    """What forward() returns there."""
    shape_general: bool
    """True when the kernel also passed at the task's other sizes. It no longer widens the envelope:
    a kernel correct at a size may hand it to PyTorch there; `served` says where it runs."""
    contiguous: bool = True
    """The evaluator only passes contiguous tensors, so that is all a kernel is vouched for."""
    backward: bool = False
    """Its backward was verified too (gradient mode): every input's gradient against float64 autograd,
    at every trial and size. False: only its forward is vouched for."""
    sizes: list[str] = []
    """The sizes it was judged correct at: the timed one first, then the held-out shapes it passed."""
    served: dict[str, list[InputSpec]] = {}
    """Held-out sizes it is used at besides `inputs`, with their inputs: each verified correct there,
    and its own kernel ran there (the child's profile). Its speed is verified at `inputs` alone."""


class KernelEntry(_Record):
    """One verified kernel, as recorded in an export's manifest.json."""

    task: str
    """Task name (the reference file's stem)."""
    task_sha256: str
    """sha256 of the reference source the kernel was validated against."""
    code_hash: str
    """The kernel's code hash (first 16 hex digits of sha256 of its source): names file and build."""
    sha256: str
    """Full sha256 of the kernel source."""
    attempt_id: str
    """The attempt that verified it."""
    run_id: str
    """The run that attempt belongs to."""
    model: str
    """The model that wrote it."""
    size: str
    """The task size it was evaluated (and timed) at."""
    backend: Literal["cuda", "triton", "cpu"]
    """cuda or cpu."""
    device: str
    """The device name the evaluator reported."""
    torch_version: str
    """torch.__version__ at evaluation."""
    cuda_version: str | None = None
    """torch.version.cuda at evaluation."""
    evaluator_version: str = EVALUATOR_VERSION
    """Version of the checks that passed it."""
    grad: bool = False
    """Judged in gradient mode: its times are forward plus backward, as are its baselines'."""
    dtype: str = "float32"
    """The dtype its inputs were cast to."""
    time_ms: float
    """Median time of the kernel."""
    eager_ms: float | None = None
    """Median time of the reference, eager."""
    compile_ms: float | None = None
    """Median time of torch.compile of the reference."""
    floor_ms: float | None = None
    """Bandwidth floor at that size."""
    speedup_eager: float | None = None
    """eager_ms / time_ms."""
    speedup_compile: float | None = None
    """compile_ms / time_ms."""
    floor_fraction: float | None = None
    """floor_ms / time_ms: 1.0 is the bandwidth floor."""
    time_p75_ms: float | None = None
    """75th percentile of the kernel's timed blocks: what leaderboard.faster compares (None in
    manifests written before it was recorded)."""
    beats_eager: bool | None = None
    """Verified faster than eager by leaderboard.faster; the library and the export use no kernel
    that is not (None: recorded before the rule, so the library applies it to the numbers above)."""
    beats_compile: bool | None = None
    """Verified faster than torch.compile of the reference by the same rule: only then does the
    library run it when the caller is compiled (None: no compile time, or recorded before the rule)."""
    envelope: Envelope
    """Where the kernel may be used."""


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def device_kind(backend: str, device: str) -> str:
    # A CPU kernel is plain C++: any CPU runs it, so the CPU model is not part of the kind.
    return "cpu" if backend == "cpu" else device


def parse_size(size: str | None) -> str | dict[str, Any]:
    """The stored size back as the value tasks.load_module takes (run.py stores dicts as JSON)."""
    if size and size.lstrip().startswith("{"):
        return json.loads(size)
    return size or DEFAULT_SIZE


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _input_spec(x: Any) -> InputSpec:
    if isinstance(x, torch.Tensor):
        return InputSpec(kind="tensor", dtype=_dtype(x.dtype), shape=list(x.shape))
    for kind, typ in (("bool", bool), ("int", int), ("float", float)):  # bool first: it is an int
        if isinstance(x, typ):
            return InputSpec(kind=kind, value=x)
    raise LibraryError(f"get_inputs() yields a {type(x).__name__}; the library handles tensors and scalars")


def meta_call(module, size_name: str) -> tuple[list[Any], Any]:
    """get_inputs() and the reference's output on the meta device, in the module's dtype (the run's,
    tasks.load_module): shapes and dtypes without the memory."""
    cast = getattr(module, "__kgen_dtype__", None)
    try:
        # fork_rng: describing a task must not reseed the caller's generator (make_model seeds it).
        with torch.random.fork_rng(devices=[]):
            model = tasks.make_model(module, module.Model, 0, "cpu")
            with torch.device("meta"), torch.no_grad():
                inputs = list(module.get_inputs())
                if cast is not None:
                    inputs = [x.to(cast) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                              for x in inputs]
                out = model.to("meta")(*inputs)
    except Exception as exc:  # a task whose get_inputs needs real data cannot be described
        raise LibraryError(f"task {module.__name__}: cannot compute its shapes at size {size_name} on the "
                           f"meta device: {type(exc).__name__}: {exc}") from exc
    return inputs, out


def envelope_for(task_module, size: str, backend: str, device: str, shape_general: bool, backward: bool = False,
                 sizes: list[str] | None = None, served: dict[str, list[InputSpec]] | None = None) -> Envelope:
    inputs, out = meta_call(task_module, size)
    if not isinstance(out, torch.Tensor):
        raise LibraryError(f"the reference returns {type(out).__name__}; the library replays one-tensor outputs")
    return Envelope(backend=backend, device=device_kind(backend, device), inputs=[_input_spec(x) for x in inputs],
                    output=OutputSpec(dtype=_dtype(out.dtype), shape=list(out.shape)), shape_general=shape_general,
                    backward=backward, sizes=list(sizes or [size]), served=dict(served or {}))


def passed_shape_trials(result) -> bool:
    """True when the attempt was checked at other sizes and passed them all (evaluate.judge_trial
    labels those trials variant@size); no such trials means nothing is known beyond its own size."""
    shape_trials = [t for t in result.trials if "@" in t.variant]
    return (Flag.shape_specialized not in result.flags and bool(shape_trials)
            and all(t.ok for t in shape_trials))


def served_inputs(task: tasks.TaskFile, result) -> dict[str, list[InputSpec]]:
    """The inputs at each held-out size the attempt may be served at (records.ShapeRun.served):
    correct there and its own kernel ran. Rows from before these were recorded have none, so their
    kernels run at their timed size alone."""
    served = {}
    for run in result.shapes:
        if run.served and Flag.shape_specialized not in result.flags:
            inputs, _ = meta_call(tasks.load_module(task, parse_size(run.size), result.dtype), run.size)
            served[run.size] = [_input_spec(x) for x in inputs]
    return served


def task_file(name: str, path: str, source: str) -> tasks.TaskFile:
    return tasks.TaskFile(name, Path(path), source)


def entry_from_attempt(attempt: dict[str, Any], task_source: str, source_sha256: str) -> KernelEntry:
    """A KernelEntry for one verified attempt (a Store.attempt() dict, with its EvalResult)."""
    result = attempt["result"]
    task = task_file(attempt["task"], attempt["task"] + ".py", task_source)
    module = tasks.load_module(task, parse_size(attempt["size"]), result.dtype)
    envelope = envelope_for(module, attempt["size"], attempt["backend"], attempt["device"] or "",
                            passed_shape_trials(result), backward=result.grad, sizes=result.sizes,
                            served=served_inputs(task, result))
    p75 = result.timing.p75_ms if result.timing else None
    return KernelEntry(
        task=attempt["task"], task_sha256=sha256_text(task_source), code_hash=attempt["code_hash"],
        sha256=source_sha256, attempt_id=attempt["id"], run_id=attempt["run_id"], model=attempt["model"],
        size=attempt["size"], backend=attempt["backend"], device=attempt["device"] or "",
        torch_version=attempt["torch_version"] or "", cuda_version=attempt["cuda_version"],
        grad=result.grad, dtype=result.dtype, **{k: attempt[k] for k in ("time_ms", "eager_ms", "compile_ms", "floor_ms", "speedup_eager",
                                   "speedup_compile", "floor_fraction")},
        time_p75_ms=p75, beats_eager=faster(attempt["time_ms"], p75, attempt["eager_ms"]),
        beats_compile=faster(attempt["time_ms"], p75, attempt["compile_ms"]), envelope=envelope)


def outside(envelope: Envelope, args: tuple) -> tuple[str, str] | None:
    """None when the call is inside the envelope (at its timed size's inputs, or a served size's),
    else (reason kind, one-line reason)."""
    why = _outside(envelope, envelope.inputs, args)
    if why is None or why[0] not in ("shape", "scalar"):
        return why
    if any(_outside(envelope, specs, args) is None for specs in envelope.served.values()):
        return None
    if envelope.served:
        shapes = ", ".join(str(tuple(s.shape)) for specs in envelope.served.values() for s in specs[:1] if s.shape)
        why = why[0], f"{why[1]} and served at {shapes}"
    return why


def _outside(envelope: Envelope, inputs: list[InputSpec], args: tuple) -> tuple[str, str] | None:
    if len(args) != len(inputs):
        return "arguments", f"called with {len(args)} arguments; validated with {len(inputs)}"
    for i, (x, spec) in enumerate(zip(args, inputs)):
        if spec.kind != "tensor":
            if isinstance(x, torch.Tensor) or x != spec.value:
                return "scalar", f"argument {i} is {x!r}; validated only at {spec.value!r}"
            continue
        if not isinstance(x, torch.Tensor):
            return "arguments", f"argument {i} is a {type(x).__name__}; validated with a tensor"
        if x.device.type != envelope.backend:
            return "device", f"argument {i} is on {x.device.type}; validated on {envelope.backend}"
        if _dtype(x.dtype) != spec.dtype:
            return "dtype", f"argument {i} has dtype {_dtype(x.dtype)}; validated with {spec.dtype}"
        if envelope.contiguous and not x.is_contiguous():
            return "layout", f"argument {i} is not contiguous; validated with contiguous tensors"
        if x.dim() != len(spec.shape):
            return "shape", f"argument {i} has rank {x.dim()}; validated with rank {len(spec.shape)}"
        if list(x.shape) != spec.shape:
            return "shape", (f"argument {i} has shape {tuple(x.shape)}; the kernel is validated only at "
                             f"{tuple(spec.shape)}")
    return None
