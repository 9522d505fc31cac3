"""Whether a task's size fits: the bytes its inputs, weights and output take (on the meta device,
nothing allocated) and the memory a device has free.

`check_memory(module, device)` refuses, before anything is allocated, a size whose inputs (with
weights and output where the meta device can tell) times `factor` (the parent's POLICY.memory_factor)
exceed the memory available.
On a GPU the parent passes the free bytes the driver reports (pipeline.judge.health.gpu_free_bytes):
asking torch would open a CUDA context in the parent.

Like every module in pipeline/child, it must not import store, config or llm (the candidate's process
could reach them). It raises sizes.SizeError.
"""

from __future__ import annotations

import types
from pathlib import Path

import torch

from .sizes import DEFAULT_SIZE, SizeError, _meta, _task_name

def footprint(module: types.ModuleType) -> dict[str, int] | None:
    """Bytes of the inputs from get_inputs(), of Model's weights and of its output, computed on the
    meta device (nothing is allocated); None where get_inputs() cannot run there. Weights and
    output count 0 where the meta device cannot build or run the Model."""
    try:
        with _meta():
            inputs = list(module.get_inputs())
    except Exception:  # noqa: BLE001
        return None
    out = {"inputs": _tensor_bytes(inputs), "weights": 0, "output": 0}
    try:
        with _meta():
            model = module.Model(*module.get_init_inputs())
            if isinstance(model, torch.nn.Module):
                out["weights"] = _tensor_bytes([*model.parameters(), *model.buffers()])
            result = model(*inputs)
            out["output"] = _tensor_bytes(result if isinstance(result, (list, tuple)) else [result])
    except Exception:  # noqa: BLE001 - best effort: the inputs alone still bound the size
        pass
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
        with _meta():
            inputs = list(module.get_inputs())
            model = module.Model(*module.get_init_inputs())
            with Ops():
                model(*inputs)
    except Exception:  # noqa: BLE001 - best effort: strict tolerance where it cannot tell
        return False
    return Ops.seen


def check_memory(module: types.ModuleType, device: str, budget_bytes: int | None = None, *,
                 factor: int) -> int | None:
    """Refuse a size that cannot fit, before anything is allocated: `factor` x the footprint's
    bytes against `budget_bytes`, or else the memory available on `device` (cpu: MemAvailable, and
    the cgroup's limit where lower; on a GPU only `budget_bytes`, the driver's figure that the
    parent passes). Returns the bytes needed, or None where the meta device cannot tell (get_inputs
    needs real data); a SizeError where it does not fit."""
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
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
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


def _tensor_bytes(xs) -> int:
    return sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
