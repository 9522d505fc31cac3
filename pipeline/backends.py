"""What kind of kernel a candidate writes, and where it runs.

    cuda    load_inline with cuda_sources (nvcc), on a GPU lane
    triton  @triton.jit kernels launched from ModelNew.forward, compiled by Triton's JIT inside the
            candidate's own child (its cache in the child's private home), on a GPU lane; where no
            GPU is visible, run by Triton's interpreter on the CPU (TRITON_INTERPRET=1): verdicts
            are real, times are the interpreter's, so CI judges Triton candidates without a GPU
    cpu     load_inline with cpp_sources only (g++), on the CPU

`auto` takes the first backend of the config's `auto_backends` that this machine can run.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache

BACKENDS = ("cuda", "triton", "cpu")
GPU_BACKENDS = ("cuda", "triton")


class BackendError(ValueError):
    """A backend this machine cannot run, named with why."""


@cache
def gpu_present() -> bool:
    import torch

    return torch.cuda.is_available()


@cache
def triton_present() -> bool:
    return importlib.util.find_spec("triton") is not None


def on_gpu(backend: str) -> bool:
    """Whether `backend`'s candidates run on GPU lanes here (else on the CPU)."""
    return backend in GPU_BACKENDS and gpu_present()


def device_for(backend: str) -> str:
    return "cuda" if on_gpu(backend) else "cpu"


def interpreted(backend: str) -> bool:
    """Triton without a GPU: its interpreter runs the kernels on the CPU."""
    return backend == "triton" and not gpu_present()


def fast_builds(backend: str, wanted: bool) -> bool:
    """Whether builds for `backend` use kgen's precompiled torch headers (pipeline.build.headers): a
    Triton candidate compiles no C++, so its builds need none, and precompiling them would hold up
    the start of a Triton batch by about half a minute (docs/decisions/builds-and-headers.md)."""
    return wanted and backend != "triton"


def child_env(backend: str) -> dict[str, str]:
    """What a candidate's child needs in its environment for `backend`."""
    return {"TRITON_INTERPRET": "1"} if interpreted(backend) else {}


def usable(backend: str) -> str | None:
    """Why this machine cannot run `backend`'s candidates now, or None. A cuda candidate without a
    GPU is not an error: its attempts wait for one (verdict waiting_gpu)."""
    if backend == "triton" and not triton_present():
        return "backend triton needs the triton package (pip install triton)"
    return None


def resolve(requested: str, order: list[str] | tuple[str, ...] = ("cuda", "cpu")) -> str:
    """The backend a run uses: `requested`, or for auto the first of `order` this machine runs
    (cuda and triton need a visible GPU there; cpu always runs)."""
    if requested != "auto":
        why = usable(requested)
        if why:
            raise BackendError(why)
        return requested
    for backend in order:
        if usable(backend) is None and (backend == "cpu" or gpu_present()):
            return backend
    raise BackendError(f"backend auto: none of {', '.join(order)} can run here (no GPU is visible)")


def triton_kernels(source: str) -> list[str]:
    """Names of the @triton.jit (or autotuned, heuristics-wrapped) functions the source defines, read
    by the parent from the text: what the profiler's kernel names are checked against, so a kernel
    the candidate wrote counts as its own whatever it is called."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            names.append(node.name)
    return names
