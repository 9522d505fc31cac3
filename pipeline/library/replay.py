"""Replay the best verified kernels as a drop-in library.

    from pipeline import library
    mse = library.load("mse")                  # nn.Module with the reference's forward(predictions, targets)
    loss = mse(p, t)                           # the verified kernel inside its envelope, else the reference
    mse_fn = library.functional("mse")
    library.export_best("db/kgen.db", "dist/kernels")
    mse = library.load("mse", export_dir="dist/kernels")   # no database; files checked against kgen.lock

Each kernel becomes the custom op kgen::<task>_<code_hash> with a fake (so torch.compile traces
through it) and an autograd formula. A kernel verified in gradient mode (`kgen eval --grad`,
`evaluation.grad`) brings its own backward: the formula runs the kernel's forward again with
autograd on and then its verified backward kernel (eager calls skip the op and use the kernel's
autograd.Function directly, with no recomputation). A forward-only kernel gets the reference's
backward, which recomputes the reference's forward too, so a training step through it costs about
one eager forward more than plain PyTorch; the first call that wants a gradient says so once. The kernel module is
imported into this process, deliberately: the user chose to run a kernel the evaluator verified.
Its extension builds once into builds/<code_hash> (an export's builds/<code_hash>) and is reused.
Set KGEN_DISABLE=1 to run every reference instead.

The library only accelerates: a kernel is used only where it was verified faster than eager on this
device kind, torch, dtype and mode, and in calls that torch.compile traces only where it was also
verified faster than torch.compile (leaderboard.faster is the rule; pipeline/library/selection.py applies
it). Otherwise the reference runs; load() warns once when a kernel is left out as slower, and
describe(task) (or module.describe()) says which kernel runs where, and why not.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import os
import re
import sys
import threading
import types
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from ..backends import GPU_BACKENDS
from ..child import tasks
from .export import export_best
from .kernels import KernelEntry, LibraryError, outside, parse_size, sha256_text, task_file
from .selection import Choice, Description, description, from_db, from_export, here

__all__ = ["load", "functional", "describe", "export_best", "LibraryError", "KgenFallbackWarning", "KgenModule",
           "Description"]

_lock = threading.RLock()
_KERNELS: dict[str, types.ModuleType] = {}  # kernel source sha256 -> imported module
_OPS: dict[str, Any] = {}                    # op name -> torch.ops packet
_LOADS = itertools.count()                   # numbers each load's task module


class KgenFallbackWarning(UserWarning):
    """A call ran the reference instead of a kernel; the message says why."""


@contextlib.contextmanager
def _prebuilt(build_dir: Path):
    """Where kgen's build stage already built this kernel, load that binary (the one the evaluator
    verified) and never build again: a fast build (pipeline/build/headers.py) compiled with an include
    path this process does not add, so torch would see other flags and rebuild it from nothing, a
    minute on the H100. As the evaluation child does (pipeline.child.prebuilt), torch imports what is
    there; for this import only."""
    if not any(build_dir.glob("*/*.so")):
        yield
        return
    from ..child.prebuilt import load_only

    with load_only():
        yield


def import_kernel(source: str, code_hash: str, path: Path, build_dir: Path) -> types.ModuleType:
    """Execute a kernel's source (already checked against its hash) with its own extension cache."""
    sha = sha256_text(source)
    with _lock:
        if sha in _KERNELS:  # content-addressed: the same source imported once per process
            return _KERNELS[sha]
        build_dir.mkdir(parents=True, exist_ok=True)
        name = f"kgen_kernel_{code_hash}"
        module = types.ModuleType(name)
        module.__file__ = str(path)
        saved = os.environ.get("TORCH_EXTENSIONS_DIR")
        # load_inline reads this at call time: the build lands in (or is reused from) build_dir.
        os.environ["TORCH_EXTENSIONS_DIR"] = str(build_dir.resolve())
        try:
            sys.modules[name] = module
            with _prebuilt(build_dir):
                exec(compile(source, str(path), "exec"), module.__dict__)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        finally:
            if saved is None:
                os.environ.pop("TORCH_EXTENSIONS_DIR", None)
            else:
                os.environ["TORCH_EXTENSIONS_DIR"] = saved
        if not hasattr(module, "ModelNew"):
            raise LibraryError(f"{path}: defines no ModelNew")
        _KERNELS[sha] = module
        return module


