"""What the parent checks itself about a candidate's own code (`inspect_build`, after the build: `nm` and
`readelf` over the built .so files, the source's @triton.jit functions), and which flags rest on what
(`flags_for`). The child's profile can be forged by the candidate, so the parent's look proves absence
only: no function beyond pybind11's and torch's glue and no Triton kernel is `no_custom_kernel` whatever
the child says. Whether code that is there ran, only the profile says: a flag on that alone is a claim.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

from .. import backends
from ..records import Flag, OwnCode, ShapeRun, TrialResult
from ..policy import POLICY

# The first name of a C++ symbol that is not the candidate's: pybind11's glue, torch's and the C++
# library's inline code that every extension instantiates.
GLUE_SCOPES = {"pybind11", "std", "c10", "at", "torch", "caffe2", "__gnu_cxx", "__cxxabiv1", "_object", "PyObject"}
# Unmangled (C) names every extension has: module init, CPython's inline helpers, the runtime's own.
GLUE_C = re.compile(r"^(PyInit_|pybind11_|Py[A-Z_]|_Py|_init$|_fini$|_start|frame_dummy$|register_tm_clones$|"
                    r"deregister_tm_clones$|__|_GLOBAL_|_DYNAMIC|_edata|_end|__bss_start|_ITM_|\.)")


def inspect_build(build_dir: str | Path | None, backend: str, source: str) -> OwnCode:
    """The parent's look at one candidate's build folder (as BuildResult.build_dir gives it) and source."""
    triton = backends.triton_kernels(source) if backend == "triton" else []
    if not build_dir or not Path(build_dir).is_dir():
        return OwnCode(holds_own=bool(triton) or False, triton_kernels=triton)
    nm = shutil.which("nm")
    files = extension_files(Path(build_dir))
    if files and nm is None:
        return OwnCode(holds_own=True if triton else None, triton_kernels=triton,
                       extensions=[str(f.relative_to(build_dir)) for f in files], error="no nm on this machine")
    functions, kernels, device_code, unknown = [], [], False, []
    for path in files:
        names = symbols(nm, path)
        if names is None:  # stripped or unreadable: the parent cannot tell what it holds
            unknown.append(path.name)
            continue
        for name in names:
            kind, shown = classify(name)
            if kind == "kernel":
                kernels.append(shown)
            elif kind == "own":
                functions.append(shown)
        device_code = device_code or fat_binary(path)
    own = bool(functions or kernels or triton)
    return OwnCode(holds_own=True if own else (None if unknown else False), triton_kernels=triton,
                   extensions=[str(f.relative_to(build_dir)) for f in files],
                   functions=demangle(sorted(set(functions))[:POLICY.own_code_names]),
                   device_kernels=demangle(sorted(set(kernels))[:POLICY.own_code_names]), device_code=device_code,
                   error=f"no symbol table in {', '.join(unknown)}" if unknown else None)


def extension_files(build_dir: Path) -> list[Path]:
    """Regular .so files under the build folder: no link is followed (one pointing at libtorch
    would lend the candidate torch's code), and at most POLICY.own_code_files."""
    found = []
    for root, _dirs, names in os.walk(build_dir, followlinks=False):
        for name in sorted(names):
            path = Path(root) / name
            if name.endswith(".so") and stat.S_ISREG(path.lstat().st_mode):
                found.append(path)
                if len(found) >= POLICY.own_code_files:
                    return found
    return found


def symbols(nm: str, path: Path) -> list[str] | None:
    """Defined function symbols (mangled) of one shared object: its full symbol table, else its
    dynamic one; None where it has neither."""
    for extra in ([], ["-D"]):
        try:
            proc = subprocess.run([nm, "--defined-only", *extra, str(path)], capture_output=True, text=True,
                                  timeout=POLICY.tool_s, errors="replace")
        except (OSError, subprocess.TimeoutExpired):
            return None
        names = [parts[2] for parts in (line.split(maxsplit=2) for line in proc.stdout.splitlines())
                 if len(parts) == 3 and parts[1] in "TtWwi"]
        if proc.returncode == 0 and names:
            return names
    return None


def demangle(names: list[str]) -> list[str]:
    """C++ names as c++filt writes them (the mangled ones where it is missing), for `kgen show`."""
    tool = shutil.which("c++filt")
    if not names or tool is None:
        return names
    try:
        proc = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=POLICY.tool_s,
                              errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return names
    out = proc.stdout.splitlines()
    return [n[:200] for n in out] if proc.returncode == 0 and len(out) == len(names) else names


def fat_binary(path: Path) -> bool:
    """Whether the object holds CUDA device code (nvcc's .nv_fatbin section)."""
    readelf = shutil.which("readelf")
    if readelf is None:
        return False
    try:
        proc = subprocess.run([readelf, "-SW", str(path)], capture_output=True, text=True, timeout=POLICY.tool_s,
                              errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return False
    return ".nv_fatbin" in proc.stdout


def classify(symbol: str) -> tuple[str, str]:
    """("glue" | "own" | "kernel", the name to show) for one mangled symbol."""
    base = symbol.split(".", 1)[0] if not symbol.startswith(".") else symbol  # .cold, .isra.0, .part.0 clones
    if not base.startswith("_Z"):
        return ("glue" if GLUE_C.match(base) else "own"), base
    first = _first_scope(base[2:])
    if first is None:
        return "glue", base  # vtables, typeinfo, thunks, guards: no function body of the candidate's
    if first.startswith("__device_stub__"):  # nvcc's host-side launcher of kernel NAME: __device_stub__NAME
        return "kernel", first.removeprefix("__device_stub__")
    if first in GLUE_SCOPES or first.startswith("pybind11_"):
        return "glue", base
    return "own", base


def _first_scope(encoding: str) -> str | None:
    """The outermost name of an Itanium-mangled encoding (after `_Z`): `3mse...` -> mse,
    `N8pybind11...` -> pybind11, `NSt...`/`St...` -> std, `Z<encoding>E...` (a local entity) -> its
    function's; the anonymous namespace is looked through. None for special names (`T`, `GV`, `TH`)."""
    s = encoding
    while True:
        if s.startswith("L"):  # internal linkage
            s = s[1:]
        if s.startswith("Z"):  # an entity local to a function: judged by that function
            s = s[1:]
            continue
        if s.startswith("N"):
            s = s[1:]
            while s and s[0] in "rVKRO":
                s = s[1:]
        if s.startswith("St") or (len(s) > 1 and s[0] == "S" and s[1] in "absiod"):
            return "std"
        digits = re.match(r"\d+", s)
        if not digits:
            return None
        length = int(digits.group())
        start = digits.end()
        name = s[start:start + length]
        if name == "_GLOBAL__N_1":  # the anonymous namespace: the next name is the candidate's
            s = "N" + s[start + length:]
            continue
        return name


def library_allowed(level: int | None) -> bool:
    """Whether a task's level lets a candidate keep library operators (KernelBench levels 2 and 3)."""
    return level in POLICY.library_levels


def own_share(profile) -> float | None:
    """The child's claim, from one profile: the share of the call in the candidate's own code (the
    rest of the call, after PyTorch's ops and kernels; None: no profile, or one that failed)."""
    if profile is None or profile.torch_fraction is None or profile.error:
        return None
    return min(1.0, max(0.0, 1.0 - profile.torch_fraction))


def flags_for(profile, shape_results: list[TrialResult], own: OwnCode | None = None,
              shapes: list[ShapeRun] = (), interpreted_eager_ms: float | None = None,
              library_ok: bool = False) -> tuple[list[Flag], list[Flag]]:
    """(every flag, those raised on the child's claims alone). `no_custom_kernel`: the parent's finding
    where it found no own code, else the child's claim where its profile puts the call in PyTorch's ops
    (pytorch_did_it, given `interpreted_eager_ms` and `library_ok`). `shape_specialized`: the parent's finding
    where a held-out size failed, else the child's claim where its own kernel did not run at one."""
    flags, claimed = [], []
    if own is not None and own.holds_own is False:
        flags.append(Flag.no_custom_kernel)
    elif pytorch_did_it(profile, interpreted_eager_ms, library_ok):
        flags.append(Flag.no_custom_kernel)
        claimed.append(Flag.no_custom_kernel)
    if any(not t.ok for t in shape_results) or any(not s.correct for s in shapes):
        flags.append(Flag.shape_specialized)
    elif Flag.no_custom_kernel not in flags and any(s.own_ran is False for s in shapes):
        flags.append(Flag.shape_specialized)
        claimed.append(Flag.shape_specialized)
    return flags, claimed


def pytorch_did_it(profile, interpreted_eager_ms: float | None = None, library_ok: bool = False) -> bool | None:
    """The child's claim, from one profile: PyTorch's ops did the call's work (None: no profile). With
    `library_ok` (library_allowed), only where its own code did under POLICY.library_own_fraction; with
    `interpreted_eager_ms` (eager's time, where Triton's interpreter's Python hides PyTorch's share), where
    PyTorch's ops alone took POLICY.no_custom_kernel_fraction of eager's call."""
    if profile is None or profile.torch_fraction is None or profile.error:
        return None
    if library_ok:
        return own_share(profile) < POLICY.library_own_fraction
    if interpreted_eager_ms:
        return (profile.torch_us or 0.0) / 1000 >= POLICY.no_custom_kernel_fraction * interpreted_eager_ms
    return profile.torch_fraction > POLICY.no_custom_kernel_fraction
