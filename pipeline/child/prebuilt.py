"""Load what kgen's build stage compiled, and never compile: torch's load_inline told to import only
(`load_only()` around one import, `import_only()` for an evaluation child's whole life).

The build directory is read-only (Landlock) and the binary loaded must be the one the evaluator
verified (torch, seeing other include flags, would rebuild). So torch's guards are disarmed: its
FileBaton (<= 2.13) reads as held elsewhere, its FileLock (>= 2.14) is a no-op and its build step does
nothing. A kernel never built fails to import with torch's own error.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator


def import_only() -> Callable[[], None]:
    """Patch torch.utils.cpp_extension; returns the function that puts everything back."""
    import torch.utils.cpp_extension as ce
    from torch.utils import file_baton

    saved: list[tuple[object, str, object]] = []

    def patch(owner: object, name: str, value: object) -> None:
        if hasattr(owner, name):  # each torch has one of the two guards, not both
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)

    patch(file_baton.FileBaton, "try_acquire", lambda self: False)
    patch(file_baton.FileBaton, "wait", lambda self: None)
    patch(ce, "FileLock", lambda path, *a, **k: contextlib.nullcontext())
    patch(ce, "_write_ninja_file_and_build_library", lambda *a, **k: None)

    def restore() -> None:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)

    return restore


@contextlib.contextmanager
def load_only() -> Iterator[None]:
    """import_only for the duration of a with block."""
    restore = import_only()
    try:
        yield
    finally:
        restore()
