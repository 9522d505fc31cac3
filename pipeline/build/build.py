"""Compiling a candidate: importing it in a sandboxed child, so its module-level load_inline runs
there, with one build directory per code hash and the compiler's full log kept.

    result = build(code_path, code_hash, builds_root, BuildOptions(timeout_s=900))
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .. import sandbox
from ..child import HARNESS, protocol
from ..config import cache_root
from ..records import BuildResult
from . import cache, headers


def build_dir_for(builds_root: Path, code_hash: str) -> Path:
    return builds_root / code_hash


def clear_stale_locks(build_dir: Path) -> list[Path]:
    """torch's FileBaton leaves a `lock` file behind when a build is killed, and the next build of the
    same extension then waits on it forever. One build per hash runs at a time (the caller ensures
    it), so any lock found before we start is stale. The tree was written by a candidate's build:
    the walk follows no link and removes only what is itself a link or a regular file named lock."""
    removed = []
    for root, _dirs, files in os.walk(build_dir, followlinks=False):
        for name in files:
            if name == "lock":
                lock = Path(root) / name
                lock.unlink(missing_ok=True)
                removed.append(lock)
    return removed


def build_env(gpus: list[str]) -> dict[str, str]:
    """What a build child's environment adds: no visible GPU (a build only compiles, and must not
    open a context on a device that a lane is timing), so torch cannot ask the device for its
    architecture; it is named instead, from the lanes' GPUs (unless the user set it), rather than
    letting torch compile for every architecture it knows."""
    env = {"CUDA_VISIBLE_DEVICES": ""}
    if gpus and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        import torch

        archs = {"%d.%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        env["TORCH_CUDA_ARCH_LIST"] = ";".join(sorted(archs))
    return env


@dataclass(frozen=True)
class BuildOptions:
    """How build() builds: its limits and the routes it tries."""

    timeout_s: float = 900
    """Per build child: a build past it is a build_timeout."""
    max_jobs: int | None = None
    """Compiler processes at once (MAX_JOBS); None: every core."""
    env: dict[str, str] | None = None
    """More of the child's environment (build_env: CUDA_VISIBLE_DEVICES; KGEN_CORES)."""
    fast: bool = True
    """Build with the fast headers (pipeline/build/headers.py) where they can be made here."""
    cuda: bool = False
    """The candidates are CUDA extensions (main.cpp then has CUDA's include paths, which the PCH must match)."""
    light: bool = True
    """A CUDA candidate's .cu files first against the light ATen header (False: bench/gpu_builds.py
    measures the builds without it)."""
    split: bool = True
    """nvcc's host and device steps side by side in the faster routes (pipeline/build/nvcc_split.py)
    where the build has SPLIT_CORES cores; the last route, torch's own headers, runs nvcc as torch does."""
    reuse: bool = True
    """Take a build of the same code kept from an earlier run (pipeline/build/cache.py), and keep this
    one; False builds afresh and keeps nothing (what measures or probes a build itself)."""


def build(code_path: Path, code_hash: str, builds_root: Path, options: BuildOptions = BuildOptions(),
          notice: Callable[[str], None] | None = None, spares: BuildSpares | None = None) -> BuildResult:
    """Build with the fastest route `options` allows (code that names no C++ extension is not built): each build that fails (not a timeout) is done
    again from a clean folder with the next, slower headers, down to torch's own, whose result and
    log stand, so the faster routes never cost a candidate its build. `notice`: a line for a slow
    first step (precompiling the headers). `spares`: build children started ahead with torch imported
    (BuildSpares), taken where one waits. A build of the same code kept from an earlier run
    (pipeline/build/cache.py) is copied in instead, marked cached."""
    build_dir = build_dir_for(builds_root.resolve(), code_hash)
    code_path = code_path.resolve()
    if not any(word in code_path.read_text(errors="replace") for word in COMPILING):
        # Nothing to compile (pure PyTorch: a KernelBench reference dropped in; Triton, which compiles
        # as it runs): no build child, whose import took 4-5 s a candidate. Its import runs, and fails
        # (load_failed), in its evaluation's child; code that hides a build under another spelling
        # fails there too, since an evaluation child never compiles (pipeline/child/prebuilt.py).
        shutil.rmtree(build_dir, ignore_errors=True)
        build_dir.mkdir(parents=True)
        return BuildResult(code_hash=code_hash, ok=True, log=NOTHING_TO_BUILD, build_dir=str(build_dir))
    if not options.reuse:
        return _build(code_path, code_hash, build_dir, options, notice, spares)
    entry = cache.key(code_path.read_bytes(), options.env or {}, fast=options.fast, cuda=options.cuda,
                      light=options.light)
    if (kept := cache.load(entry, build_dir, code_hash)) is not None:
        return kept
    result = _build(code_path, code_hash, build_dir, options, notice, spares)
    cache.save(entry, result)
    return result


