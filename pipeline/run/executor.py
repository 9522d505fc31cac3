"""Where builds and evaluations run: local processes, or a Ray cluster.

Either way the unit of work is the same sandboxed child (pipeline.build / pipeline.judge.evaluate); the
executor only decides where that child starts and how many run at once. Results come back to the
driver, which alone writes the database.

    executor = make_executor(cfg, backend)
    built = await executor.build(code_path, code_hash, builds_root, timeout_s)
    bench = await executor.prepare(task, size, backend, settings, known_baselines)
    result = await executor.evaluate(bench, code_path, build_dir, settings)
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from .. import backends
from ..build import build as build_stage
from ..child import HARNESS, PACKAGE_ROOT
from ..child.tasks import TaskFile
from ..config import Config, EvalConfig
from ..judge import bench as bench_stage
from ..judge import evaluate as evaluate_stage
from ..judge import health, refproto
from ..records import BuildResult, EvalResult
from ..sandbox import on_cores, pin_all
from ..sandbox.spares import Spares
from .lanes import LaneFailed, Lanes


class Executor(Protocol):
    lanes: int
    """Evaluations that can run at once (one per visible GPU; one for the cpu backend)."""

    async def build(self, code_path: Path, code_hash: str, builds_root: Path, timeout_s: float) -> BuildResult: ...

    async def prepare(self, task: TaskFile, size: Any, backend: str, settings: EvalConfig,
                      known_baselines: dict[str, str]) -> bench_stage.TaskBench: ...

    async def evaluate(self, bench: bench_stage.TaskBench, code_path: Path, build_dir: Path,
                       settings: EvalConfig, draw: str | None = None) -> EvalResult: ...
    # draw: the siblings whose attempts share their secrets (pipeline.judge.bench.Draws)

    def close(self) -> None: ...


def default_build_workers(cores: int | None = None) -> int:
    """Builds are memory-hungry (nvcc or g++ on torch headers takes ~1.5 GB each); size by cores
    (`cores`: those builds may use) and RAM."""
    cores = cores or os.cpu_count() or 1
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (ValueError, OSError):
        mem_gb = 8
    return max(1, min(cores, int(mem_gb // 2)))


# References a single GPU lane starts ahead of it, at once (each holds its task's inputs on the GPU).
EARLY_REFERENCES = 2
TIMING_CORES = 2  # per GPU lane: its candidate's child and reference process take turns, never at once
MIN_BUILD_CORES = 2


def core_plan(lanes: int, cores: list[int] | None = None) -> tuple[list[list[int]], list[int]] | None:
    """The cores each GPU lane times on and the cores builds may use: TIMING_CORES per lane from the
    front of this process's affinity, the rest for builds, so that a compiler never runs on a core
    a timing child is using (a build's eight nvcc processes beside a timed kernel slowed its host
    side). None where that would leave builds fewer than MIN_BUILD_CORES: nothing is pinned then."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    reserved = lanes * TIMING_CORES
    if lanes < 1 or len(cores) - reserved < MIN_BUILD_CORES:
        return None
    return [cores[i * TIMING_CORES:(i + 1) * TIMING_CORES] for i in range(lanes)], cores[reserved:]


def _cores(cores: list[int]) -> str:
    return ",".join(map(str, cores))