def _schema(entry: KernelEntry, reference: torch.nn.Module) -> str:
    params = list(inspect.signature(reference.forward).parameters.values())
    plain = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    if not plain or len(params) != len(entry.envelope.inputs):
        params = []
    types_ = {"tensor": "Tensor", "int": "int", "float": "float", "bool": "bool"}
    args = []
    for i, spec in enumerate(entry.envelope.inputs):
        name = params[i].name if params and params[i].name not in ("self", "out") else f"x{i}"
        args.append(f"{types_[spec.kind]} {name}")
    return f"({', '.join(args)}) -> Tensor"


def _fake(entry: KernelEntry, reference: torch.nn.Module) -> Callable:
    dtype = getattr(torch, entry.envelope.output.dtype)
    scalar = not entry.envelope.output.shape

    def fake(*args):
        like = next(x for x in args if isinstance(x, torch.Tensor))
        if scalar:  # a loss: 0-dim whatever the input shape
            return torch.empty((), dtype=dtype, device=like.device)
        # A shape-general kernel returns what the reference returns: its shape rules, on fake inputs.
        with torch.no_grad():
            out = reference(*args)
        return out.new_empty(out.shape)

    return fake


def _setup_context(ctx, inputs, output) -> None:
    ctx.tensor_at = [isinstance(x, torch.Tensor) for x in inputs]
    ctx.scalars = [None if t else x for t, x in zip(ctx.tensor_at, inputs)]
    ctx.save_for_backward(*[x for x in inputs if isinstance(x, torch.Tensor)])


def _saved_args(ctx) -> list[Any]:
    """forward's arguments back from what _setup_context kept: tensors saved, scalars as they were."""
    saved = iter(ctx.saved_tensors)
    return [next(saved) if is_tensor else scalar for is_tensor, scalar in zip(ctx.tensor_at, ctx.scalars)]


def _input_grads(forward: Callable, args: list[Any], grad: torch.Tensor) -> tuple:
    """`forward` run again on `args` with autograd on, then differentiated against `grad`: one
    gradient per argument (None for scalars, integer tensors and inputs it did not use). With the
    reference Model (a forward-only kernel), that is the reference's forward and backward. With the
    kernel model (its backward verified in gradient mode), the kernel's forward and its own
    backward: the op's forward ran without autograd, so nothing of the kernel's graph was kept."""
    args = [x.detach().requires_grad_(True) if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())
            else x for x in args]
    wants = [x for x in args if isinstance(x, torch.Tensor) and x.requires_grad]
    with torch.enable_grad():
        out = forward(*args)
    grads = iter(torch.autograd.grad(out, wants, grad, allow_unused=True))
    return tuple(next(grads) if isinstance(x, torch.Tensor) and x.requires_grad else None for x in args)


def _backward(reference: torch.nn.Module) -> Callable:
    """A forward-only kernel's autograd formula: the reference's gradient on the saved inputs."""
    return lambda ctx, grad: _input_grads(reference, _saved_args(ctx), grad)


def _kernel_backward(name: str, entry: KernelEntry, kernel_model: Callable, reference: torch.nn.Module) -> Callable:
    """A kernel verified in gradient mode: its backward as a second custom op,
    kgen::<task>_<code_hash>_backward(grad, inputs...) -> the floating inputs' gradients, opaque to
    torch.compile as the forward op is (tracing into the extension with fake tensors would fail),
    with a fake that returns gradients shaped like those inputs."""
    forward_schema = _schema(entry, reference)
    schema = "(Tensor grad, " + forward_schema[1:].split(") -> ")[0] + ") -> Tensor[]"

    def impl(grad, *args):
        return [g if g is not None else torch.zeros_like(x)
                for x, g in zip(args, _input_grads(kernel_model, list(args), grad))
                if isinstance(x, torch.Tensor) and x.is_floating_point()]

    op = torch.library.custom_op(f"kgen::{name}_backward", impl, mutates_args=(), schema=schema)
    op.register_fake(lambda grad, *args: [torch.empty_like(x) for x in args
                                          if isinstance(x, torch.Tensor) and x.is_floating_point()])

    def backward(ctx, grad):
        args = _saved_args(ctx)
        grads = iter(op(grad, *args))
        return tuple(next(grads) if isinstance(x, torch.Tensor) and x.is_floating_point() else None for x in args)

    return backward


