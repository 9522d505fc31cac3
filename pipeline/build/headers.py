"""Fast builds: torch's headers, cut down and precompiled once per torch version and compiler.

Most of a `load_inline` build is the compiler reading `torch/extension.h` (torch/all.h, the whole
C++ frontend, then pybind11 and Python): 25 s of a 26 s `main.cpp` on 2 cores. A build child gets
a folder of ours first on its include path, holding a `torch/extension.h` that includes only what
a kernel's host code and its binding need (torch/types.h, and torch/python.h outside nvcc) -- the
same cut torch makes for inductor's own C++ wrappers -- and, next to it, that header precompiled by
g++ for the flag sets candidates use (a `.gch` folder: g++ takes the first variant that matches the
command line and reads the header as text when none does). nvcc cannot use a g++ PCH, so a `.cu`
gains only the smaller header.

The candidate's text is untouched; only what `#include <torch/extension.h>` brings in is smaller.
A candidate that needs more (torch::nn, its own PYBIND11_MODULE in a .cu) fails the fast build and
is built again with torch's own header (build.build), so no candidate is lost to this.

The folder is written here, by the parent, under the user's cache (KGEN_CACHE_DIR); a build child
may read it and write nothing in it (Landlock), so no candidate can plant a header or a PCH that a
later build would read.

    folder = headers.ensure(with_cuda=False)   # None where it cannot be made (then plain builds)
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..config import cache_root

# The notices a run's progress shows while the headers are made (pipeline.cli.progress), as its
# build count stands still: the first when it starts, the second when it is done.
PREPARING = "preparing fast-build headers (once per venv)"
READY = "fast-build headers ready"

SHIM = """\
// kgen's fast torch/extension.h (pipeline/build/headers.py): torch/types.h (ATen, tensors, options)
// and, for g++, torch/python.h (the binding); not torch/all.h, the C++ frontend (nn, optim, data).
// A .cu built with KGEN_LIGHT_ATEN gets kgen_light.h beside it instead (LIGHT_OPS).
#pragma once
#if defined(__CUDACC__) && defined(KGEN_LIGHT_ATEN)
#include "kgen_light.h"
#else
#include <torch/types.h>
#ifndef __CUDACC__
#include <torch/python.h>
#endif
#endif
"""

# load_inline puts `#include <torch/types.h>` at the top of every .cu it writes, before the candidate's
# text, so the folder shadows that header too: a .cu built light gets kgen_light.h, anything else
# torch's own (found next on the include path: the folder comes first, torch's folders after it).
TYPES_SHIM = """\
// kgen's torch/types.h (pipeline/build/headers.py): torch's own, or kgen_light.h in a .cu built light.
#pragma once
#if defined(__CUDACC__) && defined(KGEN_LIGHT_ATEN)
#include "kgen_light.h"
#else
#include_next <torch/types.h>
#endif
"""

# nvcc cannot read a g++ PCH, and what a .cu costs is ATen parsed three times (cudafe++, cicc, the
# host compiler): against torch/types.h a .cu builds in tens of seconds on 2 cores, against
# torch/extension.h in minutes (docs/decisions/builds-and-headers.md). torch/types.h brings every
# operator's header (ATen/Functions.h); a kernel's host code calls a few factories and Tensor's
# methods. The light header is Tensor (all its methods), the dispatch macros, the operators below and
# torch's own aliases (the `namespace torch` block of the installed torch/types.h, copied). A .cu that
# needs more fails to compile and is built again with torch/types.h (build.build), so no candidate is
# lost to it. In namespace torch a factory then names at:: 's (torch/types.h adds autograd wrappers
# that differ only for requires_grad=True options, which at:: refuses), so a .cu that mentions requires_grad
# is never built light (pipeline.child.harness). And torch::tensor({0.5}) is a float32 tensor where
# at::tensor({0.5}) is a float64 one: in the light header torch::tensor is deleted (NOT_AT), so a .cu
# that calls it fails here and is built with torch/types.h, rather than changing.
LIGHT_OPS = ("empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
             "full_like", "arange", "tensor", "from_blob", "sum", "mean", "amax", "amin", "max", "min",
             "abs", "exp", "log", "sqrt", "rsqrt", "pow", "square", "neg", "clamp", "where", "maximum",
             "minimum", "matmul", "mm", "bmm", "addmm", "cat", "stack", "sigmoid", "tanh", "relu",
             "softmax", "log_softmax", "add", "sub", "mul", "div", "argmax", "argmin", "gather",
             "index_select", "narrow", "zero", "copy", "to", "contiguous")
LIGHT_BASE = ("ATen/core/Tensor.h", "ATen/Dispatch.h", "ATen/TensorOptions.h", "ATen/Context.h",
              "ATen/TensorOperators.h")  # tensor / scalar and the like (with per-operator headers)


NOT_AT = "// torch's own, not at::'s (LIGHT_OPS): a call fails to compile here\n" \
         "template <typename... Args> void tensor(Args&&...) = delete;\n"


def light_header() -> str | None:
    """kgen_light.h for this torch, or None where its layout is not the one this was written for."""
    import torch

    include = Path(torch.__file__).parent / "include"
    types_h = include / "torch" / "csrc" / "api" / "include" / "torch" / "types.h"
    text = types_h.read_text() if types_h.is_file() else ""
    start, end = text.find("\nnamespace torch {"), text.find("} // namespace torch")
    if start < 0 or end < start or not all((include / h).is_file() for h in LIGHT_BASE):
        return None
    ops = [f"ATen/ops/{op}.h" for op in LIGHT_OPS if (include / "ATen" / "ops" / f"{op}.h").is_file()]
    lines = ["// kgen's light ATen for .cu files (pipeline/build/headers.py, LIGHT_OPS); from torch " + torch.__version__,
             "#pragma once", "#ifndef AT_PER_OPERATOR_HEADERS", "#define AT_PER_OPERATOR_HEADERS", "#endif",
             "#include <optional>", *[f"#include <{h}>" for h in (*LIGHT_BASE, *ops)]]
    return "\n".join(lines) + "\n" + text[start + 1:end] + NOT_AT + "} // namespace torch\n"


# The extra_cflags seen in completions (none, or -O3): each gets a precompiled variant. Other flag
# sets still get the smaller header, read as text.
VARIANTS: dict[str, list[str]] = {"plain": [], "O3": ["-O3"]}

_lock = threading.Lock()
_ready: dict[bool, Path | None] = {}


def ensure(with_cuda: bool, notice: Callable[[str], None] | None = None) -> Path | None:
    """The include folder for builds of this kind (made once per machine, torch and compiler), or
    None when it cannot be made here (no g++, an unknown torch layout): builds are then plain."""
    with _lock:
        if with_cuda not in _ready:
            try:
                _ready[with_cuda] = _make(with_cuda, notice)
            except (OSError, RuntimeError, ValueError, TypeError, subprocess.SubprocessError) as exc:
                if notice:
                    notice(f"fast builds off: torch's headers could not be precompiled here ({exc})")
                _ready[with_cuda] = None
        return _ready[with_cuda]


def ninja_variables(with_cuda: bool, source: str = "main.cpp") -> dict[str, str]:
    """The variables (cxx, cflags, nvcc, cuda_cflags, ...) of the ninja file torch itself writes for a
    load_inline of one empty `source` on this machine, so they follow the installed torch."""
    from torch.utils import cpp_extension as ce

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / source
        path.write_text("")
        wanted = {"path": str(Path(scratch) / "build.ninja"), "name": "kgen_probe", "sources": [str(path)],
                  "extra_cflags": [], "extra_cuda_cflags": [], "extra_sycl_cflags": [], "extra_ldflags": [],
                  "extra_include_paths": [], "with_cuda": with_cuda, "with_sycl": False, "is_standalone": False}
        writer = ce._write_ninja_file_to_build_library
        accepted = inspect.signature(writer).parameters
        writer(**{k: v for k, v in wanted.items() if k in accepted})
        return dict(line.split(" = ", 1) for line in (Path(scratch) / "build.ninja").read_text().splitlines()
                    if " = " in line and not line.startswith(" "))


def compile_command(with_cuda: bool) -> tuple[str, list[str]]:
    """The compiler and the flags `load_inline` gives main.cpp on this machine, less the extension's name."""
    from torch.utils import cpp_extension as ce

    lines = ninja_variables(with_cuda)
    flags = [f for f in shlex.split(lines["cflags"] + " " + lines.get("post_cflags", ""))
             if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    return lines.get("cxx", ce.get_cxx_compiler()), flags


def _compiler_id(cxx: str) -> str:
    found = shutil.which(cxx)
    if not found:
        raise RuntimeError(f"no C++ compiler {cxx!r}")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30).stdout
    return f"{os.path.realpath(found)}\n{version}"


