"""Reference tasks in KernelBench's file contract (`Model`, `get_inputs()`, `get_init_inputs()`): loaded
at a size (sizes.py), their models, and inputs from a seed. Two optional globals are ours: `KGEN_SIZES`
(named presets of module globals) and `KGEN_DOMAINS` (each input's valid domain); a KernelBench file
without them runs at its own size and distribution, re-seeded per trial.

Imported by the sandboxed harness, so it must not import store, config or llm.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# TaskError is defined in sizes.py only because SizeError subclasses it and sizes.py cannot import
# this module; it is a task-file error, raised here, and callers take it from here.
from .sizes import DEFAULT_SIZE, TaskError, apply_size, effective_size
from .sizes import tensor_bytes as input_bytes
from .timing import input_sets

VARIANTS = ("base", "scaled", "heavy", "needle")
DTYPES = ("float32", "bfloat16", "float16")  # what a task can be judged in (its float32 inputs cast)


@dataclass(frozen=True)
class TaskFile:
    name: str
    path: Path
    source: str
    level: int | None = None
    """KernelBench level, where the file sits at levelN/ID_Name.py (kernelbench_ids); else None."""
    problem: int | None = None
    """KernelBench problem id (the number before the file's first underscore) there; else None."""

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


def kernelbench_ids(path: Path) -> tuple[int | None, int | None]:
    """(level, problem) of a file laid out as KernelBench lays out its tasks (`level1/23_Softmax.py`:
    level 1, problem 23); (None, None) for any other path."""
    level = re.fullmatch(r"level(\d+)", path.parent.name)
    problem = re.match(r"(\d+)_", path.name)
    if level and problem:
        return int(level.group(1)), int(problem.group(1))
    return None, None


def task_file(path: Path) -> TaskFile:
    """The task at `path` (resolved), with its KernelBench level and problem where its path has them."""
    return TaskFile(path.stem, path, path.read_text(), *kernelbench_ids(path))


def discover(directory: Path, patterns: list[str]) -> list[TaskFile]:
    """Task files in `directory` whose stem matches any pattern, in pattern order then name order."""
    if not directory.is_dir():
        raise TaskError(f"{directory}: no such task folder")
    directory = directory.resolve()  # children run elsewhere
    files = sorted(p for p in directory.glob("*.py") if not p.name.startswith("_"))
    chosen: list[Path] = []
    for pattern in patterns:
        hits = [p for p in files if fnmatch.fnmatchcase(p.stem, pattern)]
        if not hits:
            known = ", ".join(p.stem for p in files) or "none"
            raise TaskError(f"tasks: '{pattern}' matches no file in {directory} (have: {known})")
        chosen += [p for p in hits if p not in chosen]
    return [task_file(p) for p in chosen]


def load_file(path: Path) -> TaskFile:
    path = Path(path).resolve()
    if not path.is_file():
        raise TaskError(f"{path}: no such task file")
    return task_file(path)


def load_module(task: TaskFile, size: str | dict[str, Any] = DEFAULT_SIZE, dtype: str | None = None) -> types.ModuleType:
    """Execute the task's source in a fresh module, with the chosen size's globals applied.
    An unknown size is a SizeError naming the sizes the task has. With `dtype` (bfloat16, float16),
    make_inputs and make_model cast the module's floating inputs and weights to it."""
    if dtype not in (None, *DTYPES):
        raise TaskError(f"no dtype {dtype!r} (has: {', '.join(DTYPES)})")
    module = types.ModuleType(f"kgen_task_{task.name}")
    module.__file__ = str(task.path)
    try:
        exec(compile(task.source, str(task.path), "exec"), module.__dict__)
    except Exception as exc:  # a task file is user input: report it, naming the file
        raise TaskError(f"{task.path}: fails to load: {type(exc).__name__}: {exc}") from exc
    for needed in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, needed):
            raise TaskError(f"{task.path}: missing {needed} (KernelBench contract)")
    module.__kgen_task__ = task.name
    apply_size(module, size)
    module.__kgen_dtype__ = None if dtype in (None, "float32") else getattr(torch, dtype)
    return module


def check_size(task: TaskFile, size: str | dict[str, Any]) -> str:
    """Load the task at `size` only to check it has that size; its effective name, or a SizeError."""
    return effective_size(load_module(task, size), size)


def domains(module: types.ModuleType, count: int) -> list[str]:
    declared = list(getattr(module, "KGEN_DOMAINS", None) or [])
    return (declared + ["fixed"] * count)[:count]


def tolerance(module: types.ModuleType, default: float) -> float:
    return float(getattr(module, "KGEN_TOLERANCE", default))


def make_model(module: types.ModuleType, cls: type, init_seed: int, device: str) -> torch.nn.Module:
    """Build Model or ModelNew the way KernelBench does: same seed before construction, so weights match;
    built on the device it runs on (KernelBench builds on the cpu and moves it: initialising a level-3
    model's two billion weights there costs seconds, twice for the reference and once an attempt)."""
    torch.manual_seed(init_seed)
    init = module.get_init_inputs()
    torch.manual_seed(init_seed)
    with torch.device(device):
        model = cls(*init)
    if not isinstance(model, torch.nn.Module):
        return model
    cast = getattr(module, "__kgen_dtype__", None)
    return model.to(device=device, dtype=cast) if cast is not None else model.to(device)


