"""Builds kept between runs and projects: the same code, built the same way on the same machine, is
compiled once. A run's database already reuses a build of its own (build.reusable); this is the
user's cache beside it (KGEN_CACHE_DIR/builds, or KGEN_BUILD_CACHE), so a second project, `kgen eval` of a file judged
before, or a batch run again from nothing finds the build instead of paying 15-30 s of g++ for it.

    key = cache.key(code, options_env, fast=True, cuda=False, light=True)
    hit = cache.load(key, build_dir, code_hash)   # a BuildResult marked cached, its tree copied in
    cache.save(key, result)                       # after a build that succeeded

What it stops and what it lets through: an entry is written by the parent, from a build that
succeeded, and holds only regular files and folders (anything else, or past MAX_BYTES or MAX_FILES,
is not kept);
it is found only by a key over the whole code and everything that shapes its binary (torch, Python,
the compiler, the cpu, the build's environment and routes), so a candidate reaches no entry but one
of its own code. A hit runs no build child: the candidate's module-level code does not run again
before its evaluation, which starts as after a fresh build (the tree is copied, and staged read-only).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..config import cache_root
from ..records import BuildResult

MAX_BYTES = 512 << 20  # a build tree larger than this is not kept (a CUDA extension is tens of MB)
MAX_FILES = 1000  # nor one of more files (torch's build of an extension writes under ten)
MAX_ENTRIES = 256  # past this the least recently used are removed
# What a build child's environment carries that does not change the binary.
UNKEYED = frozenset({"KGEN_CORES", "MAX_JOBS"})


@functools.cache
def _machine() -> str:
    """The toolchain and cpu a binary was made for (-march=native reads the cpu)."""
    import torch

    parts = [sys.version, torch.__version__, str(Path(torch.__file__).parent), str(torch.version.cuda)]
    # kgen's own build code: a change to how it builds (headers, routes, the build child) starts afresh.
    here = Path(__file__).resolve().parent
    parts += [hashlib.sha256(f.read_bytes()).hexdigest() for f in
              sorted(here.glob("*.py")) + [here.parent / "child" / "harness.py"]]
    for tool in (os.environ.get("CXX", "c++"), "nvcc"):
        try:
            parts.append(subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30).stdout)
        except (OSError, subprocess.SubprocessError):
            parts.append(f"{tool}: none")
    try:
        parts += sorted({line for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith(("model name", "flags"))})
    except OSError:
        pass
    return "\n".join(parts)


def key(code: bytes, env: dict[str, str], **routes: bool) -> str:
    """The entry for this code built with these routes (fast, cuda, light) and build environment."""
    keyed = sorted((k, v) for k, v in env.items() if k not in UNKEYED)
    shaping = {k: os.environ.get(k, "") for k in ("CXX", "CC", "CUDA_HOME", "TORCH_CUDA_ARCH_LIST")}
    text = repr((_machine(), keyed, sorted(shaping.items()), sorted(routes.items())))
    return hashlib.sha256(hashlib.sha256(code).digest() + text.encode()).hexdigest()[:32]


def _root() -> Path:
    """KGEN_BUILD_CACHE, else the builds folder of the user's cache (the test suite keeps one per session)."""
    return Path(os.environ.get("KGEN_BUILD_CACHE") or cache_root() / "builds")


def load(entry: str, build_dir: Path, code_hash: str) -> BuildResult | None:
    """The kept build for `entry`, its tree copied to build_dir; None when there is none (or it
    cannot be read: then the build runs as if nothing were kept)."""
    folder = _root() / entry
    try:
        result = BuildResult.model_validate_json((folder / "result.json").read_text())
        shutil.rmtree(build_dir, ignore_errors=True)
        _copy(folder / "tree", build_dir)
        os.utime(folder)
    except (OSError, ValueError):
        shutil.rmtree(build_dir, ignore_errors=True)
        return None
    return result.model_copy(update={"cached": True, "code_hash": code_hash, "build_dir": str(build_dir)})


def save(entry: str, result: BuildResult) -> None:
    """Keep a build that succeeded; a tree with anything but regular files and folders, or too big, is not kept."""
    tree = Path(result.build_dir)
    if not result.ok or not tree.is_dir() or _size(tree) is None:
        return
    root = _root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        new = Path(tempfile.mkdtemp(dir=root, prefix=".new-"))
    except OSError:
        return
    try:
        _copy(tree, new / "tree")
        (new / "result.json").write_text(result.model_dump_json())
        os.rename(new, root / entry)  # another process may have kept the same build first: then it stands
    except OSError:
        shutil.rmtree(new, ignore_errors=True)
        return
    _prune(root)


def _size(tree: Path) -> int | None:
    total = 0
    for n, path in enumerate([tree, *tree.rglob("*")]):
        if n > MAX_FILES:
            return None
        if path.is_symlink() or not (path.is_dir() or path.is_file()):
            return None
        total += path.stat().st_size if path.is_file() else 0
        if total > MAX_BYTES:
            return None
    return total


def _copy(source: Path, target: Path) -> None:
    """Regular files and folders only: a link or a device in a tree stops the copy."""
    if source.is_symlink() or not source.is_dir():
        raise OSError(f"not a plain folder: {source}")
    target.mkdir(parents=True)
    for path in sorted(source.rglob("*")):
        if path.is_symlink() or not (path.is_dir() or path.is_file()):
            raise OSError(f"not a plain file: {path}")
        to = target / path.relative_to(source)
        to.mkdir() if path.is_dir() else shutil.copy2(path, to)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


def _prune(root: Path) -> None:
    """The least recently used entries past MAX_ENTRIES, and copies a killed process left half made."""
    # another build renames or removes its entries meanwhile: one gone between listing and stat is skipped
    stamped = sorted((m, p) for p in root.iterdir() if (m := _mtime(p)) is not None)
    entries = [p for _, p in stamped]
    kept = [p for p in entries if not p.name.startswith(".")]
    half_made = [p for m, p in stamped if p.name.startswith(".new-") and time.time() - m > 3600]
    for old in kept[:-MAX_ENTRIES] + half_made:
        shutil.rmtree(old, ignore_errors=True)