def visible_gpus() -> list[str]:
    """One lane name per GPU this process can use, as a child's CUDA_VISIBLE_DEVICES names it."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return lane_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), count)


def lane_gpus(listed: str | None, count: int) -> list[str]:
    """The GPUs a lane each, from CUDA_VISIBLE_DEVICES (`listed`; None when unset) and the number of
    devices CUDA found (`count`). CUDA reads the list as far as its first entry that names no device
    (-1, a word) and ignores the rest, so a lane is made for those before it only, and for no more
    than `count` of them: "0,1,2,3" on a two-GPU machine is two lanes, not four with two that fail.
    Entries are kept as written (an index, GPU-<uuid>, MIG-<uuid>): a lane's child gets its own."""
    if listed is None:
        return [str(i) for i in range(count)]
    ids: list[str] = []
    for entry in (e.strip() for e in listed.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        ids.append(entry)
    return ids[:count]


def ray_lane_count(resources: dict[str, float], on_gpu: bool) -> int:
    """Ray lane actors: one per GPU in the cluster (each asks for one, so Ray gives each its own), at
    least one (on a cluster with none yet, its actor waits for a GPU to join); on the cpu backend one
    per two of the cluster's cores."""
    if on_gpu:
        return max(1, int(resources.get("GPU", 0)))
    return max(1, int(resources.get("CPU", 1)) // 2)


def _lane_job(fn, watch: health.Watch | None, discard=None, cores: str | None = None):
    """Run `fn` (a blocking stage) on `cores` (the lane's, this thread only: sandbox.on_cores) and
    raise LaneFailed where the lane's device was found unfit."""
    try:
        with on_cores(cores):
            result = fn()
    except Exception as exc:
        if watch is not None and watch.failure:
            raise LaneFailed(watch.failure, exc) from exc
        raise
    if watch is not None and watch.failure:
        if discard is not None:
            discard(result)
        raise LaneFailed(watch.failure, result)
    return result


def _close(bench: bench_stage.TaskBench) -> None:
    bench.close()


class LocalExecutor:
    """Subprocesses on this machine: a build pool sized to cores and memory, one evaluation lane per GPU."""

    def __init__(self, backend: str, build_workers: int = 0, notice: Callable[[str], None] | None = None,
                 fast_builds: bool = True):
        gpus = visible_gpus() if backends.on_gpu(backend) else []
        plan = core_plan(len(gpus)) if gpus else None
        build_cores = plan[1] if plan else None
        if build_cores:
            # This process's clock times every window on a GPU (the one clock): its threads, and all
            # they start, stay off the lanes' cores; a lane's job moves onto its own (_lane_job). Left
            # anywhere, its wake-ups can wait among a batch's builds: with it unpinned, 8 of an H100
            # batch's 40 honest attempts lost their figure or were refused (docs/decisions/spares-and-startup.md).
            pin_all(os.getpid(), _cores(build_cores))
        self.lane_cores = {gpu: _cores(cores) for gpu, cores in zip(gpus, plan[0])} if plan else {}
        self.early_cores = _cores(build_cores) if build_cores else None  # where references and spares start
        self.early: asyncio.Semaphore | None = None  # made in the event loop, by the first prepare
        self.workers = build_workers or default_build_workers(len(build_cores) if build_cores else None)
        self.fast = dict(fast=backends.fast_builds(backend, fast_builds), cuda=backend == "cuda")
        self.notice = notice
        self.jobs = max(1, (len(build_cores) if build_cores else os.cpu_count() or 1) // self.workers)
        self.build_pool = asyncio.Semaphore(self.workers)
        # A build never sees a GPU: it only compiles, for the lanes' architecture (build.arch_list),
        # and on GPU lanes only on the cores no lane times on (core_plan).
        self.build_env = {**build_stage.build_env(gpus), **({"KGEN_CORES": _cores(build_cores)} if build_cores else {})}
        # Build children start ahead with torch imported, on the build cores: only where those are
        # off every lane's (on the cpu backend, or without a core plan, a spare would import torch
        # beside a timed kernel).
        self.build_spares = build_stage.BuildSpares(self.workers) if build_cores else None
        if self.build_spares:
            self.build_spares.fill(self.build_env)  # while the first prompts are answered
        # On the cpu backend the kernel under test shares the cores with compilers: an evaluation
        # takes every build slot, so nothing compiles while something is being timed.
        self.exclusive = not gpus
        self.pool: Lanes[str | None] = Lanes(list(gpus) or [None], notice, name=lambda gpu: f"GPU {gpu}")
        # Not on the cpu backend: a spare loading torch would share the cores with a timed kernel. On
        # GPU lanes with cores to spare, spares start CUDA and the profiler ahead on the build cores.
        self.spares = Spares(HARNESS, ["eval"], cores=self.early_cores) if gpus else None
        # Each GPU is checked fit to time around every attempt (pipeline.judge.health).
        self.watches = {gpu: health.Watch(gpu) for gpu in gpus}

    @property
    def lanes(self) -> int:
        return len(self.pool)

    async def build(self, code_path: Path, code_hash: str, builds_root: Path, timeout_s: float) -> BuildResult:
        async with self.build_pool:
            options = build_stage.BuildOptions(timeout_s, self.jobs, self.build_env, **self.fast)
            return await asyncio.to_thread(build_stage.build, code_path, code_hash, builds_root, options,
                                           self.notice, self.build_spares)

    async def _on_lane(self, fn, *args, key=None, discard=None):
        async def job(lane):
            held = 0
            try:
                if self.exclusive:
                    for _ in range(self.workers):
                        await self.build_pool.acquire()
                        held += 1
                env = {"CUDA_VISIBLE_DEVICES": lane} if lane is not None else {}
                if lane in self.lane_cores:
                    env["KGEN_CORES"] = self.lane_cores[lane]
                watch = self.watches.get(lane)
                return await asyncio.to_thread(_lane_job, lambda: fn(*args, env=env, watch=watch), watch, discard,
                                               env.get("KGEN_CORES"))
            finally:
                for _ in range(held):
                    self.build_pool.release()

        return await self.pool.run(job, key)

    async def prepare(self, task, size, backend, settings, known_baselines):
        if not self.early_cores or len(self.pool) != 1:
            return await self._on_lane(bench_stage.prepare, task, size, backend, settings, known_baselines.get,
                                       key=task.name, discard=_close)
        # One GPU lane with cores to spare: the task's reference process starts now, off the lane, on
        # the build cores (Python, torch, CUDA and the compiler's warm-up: on the lane they put most of a
        # minute between two verdicts at a task switch; docs/decisions/spares-and-startup.md), and moves to
        # the lane's cores when the lane takes it for the baselines, the only part that is timed.
        # At most EARLY_REFERENCES at once, each until its baselines are taken: unbounded, a sweep whose
        # builds all ended together started 60 references on one GPU, and its children ran out of memory.
        if self.early is None:
            self.early = asyncio.Semaphore(EARLY_REFERENCES)
        lane = self.pool.live[0]
        started_with = {"CUDA_VISIBLE_DEVICES": lane, "KGEN_CORES": self.early_cores}
        async with self.early:
            bench = await asyncio.to_thread(bench_stage.open_bench, task, size, backend, settings, started_with, early=True)

            def baselines(env, watch):
                bench.move_reference(started_with, bench_stage.lane_of(env) or {})
                return bench_stage.measure_baselines(bench, known_baselines.get, env, watch)

            try:
                # Its compiler's warm-up, off the lane, ends before the lane is taken: waited for on
                # the lane, it holds the lane idle for seconds while the batch's first attempts wait
                # (docs/decisions/spares-and-startup.md).
                started = time.monotonic()
                await asyncio.to_thread(bench.request, refproto.Settle(), settings.timeout_s, started_with)
                waited = round(time.monotonic() - started, 2)
                bench = await self._on_lane(baselines, key=task.name, discard=_close)
                bench.phases["settle"] = round(waited + bench.phases.get("settle", 0.0), 2)
                return bench
            except BaseException:
                bench.close()
                raise

    async def evaluate(self, bench, code_path, build_dir, settings, draw=None):
        spares = self.spares if settings.warm_start else None
        return await self._on_lane(lambda *args, **kw: evaluate_stage.evaluate(*args, spares=spares, draw=draw, **kw),
                                   bench, code_path, build_dir, settings, key=bench.task.name)

    def close(self) -> None:
        if self.spares:
            self.spares.close()
        if self.build_spares:
            self.build_spares.close()


class _RayLane:
    """One evaluation lane as a Ray actor: Ray gives it one GPU (CUDA_VISIBLE_DEVICES) and it runs
    one call at a time, like a local lane. It keeps each task's reference process alive between
    attempts, a spare child for the next attempt, and its device's health watch."""

    def __init__(self, backend: str):
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip() if backends.on_gpu(backend) else ""
        self.gpu = gpu or None
        self.env = {"CUDA_VISIBLE_DEVICES": gpu} if gpu else {}
        self.watch = health.Watch(gpu) if gpu else None
        self.spares = Spares(HARNESS, ["eval"]) if gpu else None
        self.benches: dict[tuple, bench_stage.TaskBench] = {}

    def name(self) -> str:
        return f"GPU {self.gpu}" if self.gpu else f"actor {os.getpid()}"

    def _failure(self) -> str | None:
        return self.watch.failure if self.watch else None

    def prepare(self, task, size, backend, settings, known_baselines):
        bench = bench_stage.prepare(task, size, backend, settings, known_baselines.get, self.env, self.watch)
        self.benches[(str(task.path), bench.size_name)] = bench
        return bench, self._failure()

    def evaluate(self, bench, code_path, build_dir, settings, draw=None):
        # The bench arrives as a copy without a process; this lane's own copy keeps its reference.
        key = (str(bench.task.path), bench.size_name)
        live = self.benches.get(key)
        if live is None:
            bench.detached = False
            live = self.benches[key] = bench
        spares = self.spares if settings.warm_start else None
        result = evaluate_stage.evaluate(live, code_path, build_dir, settings, self.env, spares, self.watch, draw)
        return result, self._failure()

    def close(self) -> None:
        for bench in self.benches.values():
            bench.close()
        if self.spares:
            self.spares.close()


class RayExecutor:
    """Builds as CPU tasks and one lane actor per GPU on a Ray cluster (a local one started here when
    no address is given); each still starts the same sandboxed child. Code and build folders must be
    on a filesystem every node sees."""

    def __init__(self, backend: str, address: str | None, notice: Callable[[str], None] | None = None,
                 fast_builds: bool = True):
        try:
            import ray
        except ImportError:
            raise ValueError("executor: ray needs the ray package (pip install 'ray>=2.9')") from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                         [PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")])}})
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0)) if backends.on_gpu(backend) else 0
        count = ray_lane_count(resources, backends.on_gpu(backend))
        device = {"num_gpus": 1} if gpus else {"num_cpus": 1}
        lane = ray.remote(max_restarts=0, max_concurrency=1, **device)(_RayLane)
        self.actors = [lane.remote(backend) for _ in range(count)]
        names = ray.get([actor.name.remote() for actor in self.actors])
        self.names = dict(zip(self.actors, names))
        self.pool = Lanes(self.actors, notice, name=self.names.get)
        # Builds get no GPU from Ray, and build_env hides any the node has.
        self._build = ray.remote(num_cpus=1, num_gpus=0, max_retries=0)(build_stage.build)
        self.build_env = build_stage.build_env(["0"] * gpus)
        # Each node precompiles its own headers (pipeline/build/headers.py) in its first build.
        self.fast = dict(fast=backends.fast_builds(backend, fast_builds), cuda=backend == "cuda")

    @property
    def lanes(self) -> int:
        return len(self.pool)

    async def build(self, code_path, code_hash, builds_root, timeout_s):
        return await self._build.remote(code_path, code_hash, builds_root,
                                        build_stage.BuildOptions(timeout_s, 1, self.build_env, **self.fast))

    async def _on_lane(self, method: str, key: str, *args):
        async def job(actor):
            result, failure = await getattr(actor, method).remote(*args)
            if failure:
                raise LaneFailed(failure, result)
            return result

        return await self.pool.run(job, key)

    async def prepare(self, task, size, backend, settings, known_baselines):
        return await self._on_lane("prepare", task.name, task, size, backend, settings, dict(known_baselines))

    async def evaluate(self, bench, code_path, build_dir, settings, draw=None):
        return await self._on_lane("evaluate", bench.task.name, bench, code_path, build_dir, settings, draw)

    def close(self) -> None:
        try:
            self.ray.get([actor.close.remote() for actor in self.actors], timeout=60)
        except Exception:  # an actor that died has nothing left to close
            pass
        self.ray.shutdown()


def make_executor(cfg: Config, backend: str, notice: Callable[[str], None] | None = None) -> Executor:
    """`notice` gets one line when a lane is taken out of service."""
    if cfg.executor == "ray":
        return RayExecutor(backend, cfg.ray_address, notice, cfg.fast_builds)
    return LocalExecutor(backend, cfg.build_workers, notice, cfg.fast_builds)
