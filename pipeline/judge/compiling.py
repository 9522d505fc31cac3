"""torch.compile in the reference process: the compiler's warm-up at start (CompilerWarmup), and
which models may keep their compile from one attempt to the next (stateless).

May import: child (as pipeline.judge.reference does).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch


def stateless(model: Any) -> str | None:
    """What a model without parameters, buffers or tensors of its own is made of (its modules' types
    and plain attributes), None for any other: two models alike here compute the same thing."""
    if not isinstance(model, torch.nn.Module) or any(True for _ in model.parameters()) or any(True for _ in model.buffers()):
        return None
    parts = []
    for name, m in model.named_modules():
        attrs = {k: v for k, v in vars(m).items() if not k.startswith("_")}
        if any(isinstance(v, torch.Tensor) for v in attrs.values()):
            return None
        parts.append((name, type(m).__qualname__, sorted((k, repr(v)) for k, v in attrs.items())))
    return repr(parts)


@dataclass
class Kept:
    """A model without weights kept across attempts at one size (Reference.kept)."""

    model: Any
    made: str
    """What it is made of (stateless): a fresh instance alike here computes the same thing."""
    compiled: Any = None
    """Its torch.compile, once made (dropped where it failed)."""


class CompilerWarmup:
    """torch.compile of a probe in a thread, so a process's one-time compiler start falls outside its first
    timed block; it touches neither the task's module nor torch's random state, so `expect` may run beside it
    (nothing is timed before `settle`). `off_lane`: nothing on the GPU, no code generated (aot_eager)."""

    def __init__(self, device: str, grad: bool, off_lane: bool = False):
        self.device, self.grad, self.off_lane = ("cpu" if off_lane else device), grad, off_lane
        self.seconds: float | None = None  # how long the warm-up took, once it has ended
        self.error: str | None = None  # why it failed, if it did (then the first compile pays)
        self.thread = threading.Thread(target=self._run, name="kgen-warm-compiler", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        started = time.monotonic()

        def probe(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.mean((a - b) ** 2) + torch.relu(a * b).sum()

        try:
            a = torch.linspace(-1, 1, 4096, device=self.device)
            b = torch.linspace(1, -1, 4096, device=self.device)
            compiled = torch.compile(probe, backend="aot_eager" if self.off_lane else "inductor")
            with torch.no_grad():
                compiled(a, b)
            if self.grad:  # the backward's own compile path (AOTAutograd)
                compiled(a.clone().requires_grad_(True), b).backward()
            if self.off_lane:  # imported now, off the lane (a local `import torch.x` would shadow torch)
                importlib.import_module("torch._inductor.compile_fx")
                with contextlib.suppress(ImportError):
                    importlib.import_module("triton.compiler")
            if self.device.startswith("cuda"):
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a warm-up that fails costs time, never a verdict
            self.error = one_line(exc)
        self.seconds = round(time.monotonic() - started, 3)

    def join(self) -> dict[str, Any]:
        """Wait for the warm-up; what `settle` reports of it."""
        waited = time.monotonic()
        self.thread.join()
        return {"warm_s": self.seconds, "waited_s": round(time.monotonic() - waited, 3), "error": self.error}


def one_line(exc: BaseException) -> str:
    """An exception as one capped line (its message may be empty or span pages)."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