def key(cxx: str, flags: list[str], light: str = "") -> str:
    """The folder's name: a PCH is only valid for the torch, Python, compiler and flags it was made
    with, so any change to those gets a folder of its own; so does any change to the light header's
    text (`light`, where the folder holds one)."""
    import torch

    return hashlib.sha256("\n".join([torch.__version__, sys.version, _compiler_id(cxx), SHIM, TYPES_SHIM, *flags,
                                      repr(sorted(VARIANTS.items())), light]).encode()).hexdigest()[:16]


def _make(with_cuda: bool, notice: Callable[[str], None] | None) -> Path | None:
    cxx, flags = compile_command(with_cuda)
    light = (light_header() or "") if with_cuda else ""
    name = key(cxx, flags, light)
    folder = cache_root() / "headers" / name
    done = folder / "ready"
    if done.is_file():
        _used(done)
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another kgen on this machine may be making the same folder
        if done.is_file():
            return folder
        started = time.monotonic()
        if notice:
            notice(f"{PREPARING}: precompiling torch's headers, some 600 MB a variant under {cache_root()}; "
                   "1-3 minutes on 2 cores, longer on a loaded box; builds wait for it")
        shutil.rmtree(folder, ignore_errors=True)
        header = write_shims(folder, light)
        (header.parent / "extension.h.gch").mkdir(parents=True)
        with ThreadPoolExecutor(len(VARIANTS)) as pool:
            made = list(pool.map(lambda item: _precompile(cxx, flags, header, *item), VARIANTS.items()))
        if not any(made):
            raise RuntimeError("no precompiled variant passed its check")
        done.write_text("\n".join(name for name, ok in zip(VARIANTS, made) if ok) + "\n")
        if notice:
            notice(f"{READY} in {time.monotonic() - started:.0f} s")
    prune(folder.parent)
    return folder


