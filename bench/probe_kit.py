"""What the GPU probe scripts share: a task's reference at KernelBench size, one event-timed call
(pipeline.child.timing.event_ms, the same one plain_ms uses), and the device and size the reference
probes run at (the cpu at "small" is a smoke of the probe itself)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from pipeline.child import tasks
from pipeline.child.timing import event_ms  # noqa: F401 - the probes' one event-timed call

ROOT = Path(__file__).resolve().parent.parent
DEV = "cuda" if torch.cuda.is_available() else "cpu"
SIZE = "default" if DEV == "cuda" else "small"


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def reference(name: str, seed: int = 1) -> tuple[Any, torch.nn.Module, list[Any]]:
    """(task module, float32 reference model, base inputs) at the default size, on the GPU."""
    task = tasks.discover(ROOT / "reference_tasks", [name])[0]
    module = tasks.load_module(task, "default")
    return module, tasks.make_model(module, module.Model, 0, "cuda"), tasks.make_inputs(module, seed, "base", "cuda")