def register_op(entry: KernelEntry, kernel_model: Callable, reference: torch.nn.Module):
    """The torch.ops packet kgen.<task>_<code_hash>, registered once per process."""
    name = f"{re.sub(r'[^0-9A-Za-z_]', '_', entry.task)}_{entry.code_hash}"
    with _lock:
        if name not in _OPS:
            def impl(*args):
                return kernel_model(*args)

            op = torch.library.custom_op(f"kgen::{name}", impl, mutates_args=(), schema=_schema(entry, reference))
            op.register_fake(_fake(entry, reference))
            if entry.envelope.backward:
                op.register_autograd(_kernel_backward(name, entry, kernel_model, reference),
                                     setup_context=_setup_context)
            else:
                op.register_autograd(_backward(reference), setup_context=_setup_context)
            _OPS[name] = (op, getattr(torch.ops.kgen, name))
        return _OPS[name][1]


_profiler_enabled = torch._C._autograd._profiler_enabled


class KgenModule(torch.nn.Module):
    """The reference's interface, backed by a verified kernel where it is vouched for."""

    def __init__(self, task: str, reference: torch.nn.Module, op=None, entry: KernelEntry | None = None,
                 reasons: list[tuple[str, str]] | None = None):
        super().__init__()
        self.task = task
        self.reference = reference
        self.op = op
        self.entry = entry
        self._reasons = list(reasons or [])
        self._signature = inspect.signature(reference.forward)
        self._warned: set[str] = set()
        self._cuda_ok: dict[int, bool] = {}
        self._verdicts: dict[tuple, tuple[str, str] | None] = {}
        self.direct: Callable | None = None  # the kernel model itself, for eager calls without autograd
        self.compiled = True  # run the kernel when torch.compile traces this module (else the reference)
        self.description: Description | None = None
        self._op_name = f"kgen::{re.sub(r'[^0-9A-Za-z_]', '_', task)}_{entry.code_hash}" if entry else ""

    def _call(self, args: tuple, kwargs: dict) -> Any:
        if kwargs:
            args = self._signature.bind(*args, **kwargs).args
        why = self._why_not(args)
        if why is None:
            compiling = torch.compiler.is_compiling()  # dynamo cannot trace warnings.warn
            if compiling and not self.compiled:
                # Not verified faster than torch.compile: let the caller's compile take the reference
                # (decided while tracing, so compiled code has no branch; describe() says why).
                return self.reference(*args)
            wants_grad = torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
            if wants_grad and not self.entry.envelope.backward and "backward" not in self._warned and not compiling:
                self._warned.add("backward")
                warnings.warn(f"kgen {self.task}: kernel {self.entry.code_hash} was verified forward only; gradients "
                              "come from the reference's backward, which recomputes the reference's forward "
                              "(a training step costs about one eager forward more than plain PyTorch)",
                              KgenFallbackWarning, stacklevel=3)
            if self.direct is not None and not compiling and (
                    not wants_grad or self.entry.envelope.backward):
                # Eager, and no gradient wanted or the kernel's own backward verified: the op's
                # dispatch (autograd wrapper, Python layers) would cost tens of microseconds a call,
                # and its backward a second forward; the kernel computes the same thing. Under
                # a profiler, a record keeps the call visible by the op's name (it costs ~20 us, so
                # only then).
                if _profiler_enabled():
                    with torch.profiler.record_function(self._op_name):
                        return self.direct(*args)
                return self.direct(*args)
            return self.op(*args)
        for reason in [why, *(self._reasons if self.op is None else [])]:
            self._warn(*reason)
        return self.reference(*args)

    def _why_not(self, args: tuple) -> tuple[str, str] | None:
        if os.environ.get("KGEN_DISABLE") == "1":
            return "disabled", "KGEN_DISABLE=1"
        if self.op is None:  # every reason it has none is warned about, once each
            return self._reasons[0] if self._reasons else ("no_kernel", "no kernel")
        # The envelope check runs once per input signature: per call it is one dict lookup.
        key = tuple((x.shape, x.dtype, x.device, x.is_contiguous()) if isinstance(x, torch.Tensor)
                    else ("value", type(x), repr(x)) for x in args)
        if key not in self._verdicts:
            why = outside(self.entry.envelope, args)
            if why is None and self.entry.backend in GPU_BACKENDS:
                why = self._other_gpu(args)
            self._verdicts[key] = why
        return self._verdicts[key]

    def _other_gpu(self, args: tuple) -> tuple[str, str] | None:
        for x in args:
            if isinstance(x, torch.Tensor):
                index = x.device.index if x.device.index is not None else torch.cuda.current_device()
                if index not in self._cuda_ok:
                    self._cuda_ok[index] = torch.cuda.get_device_name(index) == self.entry.device
                if not self._cuda_ok[index]:
                    return "device", f"cuda:{index} is not a {self.entry.device}, where the kernel was validated"
        return None

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(f"kgen {self.task}: {message}; running the reference", KgenFallbackWarning, stacklevel=4)

    def describe(self) -> Description | None:
        """Which kernel this module runs in eager and in compiled calls, and why the reference runs
        where it does (as library.describe, plus what happened at import)."""
        return self.description

    def extra_repr(self) -> str:
        if self.entry is None:
            return f"task={self.task}, kernel=None"
        return (f"task={self.task}, kernel={self.entry.code_hash}, x_eager={self.entry.speedup_eager}, "
                f"compiled={self.compiled}")