def _build(code_path: Path, code_hash: str, build_dir: Path, options: BuildOptions,
           notice: Callable[[str], None] | None, spares: BuildSpares | None) -> BuildResult:
    timeout_s, max_jobs, extra_env = options.timeout_s, options.max_jobs, options.env
    fast, cuda, light, split = options.fast, options.cuda, options.light, options.split
    folder = headers.ensure(cuda, notice) if fast else None
    if folder is None:
        return _build_once(code_path, code_hash, build_dir, timeout_s, max_jobs, extra_env, spares=spares)
    routes: list[tuple[str, dict[str, str]]] = [("fast", {})]
    if light and cuda and (folder / "torch" / "kgen_light.h").is_file() and "requires_grad" not in code_path.read_text():
        routes.insert(0, ("light", {"KGEN_LIGHT_ATEN": "1"}))  # why not with requires_grad: headers.LIGHT_OPS
    failed: list[str] = []
    spent = 0.0
    jobs = max_jobs or os.cpu_count() or 1
    for label, more in routes:
        result = _build_once(code_path, code_hash, build_dir, timeout_s, max_jobs, extra_env,
                             {"KGEN_HEADERS": str(folder), **more,
                              **({"KGEN_NVCC_SPLIT": "1"} if split and jobs >= SPLIT_CORES else {})}, spares)
        spent += result.seconds
        if result.ok or result.timed_out:
            note = _after(failed)
            return result.model_copy(update={"headers": label, "seconds": spent, "log": result.log + note})
        # Its first error stays (the only trace of why the faster route failed: e.g. a light header
        # that every candidate's .cu rejects on some torch shows here, not as a slower build alone).
        failed.append(f"{label} headers (failed in {result.seconds:.1f} s: {failure_line(result)[:160]})")
        shutil.rmtree(build_dir, ignore_errors=True)  # follows no link: a link is removed, not its target
    plain = _build_once(code_path, code_hash, build_dir, timeout_s, max_jobs, extra_env, spares=spares)
    # At the end, and without the earlier builds' errors: the log's errors are the plain build's.
    return plain.model_copy(update={"log": plain.log + _after(failed, "torch/extension.h as written"),
                                    "seconds": spent + plain.seconds})


COMPILING = ("cpp_extension", "load_inline")  # what code that builds an extension names
NOTHING_TO_BUILD = "[kgen] nothing to build: the code names no C++ extension (torch.utils.cpp_extension)\n"

# A split nvcc runs two front ends at once beside g++ on main.cpp. On the H100 (16 cores) a lone light
# build took 12.4-17.6 s split against 17.0 s not; eight at once (2 cores each) 18.8-20.7 s split
# against 16.9-18.3 s not: split only where each build has three cores.
SPLIT_CORES = 3

FELL_BACK = "[kgen] built"  # how _after's note begins: failure_line skips it, bench/gpu_builds.py prints it


def _after(failed: list[str], built_with: str = "") -> str:
    """The log's last line where faster builds failed first (their logs are not kept, their first errors are)."""
    if not failed:
        return ""
    what = f" with {built_with}" if built_with else ""
    logs = "its log" if len(failed) == 1 else "their logs"
    return f"\n{FELL_BACK}{what}, after a build with kgen's {' and then '.join(failed)}; not kept: {logs} but for those lines\n"


def _build_once(code_path: Path, code_hash: str, build_dir: Path, timeout_s: float, max_jobs: int | None,
                extra_env: dict[str, str] | None, route_env: dict[str, str] | None = None,
                spares: BuildSpares | None = None) -> BuildResult:
    # The child builds into its own out/ folder (the jail lets it write nowhere else), which becomes
    # build_dir once the child is gone: no build can write another's folder or a later attempt's input.
    env = {**(route_env or {}), "MAX_JOBS": str(max_jobs or os.cpu_count() or 1),
           # nvcc's dependency files are for ninja rebuilding after a header edit; a build dir is
           # built once, so they are only cost (torch PR #119936).
           "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES": "1"}
    started = time.monotonic()
    child = spares.take(extra_env or {}, timeout_s) if spares else None
    if child is None:
        child = start_child(extra_env or {}, timeout_s)
    stale: list[Path] = []
    if child.policy is None:  # no jail (KGEN_JAIL=0): the old way, in place
        build_dir.mkdir(parents=True, exist_ok=True)
        stale = clear_stale_locks(build_dir)
        env["TORCH_EXTENSIONS_DIR"] = str(build_dir)
    child.send(protocol.BuildJob(code_path=child.stage(code_path, "candidate.py"), env=env))
    message, problem = None, None
    try:
        message, _ = child.reply()
        if message is not None and not isinstance(message, protocol.BuildDone):
            problem = f"the build sent {type(message).__name__} instead of its result"
    except TimeoutError:
        pass
    except protocol.ProtocolError as exc:
        problem = f"the build broke the protocol: {exc}"
        child.kill()
    code, log = child.finish(keep_out=build_dir if child.policy is not None else None)
    seconds = time.monotonic() - started
    if stale:
        log = f"[kgen] removed stale lock(s) left by a killed build: {', '.join(map(str, stale))}\n" + log
    ok = problem is None and isinstance(message, protocol.BuildDone) and message.ok and code == 0
    if child.timed_out:
        log += f"\n[kgen] build killed after {timeout_s:.0f} s\n"
    elif problem:
        log += f"\n[kgen] {problem}\n"
    elif not ok and message is None:
        log += f"\n[kgen] build process ended with status {code} before reporting\n"
    elif not ok:
        log += f"\n[kgen] {message.error or 'build failed'}\n"
    return BuildResult(code_hash=code_hash, ok=ok and not child.timed_out, timed_out=child.timed_out,
                       log=log, seconds=seconds, build_dir=str(build_dir))


