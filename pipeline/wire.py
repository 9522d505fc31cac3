"""What crosses the pipe between the parent and a sandboxed child: JSON lines, and outputs as digests.

JSON only: the parent never unpickles anything a child wrote, since the child may run hostile code.
An output travels as its exact type, shape, dtype and device plus its values in float64 (all of them
when small, else a fixed sample of positions and two sums), so the parent can judge it against the
reference without the child ever seeing the reference.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

FULL_LIMIT = 1 << 16
SAMPLES = 4096


def send(fd: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def describe(obj: Any, sample_seed: int) -> dict[str, Any]:
    """A digest of a returned object; imports torch lazily so the parent can decode without it."""
    import torch

    desc: dict[str, Any] = {"type": f"{type(obj).__module__}.{type(obj).__qualname__}",
                            "exact_tensor": type(obj) is torch.Tensor}
    if not isinstance(obj, torch.Tensor):
        return desc
    t = obj.detach()
    desc.update(shape=list(t.shape), dtype=str(t.dtype).removeprefix("torch."), device=str(t.device),
                numel=t.numel())
    if t.numel() == 0:
        desc["values"] = ""
        return desc
    flat = t.reshape(-1).to(torch.float64)
    if flat.numel() <= FULL_LIMIT:
        desc["values"] = _b64(flat)
    else:
        desc["positions_seed"] = sample_seed
        desc["values"] = _b64(flat[sample_positions(flat.numel(), sample_seed, flat.device)])
        desc["sum"] = float(flat.sum())
        desc["abs_sum"] = float(flat.abs().sum())
    desc["finite"] = bool(torch.isfinite(flat).all())
    return desc


def sample_positions(numel: int, seed: int, device: Any = "cpu"):
    import torch

    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return torch.randint(0, numel, (SAMPLES,), generator=gen).to(device)


def values(desc: dict[str, Any]):
    """The float64 values a digest carries, as a numpy array."""
    import numpy as np

    return np.frombuffer(base64.b64decode(desc.get("values", "")), dtype=np.float64)


def _b64(flat) -> str:
    return base64.b64encode(flat.cpu().numpy().tobytes()).decode()


class LineReader:
    """Reads JSON lines from a pipe fd without blocking past a deadline."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = b""
        self.closed = False

    def read(self, timeout: float) -> dict[str, Any] | None:
        import select

        while b"\n" not in self.buffer:
            if self.closed:
                return None
            ready, _, _ = select.select([self.fd], [], [], max(timeout, 0))
            if not ready:
                raise TimeoutError
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                self.closed = True
                continue
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError:
            return {"event": "garbled", "raw": line[:200].decode(errors="replace")}
        return message if isinstance(message, dict) else {"event": "garbled", "raw": str(message)[:200]}