# Each torch, Python, compiler and set of include paths (every virtual environment) gets a folder of
# some 1.2 GB: a box where fresh clones are tested kept 13 GB of them in a day. When a folder is made,
# the others past the KEEP_FOLDERS last used go, if unused for an hour (a build may still be reading one).
KEEP_FOLDERS = 3
IDLE_S = 3600


def _used(done: Path) -> None:
    try:
        os.utime(done)  # the folder's last use: its `ready` file's time (prune)
    except OSError:
        pass


def prune(root: Path, keep: int = KEEP_FOLDERS, idle_s: float = IDLE_S) -> list[str]:
    """Remove the header folders under `root` past the `keep` last used (by their `ready` file), each
    unused for `idle_s` and not being made (its lock free); returns their names."""
    folders = sorted((p for p in root.iterdir() if (p / "ready").is_file()), key=lambda p: (p / "ready").stat().st_mtime,
                     reverse=True)
    removed = []
    for old in folders[keep:]:
        if time.time() - (old / "ready").stat().st_mtime < idle_s:
            continue
        with open(root / f"{old.name}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # another kgen is making it
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old.name)
        (root / f"{old.name}.lock").unlink(missing_ok=True)
    return removed


def write_shims(folder: Path, light: str = "") -> Path:
    """The folder's headers (its torch/extension.h, whose path this returns; with `light`, the light
    header and the torch/types.h that picks it), without the precompiled variants."""
    header = folder / "torch" / "extension.h"
    header.parent.mkdir(parents=True, exist_ok=True)
    header.write_text(SHIM)
    if light:
        (header.parent / "kgen_light.h").write_text(light)
        (header.parent / "types.h").write_text(TYPES_SHIM)
    return header


def _precompile(cxx: str, flags: list[str], header: Path, name: str, extra: list[str]) -> bool:
    """One variant, made in a folder of its own and moved in place once g++ accepts it for a file that
    includes <torch/extension.h> with the same flags (-Werror=invalid-pch): a variant that would
    silently not be used is not kept."""
    own = header.parent.parent / f".{name}"
    (own / "torch").mkdir(parents=True)
    (own / "torch" / "extension.h").write_text(SHIM)
    gch = own / "torch" / "extension.h.gch"
    subprocess.run([cxx, "-x", "c++-header", *flags, *extra, str(own / "torch" / "extension.h"), "-o", str(gch)],
                   check=True, capture_output=True, timeout=1800)
    probe = own / "probe.cpp"
    probe.write_text("#include <torch/extension.h>\nint kgen_probe;\n")
    check = [cxx, f"-I{own}", *flags, *extra, "-Winvalid-pch", "-Werror=invalid-pch", "-fsyntax-only", str(probe)]
    ok = subprocess.run(check, capture_output=True, timeout=600).returncode == 0
    if ok:
        gch.rename(header.parent / "extension.h.gch" / f"{name}.gch")
    shutil.rmtree(own)
    return ok
