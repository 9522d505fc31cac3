"""Task sizes: which module globals a size sets, its stored name, the derived "small", held-out shapes, a
loaded task's dimensions (size_dims) and memory (footprint, check_memory). A size is a name the task has
("default", a KGEN_SIZES key, "small"), a mapping of globals ({"batch_size": 3}), or a name with overrides
("small(batch_size=3)"); anything else, or an override of a global the file lacks, is a SizeError.
Imported by the sandboxed harness (through tasks): it imports neither store, config, llm nor tasks.py.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import types
from pathlib import Path
from typing import Any

import torch

DEFAULT_SIZE = "default"
SMALL_SIZE = "small"
SMALL_ELEMENTS = 1 << 20  # a derived "small" keeps each input at most this many elements


# TaskError is a task-file error (tasks.py raises it, and callers take it from there) but is defined
# here: SizeError subclasses it, and this module cannot import tasks.py, which imports this one.
class TaskError(ValueError):
    """A task file that cannot be used; the message names the file."""


class SizeError(TaskError):
    """A size the task does not have, or that does not fit in memory: one line naming the task."""


def apply_size(module: types.ModuleType, size: str | dict[str, Any]) -> None:
    """Set a size's globals on a task module just executed (tasks.load_module), first keeping the
    file's own values; an unknown size is a SizeError naming the sizes the task has."""
    module.__kgen_base__ = _dim_globals(module)  # the file's own values, before any size
    overrides, name = _resolve(module, size)
    module.__dict__.update(overrides)
    module.__kgen_size__ = (size_key(size), name)


def size_presets(module: types.ModuleType) -> dict[str, dict[str, Any]]:
    """The presets the file declares, and "default" (the file as written)."""
    presets = getattr(module, "KGEN_SIZES", None) or {}
    return {DEFAULT_SIZE: {}, **presets}


def size_names(module: types.ModuleType) -> list[str]:
    """The size names the task has: its presets, and "small" (derived) where it declares none."""
    names = list(size_presets(module))
    return names if SMALL_SIZE in names else names + [SMALL_SIZE]


def effective_size(module: types.ModuleType, size: str | dict[str, Any]) -> str:
    """The name under which a size is recorded: it says what ran, and load_module takes it back.
    A declared preset keeps its name; a derived "small" lists the globals it set; a mapping is
    `k=v,...`."""
    cached = getattr(module, "__kgen_size__", None)
    if cached and cached[0] == size_key(size):
        return cached[1]
    return _resolve(module, size)[1]


def other_sizes(module: types.ModuleType, size: str | dict[str, Any]) -> list[str]:
    """Declared presets to check shape-generality against: all but the chosen one and the (huge) default."""
    chosen = _parse_size(module, size)[0] if isinstance(size, str) else None
    return [s for s in size_presets(module) if s not in (chosen, DEFAULT_SIZE)]