def _module_class(task: str, reference: torch.nn.Module) -> type:
    """A KgenModule subclass whose forward shows the reference's own signature and docstring."""
    sig = inspect.signature(reference.forward)

    def forward(self, *args, **kwargs):
        return self._call(args, kwargs)

    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = sig.replace(parameters=[self_param, *sig.parameters.values()])
    forward.__doc__ = type(reference).__doc__
    name = "Kgen_" + re.sub(r"[^0-9A-Za-z_]", "_", task)
    return type(name, (KgenModule,), {"forward": forward, "__doc__": type(reference).__doc__})


def _own_rng(backend: str):
    """make_model seeds the global generators; a library must leave the caller's RNG state alone."""
    devices = list(range(torch.cuda.device_count())) if backend in GPU_BACKENDS else []
    return torch.random.fork_rng(devices=devices)


def _locate(config, db, generated_dir, builds_dir) -> tuple[Path, Path, Path]:
    """The database, generated code and builds, found as the CLI finds them (pipeline.config.find_database): each
    as given, else the config's (`config`, else ./config.yaml where there is one) resolved against the
    config file's folder, else db/kgen.db, generated/ and builds/ here."""
    from ..config import ConfigError, config_file, find_database, load_config

    try:
        path = config_file(None if config is None else str(config))
        cfg = load_config(path) if path else None
        db = Path(db) if db else find_database(None, path)
    except ConfigError as exc:
        raise LibraryError(str(exc)) from None
    if not db.is_file() and cfg is None:
        raise LibraryError(f"{db}: no database, and no ./config.yaml here to name one "
                           "(pass config= or db=, or export_dir=)")
    return (db, Path(generated_dir) if generated_dir else cfg.path(cfg.generated_dir) if cfg else Path("generated"),
            Path(builds_dir) if builds_dir else cfg.path(cfg.build_dir) if cfg else Path("builds"))


def _plan(task: str, db, export_dir, backend: str | None, generated_dir, builds_dir, grad: bool | None,
          dtype: str, config=None) -> tuple[Choice, Any, torch.nn.Module, list[tuple[str, str]], str, str]:
    """load() up to importing the kernel: the choice, the task module, the reference and the reasons."""
    backend, kind = here(backend)
    if export_dir is not None:
        choice = from_export(task, Path(export_dir), backend, kind, grad, dtype)
    else:
        db, generated_dir, builds_dir = _locate(config, db, generated_dir, builds_dir)
        choice = from_db(task, db, backend, kind, generated_dir, builds_dir, grad, dtype)
    module = tasks.load_module(task_file(task, f"{task}.py", choice.task_source), parse_size(choice.size), dtype)
    with _own_rng(backend):
        reference = tasks.make_model(module, module.Model, 0, "cpu")
    reasons = list(choice.reasons)
    if any(True for _ in reference.parameters()) or any(True for _ in reference.buffers()):
        # The op sees only forward's arguments: parameters would get no gradient and go stale.
        reasons.insert(0, ("parameters", "the reference Model has parameters or buffers, which kernels here "
                                         "do not take"))
    elif os.environ.get("KGEN_DISABLE") == "1":
        reasons.insert(0, ("disabled", "KGEN_DISABLE=1"))  # nothing imported, nothing built
    return choice, module, reference, reasons, backend, kind