def make_inputs(module: types.ModuleType, seed: int, variant: str, device: str) -> list[Any]:
    """Inputs for one trial: the file's own get_inputs() under `seed`, then reshaped into `variant`
    within each input's declared domain. Deterministic for a given seed, device and torch version,
    so the reference process and the candidate's process see bitwise-identical inputs."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown input variant {variant!r}")
    torch.manual_seed(seed)
    with torch.device(device):
        raw = list(module.get_inputs())
    raw = [x.to(device) if isinstance(x, torch.Tensor) else x for x in raw]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 0x9E3779B9)
    out = []
    for x, domain in zip(raw, domains(module, len(raw))):
        if isinstance(x, torch.Tensor):
            x = _shape_to_domain(x, domain, variant, gen, module)
        out.append(x)
    cast = getattr(module, "__kgen_dtype__", None)
    if cast is not None:  # values drawn in float32 as the file draws them, then rounded to the dtype
        out = [x.to(cast) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in out]
    return out


def redraw_inputs(inputs: list[Any], module: types.ModuleType, seed: int, device: str) -> None:
    """New values from `seed` for the reference's own blocks (its code caches nothing): the old values are
    dropped first so the draw takes their memory, and the set holds the draw itself, uncopied (docs/decisions/gpu-timing.md)."""
    inputs.clear()
    inputs.extend(make_inputs(module, seed, "base", device))


def block_sets(module: types.ModuleType, inputs: list[Any], device: str) -> list[list[Any]]:
    """`inputs` plus as many more sets of the same shapes as a timing block keeps in memory
    (timing.input_sets); their values are placeholders, refilled before each block."""
    return [inputs] + [make_inputs(module, 0, "base", device) for _ in range(input_sets(input_bytes(inputs), device) - 1)]


def _uniform(gen: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * torch.rand((), generator=gen, device=gen.device).item()


def _randn(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)


def _positions(numel: int, gen: torch.Generator, device) -> torch.Tensor:
    """About one position in 4096, without repeats: a scatter to a repeated index is nondeterministic
    on CUDA, and the reference and the candidate must see bitwise-identical inputs."""
    idx = torch.randint(0, numel, (max(1, numel // 4096),), generator=gen, device=device)
    return torch.unique(idx)


def _real(x: torch.Tensor, variant: str, gen: torch.Generator) -> torch.Tensor:
    """A real-valued input with a random scale and offset per trial, so the answer moves by far more
    than the tolerance between trials and a constant or closed-form guess cannot pass."""
    if variant == "base" or not x.is_floating_point() or x.numel() == 0:
        return x
    scale = math.exp(_uniform(gen, -2.0, 2.0))
    offset = _uniform(gen, -2.0, 2.0)
    if variant == "heavy":
        # A lognormal scale mixture of normals: heavy tails that a sampled estimate gets wrong.
        y = _randn(x, gen) * torch.exp(_randn(x, gen)) * scale + offset
    else:
        y = x * scale + offset
    if variant in ("scaled", "heavy") and x.dim() >= 2:
        rows = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), generator=gen, device=x.device)
        y = y * (0.25 + 3.75 * rows.to(x.dtype))
    if variant == "needle":
        # Rare large values at random places: a kernel that skips part of the input misses them.
        flat = y.reshape(-1)
        idx = _positions(flat.numel(), gen, x.device)
        k = idx.numel()
        sign = torch.randint(0, 2, (k,), generator=gen, device=x.device).to(x.dtype) * 2 - 1
        mag = 20 + 80 * torch.rand((k,), generator=gen, device=x.device).to(x.dtype)
        flat[idx] = offset + sign * mag * (scale + abs(offset))
        y = flat.reshape(x.shape)
    return y.to(x.dtype).contiguous()


def _shape_to_domain(x: torch.Tensor, domain: str, variant: str, gen: torch.Generator,
                     module: types.ModuleType) -> torch.Tensor:
    kind, _, arg = domain.partition(":")
    if kind == "fixed" or variant == "base":
        return x
    if kind == "real":
        return _real(x, variant, gen)
    if kind == "positive":
        return _real(x, variant, gen).abs() + 1e-3
    if kind == "simplex":
        dim = int(arg or -1)
        # Logits with a random temperature; spread stays under ~60 so softmax never underflows to 0
        # in float32 (log(0) would make the reference itself infinite).
        temp = math.exp(_uniform(gen, -2.0, 1.5))
        logits = _randn(x, gen) * temp
        if variant == "heavy":
            logits = logits * torch.exp(_randn(x, gen).clamp(max=1.5))
        if variant == "needle":
            flat = logits.reshape(-1)
            flat[_positions(flat.numel(), gen, x.device)] += _uniform(gen, 8.0, 15.0)
            logits = flat.reshape(x.shape)
        return logits.clamp(-30, 30).softmax(dim=dim).to(x.dtype).contiguous()
    if kind == "index":
        high = int(getattr(module, arg)) if arg and not arg.isdigit() else int(arg or (int(x.max()) + 1))
        if variant == "heavy":
            # Targets concentrated on a few classes.
            few = torch.randint(0, high, (4,), generator=gen, device=x.device)
            pick = torch.randint(0, 4, x.shape, generator=gen, device=x.device)
            return few[pick].to(x.dtype)
        return torch.randint(0, high, x.shape, generator=gen, device=x.device, dtype=x.dtype)
    if kind == "sign":
        p = _uniform(gen, 0.1, 0.9)
        bits = torch.rand(x.shape, generator=gen, device=x.device) < p
        return (bits.to(x.dtype) * 2 - 1).contiguous()
    raise TaskError(f"unknown input domain {domain!r} (known: real, positive, simplex:D, index:N, sign, fixed)")
