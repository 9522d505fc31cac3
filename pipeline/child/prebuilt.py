"""Load what kgen's build stage compiled, and never compile: torch's load_inline told to import only.

    with load_only():          # the library, for one import
        exec(candidate_source)
    import_only()              # an evaluation child, for its whole life

An evaluation child's build directory is read-only (Landlock), and the library must load the binary
the evaluator verified (a fast build used an include path this process does not add, so torch would
see other flags and rebuild from nothing). torch guards a build two ways, by version:
- up to 2.13 a `FileBaton` lock file: reporting it as held elsewhere makes torch wait, then import;
- from 2.14 an advisory `FileLock` whose holder rechecks the sources and builds in place. Taking that
  lock writes the build directory (refused under Landlock: every evaluation was load_failed), and
  the recheck would compile in a process that must not. So the lock is a no-op and the build step
  does nothing: torch goes straight to importing what is there, and a kernel that was never built
  fails to import with torch's own error.
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