def load(task: str, *, db: str | Path | None = None, export_dir: str | Path | None = None,
         backend: str | None = None, generated_dir: str | Path | None = None,
         builds_dir: str | Path | None = None, grad: bool | None = None, dtype: str = "float32",
         config: str | Path | None = None) -> KgenModule:
    """A module for `task` backed by its best verified kernel for this device, torch and backend.

    From an export when export_dir is given (no database needed), else from the database, found as
    the CLI finds it: `db`, else the database of `config` (a config file; default ./config.yaml where
    there is one) relative to that file, as are its generated code and builds. Only a
    kernel verified faster than eager is used (leaderboard.faster), and in calls torch.compile traces
    only one also faster than torch.compile. Outside the kernel's envelope, with no verified kernel,
    none faster, or with KGEN_DISABLE=1, calls run the reference Model, with one KgenFallbackWarning
    per reason (a kernel left out as slower is warned about here, at load). `dtype`: kernels verified
    in that dtype (float32, bfloat16, float16). `grad`: True, only kernels whose backward was verified;
    False, only forward-mode ones; None, a backward-verified kernel where there is one.
    module.describe() says which kernel runs where, and why not.
    """
    choice, module, reference, reasons, backend, kind = _plan(task, db, export_dir, backend, generated_dir,
                                                              builds_dir, grad, dtype, config)
    # torch.compile, tracing the reference (the fallback inside a compiled caller), imports the
    # module its forward's globals name: make that name importable, one per load (sizes differ).
    module.__name__ = f"{module.__name__}_{next(_LOADS)}"
    sys.modules[module.__name__] = module
    op, direct = None, None
    refused = any(k in ("parameters", "disabled") for k, _ in reasons)
    if choice.entry is not None and not refused:
        try:
            kernel = import_kernel(choice.kernel_source, choice.entry.code_hash, choice.kernel_path,
                                   choice.build_dir)
            with _own_rng(backend):  # built as the evaluator built them: same seed, same weights
                kernel_model = tasks.make_model(module, kernel.ModelNew, 0, "cuda" if backend in GPU_BACKENDS else "cpu")
                backward_reference = tasks.make_model(module, module.Model, 0, "cpu")
            op = register_op(choice.entry, kernel_model, backward_reference)
            direct = kernel_model
        except LibraryError:
            raise
        except Exception as exc:  # a build that fails here (no compiler, other flags): run the reference
            reasons.insert(0, ("import", f"kernel {choice.entry.code_hash} failed to load: "
                                         f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"))
    module_ = _module_class(task, reference)(task, reference, op, choice.entry if op else None, reasons)
    module_.direct = direct
    module_.description = description(choice, backend, kind, dtype, reasons, loaded=op is not None)
    module_.compiled = module_.description.compiled
    slower = next((message for k, message in reasons if k == "slower"), None)
    if slower and not refused:  # it decides for every call: say it now, once, not at the first call
        module_._warned.add("slower")
        warnings.warn(f"kgen {task}: {slower}; running the reference", KgenFallbackWarning, stacklevel=2)
    return module_


def describe(task: str, *, db: str | Path | None = None, export_dir: str | Path | None = None,
             backend: str | None = None, generated_dir: str | Path | None = None,
             builds_dir: str | Path | None = None, grad: bool | None = None, dtype: str = "float32",
             config: str | Path | None = None) -> Description:
    """Which kernel load(task, ...) would run in eager and in compiled calls, and why the reference
    runs where it does, without importing or building anything (a kernel that then fails to build
    runs the reference: the loaded module's describe() says so). print() it for a few lines."""
    choice, _, _, reasons, backend, kind = _plan(task, db, export_dir, backend, generated_dir, builds_dir, grad, dtype,
                                                 config)
    return description(choice, backend, kind, dtype, reasons, loaded=choice.entry is not None)


def functional(task: str, **kwargs) -> Callable:
    """load(task, **kwargs) as a function with the reference forward's signature."""
    module = load(task, **kwargs)

    @functools.wraps(module.reference.forward)
    def call(*args, **kw):
        return module(*args, **kw)

    call.__name__ = call.__qualname__ = task
    call.module = module
    return call
