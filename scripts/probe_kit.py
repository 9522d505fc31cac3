"""What the GPU probe scripts share: a task's reference at KernelBench size, and one event-timed call."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from pipeline import tasks

ROOT = Path(__file__).resolve().parent.parent


def reference(name: str, seed: int = 1) -> tuple[Any, torch.nn.Module, list[Any]]:
    """(task module, float32 reference model, base inputs) at the default size, on the GPU."""
    task = tasks.discover(ROOT / "reference_tasks", [name])[0]
    module = tasks.load_module(task, "default")
    return module, tasks.make_model(module, module.Model, 0, "cuda"), tasks.make_inputs(module, seed, "base", "cuda")


def event_ms(call: Callable[[], Any]) -> float:
    """Milliseconds of one call between CUDA events, ending with a device sync."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)
