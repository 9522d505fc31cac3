"""Where builds and evaluations run: local processes, or a Ray cluster.

Either way the unit of work is the same sandboxed child (pipeline.build / pipeline.evaluate); the
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
from pathlib import Path
from typing import Any, Protocol

from . import build as build_stage
from . import evaluate as evaluate_stage
from . import health, sandbox
from .config import Config, EvalConfig
from .records import BuildResult, EvalResult
from .child.tasks import TaskFile


class Executor(Protocol):
    lanes: int
    """Evaluations that can run at once (one per visible GPU; one for the cpu backend)."""

    async def build(self, code_path: Path, code_hash: str, builds_root: Path, timeout_s: float) -> BuildResult: ...

    async def prepare(self, task: TaskFile, size: Any, backend: str, settings: EvalConfig,
                      known_baselines: dict[str, str]) -> evaluate_stage.TaskBench: ...

    async def evaluate(self, bench: evaluate_stage.TaskBench, code_path: Path, build_dir: Path,
                       settings: EvalConfig) -> EvalResult: ...

    def close(self) -> None: ...


def default_build_workers() -> int:
    """Builds are memory-hungry (nvcc or g++ on torch headers takes ~1.5 GB each); size by cores and RAM."""
    cores = os.cpu_count() or 1
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (ValueError, OSError):
        mem_gb = 8
    return max(1, min(cores, int(mem_gb // 2)))


def visible_gpus() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in listed.split(",") if d.strip()] if listed else []
    return ids or [str(i) for i in range(torch.cuda.device_count())]


class LocalExecutor:
    """Subprocesses on this machine: a build pool sized to cores and memory, one evaluation lane per GPU."""

    def __init__(self, backend: str, build_workers: int = 0):
        self.workers = build_workers or default_build_workers()
        self.jobs = max(1, (os.cpu_count() or 1) // self.workers)
        self.build_pool = asyncio.Semaphore(self.workers)
        gpus = visible_gpus() if backend == "cuda" else []
        self.lanes = max(1, len(gpus))
        # On the cpu backend the kernel under test shares the cores with compilers: an evaluation
        # takes every build slot, so nothing compiles while something is being timed.
        self.exclusive = backend == "cpu"
        self.free: asyncio.Queue[str | None] = asyncio.Queue()
        for gpu in gpus or [None]:
            self.free.put_nowait(gpu)
        # Not on the cpu backend: a spare loading torch would share the cores with a timed kernel.
        self.spares = sandbox.Spares("pipeline.child.harness", ["eval"]) if gpus else None
        # Each GPU is checked fit to time around every attempt (pipeline.health).
        self.watches = {gpu: health.Watch(gpu) for gpu in gpus}

    async def build(self, code_path: Path, code_hash: str, builds_root: Path, timeout_s: float) -> BuildResult:
        async with self.build_pool:
            return await asyncio.to_thread(build_stage.build, code_path, code_hash, builds_root, timeout_s, self.jobs)

    async def _on_lane(self, fn, *args):
        lane = await self.free.get()  # a device runs one child at a time, so timings stay true
        held = 0
        try:
            if self.exclusive:
                for _ in range(self.workers):
                    await self.build_pool.acquire()
                    held += 1
            env = {"CUDA_VISIBLE_DEVICES": lane} if lane is not None else {}
            return await asyncio.to_thread(fn, *args, env=env, watch=self.watches.get(lane))
        finally:
            for _ in range(held):
                self.build_pool.release()
            self.free.put_nowait(lane)

    async def prepare(self, task, size, backend, settings, known_baselines):
        return await self._on_lane(evaluate_stage.prepare, task, size, backend, settings, known_baselines.get)

    async def evaluate(self, bench, code_path, build_dir, settings):
        spares = self.spares if settings.warm_start else None
        return await self._on_lane(lambda *args, **kw: evaluate_stage.evaluate(*args, spares=spares, **kw),
                                   bench, code_path, build_dir, settings)

    def close(self) -> None:
        if self.spares:
            self.spares.close()


class RayExecutor:
    """Builds as CPU tasks and evaluations as one-GPU tasks on a Ray cluster; each still starts the
    same sandboxed child. Code and build folders must be on a filesystem every node sees."""

    def __init__(self, backend: str, address: str | None):
        try:
            import ray
        except ImportError:
            raise ValueError("executor: ray needs the ray package (pip install 'ray>=2.9')") from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                         [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])}})
        gpus = int(ray.cluster_resources().get("GPU", 0)) if backend == "cuda" else 0
        self.lanes = max(1, gpus) if backend == "cuda" else max(1, int(ray.cluster_resources().get("CPU", 1)) // 2)
        device = {"num_gpus": 1} if backend == "cuda" else {"num_cpus": 1}
        self._build = ray.remote(num_cpus=1, max_retries=0)(build_stage.build)
        self._prepare = ray.remote(max_retries=0, **device)(evaluate_stage.prepare_detached)
        self._evaluate = ray.remote(max_retries=0, **device)(evaluate_stage.evaluate)

    async def build(self, code_path, code_hash, builds_root, timeout_s):
        return await self._build.remote(code_path, code_hash, builds_root, timeout_s, 1)

    async def prepare(self, task, size, backend, settings, known_baselines):
        return await self._prepare.remote(task, size, backend, settings, dict(known_baselines).get)

    async def evaluate(self, bench, code_path, build_dir, settings):
        return await self._evaluate.remote(bench, code_path, build_dir, settings)

    def close(self) -> None:
        self.ray.shutdown()


def make_executor(cfg: Config, backend: str) -> Executor:
    if cfg.executor == "ray":
        return RayExecutor(backend, cfg.ray_address)
    return LocalExecutor(backend, cfg.build_workers)