def held_out_sizes(module: types.ModuleType, rng) -> list[str]:
    """Two shapes no prompt showed, drawn with `rng`: one smaller (each input dimension 50-80%), one larger
    (1-12% more), every drawn dimension odd (no multiple of 2, 4, 8 or a block), equal globals moving
    together; named as a size mapping is. [] where the shapes cannot be probed on the meta device."""
    current = _dim_globals(module)
    try:
        with meta():
            dims = _input_dims(module, current)
    except Exception:  # noqa: BLE001 - get_inputs needs real data: nothing to draw from
        return []
    values = sorted({_element(current, key) for key in dims if _element(current, key) > 1})
    out = []
    for smaller in (True, False):
        new = {}
        for v in values:
            lo, hi = (max(1, v // 2), max(1, v * 4 // 5)) if smaller else (v + 1, v + max(1, v // 8))
            new[v] = rng.randint(lo, max(lo, hi)) | 1
        overrides = dict(current)
        for key in _elements(current):
            if _element(current, key) in new:
                overrides = _with_element(overrides, key, new[_element(current, key)])
        changed = {k: v for k, v in overrides.items() if v != current[k]}
        if changed:
            out.append(_overrides_name({**{k: v for k, v in current.items() if k in changed}, **changed}))
    return out


def parse_size_name(text: str) -> tuple[str | None, dict[str, Any]]:
    """("small", {}) for "small"; ("small", {"b": 3}) for "small(b=3)"; (None, {"b": 3}) for "b=3".
    ValueError for anything else."""
    text = text.strip()
    match = re.fullmatch(r"([A-Za-z_][\w.-]*)(?:\((.*)\))?", text, re.S)
    if match:
        return match.group(1), _parse_overrides(match.group(2) or "")
    if "=" in text:
        return None, _parse_overrides(text)
    raise ValueError(f"{text!r} is not a size name")


def derive_small(module: types.ModuleType) -> dict[str, Any]:
    """The generic "small" for a task that declares none: while get_inputs()'s largest input (probed on the
    meta device) has over SMALL_ELEMENTS elements, halve (_halve) the dimension, an integer global or one in
    a tuple, that shrinks it most; globals holding the same value in the file halve with it. Every input
    dimension's value; a SizeError (declare KGEN_SIZES["small"]) where the rule cannot apply."""
    task = _task_name(module)
    base = _base(module)
    try:
        with meta():
            numels = _input_numels(module, base)
            if max(numels, default=0) <= SMALL_ELEMENTS:
                return {name: base[name] for name, _ in _input_dims(module, base)}  # each once, in order
            dims = _input_dims(module, base)
            values = dict(base)
            current = (max(numels), sum(numels))
            order = {key: i for i, key in enumerate(dims)}
            while current[0] > SMALL_ELEMENTS:
                best = None
                for key in dims:
                    value = _element(values, key)
                    smaller = _halve(value, _element(base, key))
                    if smaller == value:
                        continue
                    trial = values
                    for twin in _elements(base):  # e.g. num_classes with input_shape = (num_classes,)
                        if _element(base, twin) == _element(base, key) and _element(values, twin) == value:
                            trial = _with_element(trial, twin, smaller)
                    try:
                        n = _input_numels(module, trial)
                    except Exception:  # noqa: BLE001 - a value get_inputs rejects is not taken
                        continue
                    score = (max(n, default=0), -value, sum(n), order[key])
                    if best is None or score < best[0]:
                        best = (score, trial)
                if best is None or (best[0][0], best[0][2]) >= current:
                    raise SizeError(f"task {task}: cannot derive size 'small': its largest input keeps "
                                    f"{current[0]} elements (over {SMALL_ELEMENTS}); declare KGEN_SIZES['small']")
                values, current = best[1], (best[0][0], best[0][2])
    except SizeError:
        raise
    except Exception as exc:  # noqa: BLE001 - get_inputs needs real data: no shapes without memory
        raise SizeError(f"task {task}: cannot derive size 'small': get_inputs() fails on the meta device "
                        f"({type(exc).__name__}: {_first_line(exc)}); declare KGEN_SIZES['small']") from exc
    names = {key[0] for key in dims} | {name for name in base if values[name] != base[name]}
    return {name: values[name] for name in base if name in names}


def size_dims(module: types.ModuleType) -> dict[str, int]:
    """The integer globals that define this module's shapes, at their current values: those whose change
    changes get_inputs()'s shapes or get_init_inputs()'s arguments (meta device), or that a domain names
    (`index:num_classes`); a tuple's integer is named like `input_shape[0]`. All of them where the meta device fails."""
    current = _dim_globals(module)
    keys = _elements(current)
    named = {d.partition(":")[2] for d in getattr(module, "KGEN_DOMAINS", None) or []}
    try:
        with meta():
            start = _signature(module, current)
            found = []
            for key in keys:
                if key[1] is None and key[0] in named:
                    found.append(key)
                    continue
                value = _element(current, key)
                try:
                    if _signature(module, _with_element(current, key, _probe(value))) != start:
                        found.append(key)
                except Exception:  # noqa: BLE001 - a value get_inputs rejects says nothing
                    continue
    except Exception:  # noqa: BLE001 - no shapes without memory: report them all
        found = keys
    return {name if i is None else f"{name}[{i}]": _element(current, (name, i)) for name, i in found}


# --- size helpers -----------------------------------------------------------------------------

def _task_name(module: types.ModuleType) -> str:
    return getattr(module, "__kgen_task__", None) or module.__name__.removeprefix("kgen_task_")


def size_key(size: Any) -> str:
    """A size (a preset's name or its globals) as a key (the reference's of what it keeps per size too)."""
    return json.dumps(size, sort_keys=True, default=repr)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _dim_globals(module: types.ModuleType) -> dict[str, Any]:
    """Module globals that can hold a dimension: ints, and tuples of ints, in file order."""
    return {k: v for k, v in vars(module).items()
            if not k.startswith("_") and not k.startswith("KGEN_")
            and (_is_int(v) or (isinstance(v, (tuple, list)) and v and all(_is_int(x) for x in v)))}


def _base(module: types.ModuleType) -> dict[str, Any]:
    return dict(getattr(module, "__kgen_base__", None) or _dim_globals(module))


def _overrides_name(overrides: dict[str, Any]) -> str:
    return ",".join(f"{k}={v!r}" for k, v in sorted(overrides.items()))


def _parse_overrides(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        call = ast.parse(f"f({text})", mode="eval").body
        if not isinstance(call, ast.Call) or call.args or any(kw.arg is None for kw in call.keywords):
            raise ValueError
        return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError, TypeError):
        raise ValueError(f"{text!r} is not a list of name=value overrides") from None


def _parse_size(module: types.ModuleType, size: str) -> tuple[str | None, dict[str, Any]]:
    try:
        return parse_size_name(size)
    except ValueError as exc:
        raise SizeError(f"task {_task_name(module)}: {exc} (has: {', '.join(size_names(module))})") from None


def _resolve(module: types.ModuleType, size: str | dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(globals to override, effective name) for a size."""
    task = _task_name(module)
    if isinstance(size, dict):
        label, overrides = None, dict(size)
    elif isinstance(size, str):
        label, overrides = _parse_size(module, size)
    else:
        raise SizeError(f"task {task}: a size is a name or a mapping of globals, not {type(size).__name__}")
    preset: dict[str, Any] = {}
    derived = False
    if label is not None:
        presets = size_presets(module)
        if label in presets:
            preset = dict(presets[label])
        elif label == SMALL_SIZE:
            preset, derived = derive_small(module), True
        else:
            raise SizeError(f"task {task}: no size {label!r} (has: {', '.join(size_names(module))})")
    merged = {**preset, **overrides}
    unknown = [k for k in merged if k not in vars(module)]
    if unknown:
        known = ", ".join(_dim_globals(module)) or "none"
        raise SizeError(f"task {task}: size {size if isinstance(size, str) else _overrides_name(size)!r} sets "
                        f"{', '.join(unknown)}, which the task file does not define (its integer globals: {known})")
    if label is None:
        name = _overrides_name(merged)
    elif derived:
        name = f"{label}({','.join(f'{k}={v!r}' for k, v in merged.items())})"
    elif overrides:
        name = f"{label}({','.join(f'{k}={v!r}' for k, v in overrides.items())})"
    else:
        name = label
    return merged, name


@contextlib.contextmanager
def meta():
    """Shapes without memory: the meta device, no autograd, the caller's RNG left as it was."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"), torch.no_grad():
        yield


@contextlib.contextmanager
def _globals(module: types.ModuleType, values: dict[str, Any]):
    saved = {k: module.__dict__[k] for k in values if k in module.__dict__}
    module.__dict__.update(values)
    try:
        yield
    finally:
        module.__dict__.update(saved)


def _input_numels(module: types.ModuleType, values: dict[str, Any]) -> list[int]:
    with _globals(module, values):
        return [x.numel() for x in module.get_inputs() if isinstance(x, torch.Tensor)]


def _signature(module: types.ModuleType, values: dict[str, Any]) -> tuple:
    def plain(xs):
        return tuple(("tensor", tuple(x.shape), str(x.dtype)) if isinstance(x, torch.Tensor) else repr(x) for x in xs)

    with _globals(module, values):
        return plain(module.get_inputs()), plain(module.get_init_inputs())


def _input_shapes(module: types.ModuleType, values: dict[str, Any]) -> tuple:
    with _globals(module, values):
        return tuple(tuple(x.shape) for x in module.get_inputs() if isinstance(x, torch.Tensor))


Key = tuple  # (global name, index in the tuple or None)


def _elements(values: dict[str, Any]) -> list[Key]:
    return [(k, None) if _is_int(v) else (k, i) for k, v in values.items()
            for i in ([None] if _is_int(v) else range(len(v)))]


def _element(values: dict[str, Any], key: Key) -> int:
    name, i = key
    return values[name] if i is None else values[name][i]


def _with_element(values: dict[str, Any], key: Key, value: int) -> dict[str, Any]:
    name, i = key
    out = dict(values)
    out[name] = value if i is None else tuple(value if j == i else x for j, x in enumerate(values[name]))
    return out


def _probe(value: int) -> int:
    return 2 * value if value > 0 else 1


def _input_dims(module: types.ModuleType, values: dict[str, Any]) -> list[Key]:
    """The elements whose change changes the shapes of get_inputs()."""
    start = _input_shapes(module, values)
    found = []
    for key in _elements(values):
        try:
            if _input_shapes(module, _with_element(values, key, _probe(_element(values, key)))) != start:
                found.append(key)
        except Exception:  # noqa: BLE001 - a value get_inputs rejects says nothing
            continue
    return found


def _halve(value: int, original: int) -> int:
    """Half of `value`, a multiple of the original's power-of-two factor (at most 8), an odd
    original staying odd, never below min(original, 8); `value` itself where it cannot shrink."""
    if original <= 0:
        return value
    p = min(8, original & -original)
    half = value // 2
    smaller = (half | 1) if p == 1 else half // p * p
    return smaller if min(original, 8) <= smaller < value else value


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def footprint(module: types.ModuleType) -> dict[str, int] | None:
    """Bytes of the inputs from get_inputs(), of Model's weights and of its output, computed on the
    meta device (nothing is allocated); None where get_inputs() cannot run there. Weights and
    output count 0 where the meta device cannot build or run the Model."""
    try:
        with meta():
            inputs = list(module.get_inputs())
    except Exception:  # noqa: BLE001
        return None
    out = {"inputs": tensor_bytes(inputs), "weights": 0, "output": 0}
    with contextlib.suppress(Exception):  # best effort: the inputs alone still bound the size
        with meta():
            model = module.Model(*module.get_init_inputs())
            if isinstance(model, torch.nn.Module):
                out["weights"] = tensor_bytes([*model.parameters(), *model.buffers()])
            result = model(*inputs)
            out["output"] = tensor_bytes(result if isinstance(result, (list, tuple)) else [result])
    return out


def convolves(module: types.ModuleType) -> bool:
    """Whether Model's forward runs a convolution, seen on the meta device (False where it cannot
    run there): on a GPU in float32 PyTorch lets cuDNN run those in TF32 (POLICY.tf32_tol)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        seen = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Ops.seen = Ops.seen or "convolution" in func.overloadpacket.__name__
            return func(*args, **(kwargs or {}))

    try:
        with meta():
            inputs = list(module.get_inputs())
            model = module.Model(*module.get_init_inputs())
            with Ops():
                model(*inputs)
    except Exception:  # noqa: BLE001 - best effort: strict tolerance where it cannot tell
        return False
    return Ops.seen


def check_memory(module: types.ModuleType, device: str, budget_bytes: int | None = None, *,
                 factor: int) -> int | None:
    """Refuse a size that cannot fit, before anything is allocated: `factor` x the footprint's bytes against
    `budget_bytes`, else the cpu's available memory (on a GPU only `budget_bytes`, the driver's figure). The
    bytes needed, or None where the meta device cannot tell; a SizeError where it does not fit."""
    sizes = footprint(module)
    if sizes is None:
        return None
    needed = factor * sum(sizes.values())
    available = budget_bytes if budget_bytes is not None else available_memory(device)
    if available is not None and needed > available:
        size = getattr(module, "__kgen_size__", (None, DEFAULT_SIZE))[1]
        raise SizeError(f"task {_task_name(module)}: size {size!r} needs about {needed} bytes ({_gib(needed)}: "
                        f"{factor} x {sum(sizes.values())} bytes of inputs, weights and output) but {device} "
                        f"has {available} bytes ({_gib(available)}) available; choose a smaller size")
    return needed


def available_memory(device: str) -> int | None:
    """Bytes free for a new process on the cpu (None where unknown, and on a GPU: see check_memory)."""
    if device.startswith("cuda"):
        return None
    limits = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            if limit.isdigit() and int(limit) < 1 << 60:
                limits.append(int(limit) - int(Path(usage_file).read_text().strip()))
                break
        except (OSError, ValueError):
            continue
    return min(limits) if limits else None


def tensor_bytes(xs) -> int:
    """Bytes of the tensors among `xs` (tasks.input_bytes too)."""
    return sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