def start_child(env: dict[str, str], timeout_s: float) -> sandbox.Child:
    """A build child, jailed (sandbox.Jail): it reads the fast-build headers, writes its out/ alone,
    and waits for its BuildJob with torch imported."""
    headers_root = cache_root() / "headers"
    headers_root.mkdir(parents=True, exist_ok=True)  # a rule needs the folder before the first build makes it
    return sandbox.start(HARNESS, ["build"], timeout_s, env,
                         jail=sandbox.Jail(read=(str(headers_root),), out=True, gpu=False))


class BuildSpares:
    """Build children started ahead, each with torch imported (seconds before any compiler runs,
    docs/decisions/spares-and-startup.md) and waiting for the one BuildJob it serves; up to `depth` per environment. They
    run no candidate code before the job, which names the build and brings its variables; the child
    confines itself after reading it (harness.run_build), as a fresh one does first thing.

    Started from one thread that lives as long as this object: a child dies with the thread that
    started it (harness.die_with_parent), and a build's thread may end first. Only for builds that
    share no core with a timed kernel (pinned off the lanes' cores, or with nothing timed at all): a
    spare importing torch is CPU work beside whatever runs on its cores."""

    def __init__(self, depth: int = 1):
        self.depth = max(1, depth)
        self._waiting: dict[frozenset, list[sandbox.Child]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._starter = ThreadPoolExecutor(1, thread_name_prefix="kgen-build-spares")

    def take(self, env: dict[str, str], timeout_s: float) -> sandbox.Child | None:
        """A waiting child for `env` with a fresh deadline, or None; either way the next ones start."""
        with self._lock:
            queue = self._waiting.get(frozenset(env.items())) or []
            child = queue.pop(0) if queue else None
            if not self._closed:
                self._starter.submit(self._fill, dict(env))
        if child is None:
            return None
        if child.proc.poll() is not None:  # it died waiting (killed, out of memory): start afresh
            child.finish(grace=0.1)
            return None
        child.started = time.monotonic()
        child.deadline = child.started + timeout_s
        return child

    def fill(self, env: dict[str, str], wait: bool = False) -> None:
        """Start children for `env` until `depth` wait (now, before the first build asks)."""
        with self._lock:
            started = None if self._closed else self._starter.submit(self._fill, dict(env))
        if wait and started is not None:
            started.result()

    def _fill(self, env: dict[str, str]) -> None:
        key = frozenset(env.items())
        while True:
            with self._lock:
                if self._closed or len(self._waiting.setdefault(key, [])) >= self.depth:
                    return
            child = start_child(env, 24 * 3600)
            with self._lock:
                if not self._closed:
                    self._waiting[key].append(child)
                    continue
            child.kill()
            child.finish(grace=0.1)
            return

    def close(self) -> None:
        with self._lock:
            self._closed = True
            waiting, self._waiting = [c for queue in self._waiting.values() for c in queue], {}
        self._starter.shutdown(wait=True)  # a start under way sees _closed and kills its own child
        for child in waiting:
            child.kill()
            child.finish(grace=0.1)


def reusable(known: BuildResult | None) -> BuildResult | None:
    """A stored build worth reusing instead of building again, marked cached: one that succeeded and
    whose folder is still there, or one that failed (the same code fails the same way: a search
    sends a broken kernel back more than once); a timeout may not repeat, so it is built again."""
    if known and ((known.ok and Path(known.build_dir).is_dir()) or not (known.ok or known.timed_out)):
        return known.model_copy(update={"cached": True})
    return None


def failure_line(result: BuildResult) -> str:
    """The line of a build log that says what went wrong, for tables and one-line errors."""
    # Not _after's note: the errors it quotes are the faster routes', not this build's.
    lines = [line for line in result.log.splitlines() if not line.startswith(FELL_BACK)]
    for marker in ("error:", "Error building extension", "[kgen]", "Error", "error"):
        for line in lines:
            if marker in line:
                return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else "build failed"
