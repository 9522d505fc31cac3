"""An evaluation child and the library load what the build stage compiled and never compile
(pipeline.child.prebuilt), whichever lock torch guards its builds with: a FileBaton lock file up
to torch 2.13, an advisory FileLock from 2.14 (whose holder rebuilds in place)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CANDIDATE = textwrap.dedent('''
    import os, sys
    from torch.utils.cpp_extension import load_inline
    sys.path.insert(0, sys.argv[2])
    from pipeline.child.prebuilt import import_only
    import_only()
    try:
        load_inline("kgen_never_built", cpp_sources="int f() { return 1; }", functions=["f"],
                    build_directory=sys.argv[1])
    except ImportError as exc:
        print("IMPORT_ERROR", type(exc).__name__)
    ''')


def test_an_unbuilt_kernel_is_not_compiled_and_no_lock_is_written(tmp_path: Path) -> None:
    build = tmp_path / "build"
    build.mkdir()
    script = tmp_path / "load.py"
    script.write_text(CANDIDATE)
    out = subprocess.run([sys.executable, str(script), str(build), str(ROOT)], capture_output=True, text=True,
                         timeout=120)
    assert "IMPORT_ERROR" in out.stdout, out.stdout + out.stderr
    written = sorted(p.name for p in build.iterdir())
    # load_inline writes its source file before it looks for a build; nothing else may appear:
    # no lock (refused in a read-only build dir), no build.ninja, no object, no library.
    assert written == ["main.cpp"], written


def test_restore_puts_torch_back() -> None:
    import torch.utils.cpp_extension as ce
    from torch.utils import file_baton

    from pipeline.child.prebuilt import load_only

    before = (file_baton.FileBaton.try_acquire, getattr(ce, "FileLock", None), ce._write_ninja_file_and_build_library)
    with load_only():
        assert ce._write_ninja_file_and_build_library is not before[2]
        assert file_baton.FileBaton.try_acquire(file_baton.FileBaton("/nonexistent/lock")) is False
    after = (file_baton.FileBaton.try_acquire, getattr(ce, "FileLock", None), ce._write_ninja_file_and_build_library)
    assert after == before
