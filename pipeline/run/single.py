"""`kgen eval`: judge one candidate file written anywhere, with the same evaluator as a batch.

Alone, each evaluation starts everything it needs and ends it. Given a `Warm` (what `kgen serve`
keeps, pipeline.run.serve), the task's bench (its reference process, warm compiler and baselines), the
next candidate's child and the lane's health watch outlive the evaluation, as they do in a batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import backends, bundled
from ..build import build as build_stage
from ..child import HARNESS, sizes, tasks
from ..config import Config, EvalConfig
from ..generate import feedback
from ..judge import evaluate, health
from ..judge.bench import measure_baselines, open_bench
from ..judge.bench import TaskBench
from ..policy import POLICY
from ..records import BuildResult, EvalResult, FileRequest, Provenance, Verdict
from ..sandbox.spares import Spares
from .batch import remember_baselines, resolve_backend


def _task(name: str, cfg: Config | None) -> tasks.TaskFile:
    if name.endswith(".py") or "/" in name:
        return tasks.load_file(Path(name))
    if cfg is None:
        return tasks.discover(bundled.path("reference_tasks"), [name])[0]
    from .kernelbench import find_task

    return find_task(cfg, name)


def eval_size(size: str | None, cfg: Config | None, task: tasks.TaskFile, named_file: bool) -> str:
    """The size `kgen eval` judges `task` at, the same whether this process judges it or `kgen serve`
    does (both call evaluate_file with the request as given): `size` (--size) where given; else the
    config's tasks.size where a config file is loaded; else, for a bundled task named without a config,
    the bundled demo's size; else, for a task file (`named_file`), the size the file states: its
    KGEN_SIZES["small"] where it declares one, else the file as written ("default"), never a "small"
    derived from a size the file does not state."""
    if size:
        return size
    if cfg is not None:
        return cfg.tasks.size
    if not named_file:
        from ..config import load_config

        return load_config(bundled.path(bundled.DEMO_CONFIG)).tasks.size
    stated = sizes.size_presets(tasks.load_module(task, sizes.DEFAULT_SIZE))
    return sizes.SMALL_SIZE if sizes.SMALL_SIZE in stated else sizes.DEFAULT_SIZE


@dataclass
class Warm:
    """What a long-lived evaluator (`kgen serve`) keeps between evaluations, as a batch keeps it
    between attempts: each task's bench, a spare child per environment, a health watch per lane.
    A bench is retired after `max_age_s`, so the held-out shapes it drew are drawn again as they
    would be for a new run, and at most `max_benches` are kept (the oldest is closed first)."""

    max_age_s: float = 1800.0
    max_benches: int = 4
    benches: dict[str, tuple[TaskBench, float]] = field(default_factory=dict)  # key -> (bench, opened at)
    spares: Spares = field(default_factory=lambda: Spares(HARNESS, ["eval"],
                                                                          refill=False))
    watches: dict[str, health.Watch] = field(default_factory=dict)

    def bench(self, key: str) -> TaskBench | None:
        """The kept bench for `key` whose reference processes are all alive and young enough, or None."""
        kept = self.benches.get(key)
        if kept is None:
            return None
        bench, opened = kept
        if time.monotonic() - opened > self.max_age_s or any(r.proc.poll() is not None for r in bench.references.values()):
            self.drop(key)
            return None
        bench.phases = {}  # this evaluation's figures only: nothing was started for it
        return bench

    def keep(self, key: str, bench: TaskBench) -> None:
        if key not in self.benches:
            self.benches[key] = (bench, time.monotonic())
        while len(self.benches) > self.max_benches:
            self.drop(next(iter(self.benches)))

    def drop(self, key: str) -> None:
        kept = self.benches.pop(key, None)
        if kept:
            kept[0].close()

    def watch(self, backend: str) -> health.Watch | None:
        """The lane's watch, kept: its first fit probe is what later evaluations are held to."""
        if not backends.on_gpu(backend):
            return None
        lane = os.environ.get("CUDA_VISIBLE_DEVICES") or ""
        if lane not in self.watches:
            self.watches[lane] = _watch(backend)
        return self.watches[lane]

    def close(self) -> None:
        for key in list(self.benches):
            self.drop(key)
        self.spares.close()


def _watch(backend: str) -> health.Watch | None:
    """A health watch for this process's GPU lane where `backend` runs on a GPU."""
    return health.Watch(os.environ.get("CUDA_VISIBLE_DEVICES")) if backends.on_gpu(backend) else None


def evaluate_file(request: FileRequest, cfg: Config | None, *, db_path: Path | None = None, warm: Warm | None = None,
                  on_size: Callable[[str, dict[str, int]], None] | None = None,
                  notice: Callable[[str], None] | None = None) -> tuple[EvalResult, str | None]:
    """Build, check and time the file; returns the result and, when stored, the attempt id.

    The size is checked first: a size the task does not have, or one that does not fit in memory,
    is a sizes.SizeError (a ValueError, one line) before anything is written, built or started.
    `on_size` gets the size's effective name (what is stored) and its dimensions (sizes.size_dims);
    `notice` a line for anything slow that happens once (precompiling headers for fast builds).
    The request's grad and dtype, where given, override the config's evaluation.grad and
    evaluation.dtype; `db_path` the config's database. The result is stored as a run of its own, of
    kind "eval", which the leaderboard, report and library leave out unless asked for it. With
    `warm`, what it keeps is used and kept up (Warm)."""
    path, task_name, backend, size = Path(request.path), request.task, request.backend, request.size
    grad, dtype, code, store = request.grad, request.dtype, request.code, request.store
    task = _task(task_name, cfg)
    chosen_size = eval_size(size, cfg, task, named_file=task_name.endswith(".py") or "/" in task_name)
    module = tasks.load_module(task, chosen_size, dtype)
    size_name = sizes.effective_size(module, chosen_size)
    backend, gpu = resolve_backend(backend, cfg.auto_backends if cfg else ("cuda", "cpu"))
    if backend == "cuda" and not gpu:
        raise ValueError("--backend cuda: no CUDA device is visible on this machine")
    device = backends.device_for(backend)
    sizes.check_memory(module, device, health.gpu_free_bytes(None) if device == "cuda" else None,
                        factor=POLICY.memory_factor[device])
    if on_size:
        on_size(size_name, sizes.size_dims(module))
    settings = cfg.evaluation if cfg else EvalConfig()
    settings = settings.model_copy(update={k: v for k, v in (("grad", grad), ("dtype", dtype)) if v is not None})
    code = path.read_text() if code is None else code
    code_hash = hashlib.sha256(code.encode()).hexdigest()[:16]
    generated = cfg.path(cfg.generated_dir) if cfg else Path("generated")
    generated.mkdir(parents=True, exist_ok=True)
    code_path = generated / f"{code_hash}.py"
    if not code_path.exists():
        code_path.write_text(code)
    db_path = db_path or (cfg.path(cfg.database) if cfg else Path("db/kgen.db"))
    # On a GPU the candidate's child starts now, beside the build and the reference process: loading
    # Python and torch, then CUDA and the profiler, is about ten seconds of an evaluation's wall on a GPU
    # (docs/decisions/spares-and-startup.md). It touches no device until the baselines are timed.
    # Kept warm, a spare waits already (started after the last evaluation) and the next is started
    # once this one is over.
    spares = warm.spares if warm else (
        Spares(HARNESS, ["eval"], refill=False) if backends.on_gpu(backend) else None)
    child_env, init = evaluate.child_environment(backend), evaluate.spare_init(backend, settings)
    if spares:
        spares.spawn(child_env, init)
    job = FileJob(path=path, task=task, backend=backend, size=chosen_size, size_name=size_name, settings=settings,
                  code_hash=code_hash, code_path=code_path,
                  builds_root=cfg.path(cfg.build_dir) if cfg else Path("builds"),
                  fast_builds=backends.fast_builds(backend, cfg.fast_builds if cfg else True))
    try:
        return _judge_file(job, db_path if store else None, spares, notice, warm)
    finally:
        # Kept warm, the next child starts its device (CUDA and the profiler take seconds) while
        # the server waits for the next request, not on that request's path. Nothing timed runs
        # beside it but a new task's baselines and health probe, should a request come at once; the
        # speedups are ratios timed while the candidate's child is the only one (no refill).
        if warm:
            spares.spawn(child_env, init)
            spares.release(child_env)
        elif spares:
            spares.close()


@dataclass(frozen=True)
class FileJob:
    """One `kgen eval`, its inputs checked: what the build, the judge and the store need."""

    path: Path  # the file as the user named it (the run's note)
    task: tasks.TaskFile
    backend: str
    size: str  # as chosen (a preset's name, or the config's)
    size_name: str  # what is stored (sizes.effective_size)
    settings: EvalConfig
    code_hash: str
    code_path: Path  # the copy under generated/ that is built and judged
    builds_root: Path
    fast_builds: bool

    @property
    def bench_key(self) -> str:
        """What a kept bench must match: the task file as it is now, the size, backend and settings."""
        return json.dumps([str(self.task.path.resolve()), self.task.sha, self.size, self.backend,
                           self.settings.model_dump(mode="json")], sort_keys=True, default=str)


def _build_beside_reference(job: FileJob, db, notice: Callable[[str], None] | None,
                            kept: TaskBench | None = None) -> tuple[BuildResult, TaskBench]:
    """The candidate's build, and the task's bench with its reference process started beside it
    (warming its compiler up): the reference never imports the candidate, and nothing is timed
    until the build has ended (measure_baselines). A build the database records for this code and
    torch (ok and still on disk, or failed) is reused, as a batch reuses it. The build runs in the
    worker thread, which lives until its build child has ended; the reference is started from the
    calling thread, because a child dies with the thread that started it (PR_SET_PDEATHSIG,
    harness.die_with_parent): started from a worker thread that then ended, it was killed mid-`expect`.
    A `kept` bench (Warm) is used as it is."""
    import torch

    built = build_stage.reusable(db.get_build(job.code_hash, torch.__version__)) if db else None
    with ThreadPoolExecutor(1) as pool:
        options = build_stage.BuildOptions(job.settings.build_timeout_s, fast=job.fast_builds, cuda=job.backend == "cuda",
                                           env=build_stage.build_env(["0"] if backends.on_gpu(job.backend) else []))
        building = None if built else pool.submit(
            build_stage.build, job.code_path, job.code_hash, job.builds_root, options, notice)
        try:
            bench = kept or open_bench(job.task, job.size, job.backend, job.settings,
                                                memory_checked=True)  # evaluate_file did
        except BaseException:
            if building:
                building.result()
            raise
        if building:
            try:
                built = building.result()
            except BaseException:
                if not kept:
                    bench.close()
                raise
            if db:
                db.save_build(built, job.backend, torch.__version__)
    return built, bench


def _judge_file(job: FileJob, db_path: Path | None, spares: Spares | None,
                notice: Callable[[str], None] | None, warm: Warm | None = None) -> tuple[EvalResult, str | None]:
    """evaluate_file once its inputs are checked: build, judge, store (db_path None: not stored)."""
    import torch

    from ..store.store import Store

    db = Store.open(db_path) if db_path else None
    started = time.monotonic()
    key = job.bench_key
    kept = warm.bench(key) if warm else None
    built, bench = _build_beside_reference(job, db, notice, kept)
    if warm:  # kept whatever this candidate does: its reference process is the task's, not the candidate's
        warm.keep(key, bench)
    if not built.ok:
        if not warm:
            bench.close()
        verdict = Verdict.build_timeout if built.timed_out else Verdict.build_failed
        result = EvalResult(verdict=verdict, error=build_stage.failure_line(built), detail=built.log[-4000:])
    else:
        watch = warm.watch(job.backend) if warm else _watch(job.backend)
        prepared = time.monotonic()
        ended = False
        try:
            if bench.baselines is None:
                measure_baselines(bench, db.get_baseline if db else None, watch=watch, settle=False)
                if db:
                    remember_baselines(db, bench)
            if spares:  # CUDA starts while the expected values are made
                spares.release(evaluate.child_environment(job.backend))
            result = evaluate.evaluate(bench, job.code_path, Path(built.build_dir), job.settings, spares=spares,
                                       watch=watch)
            ended = True
        finally:
            if not warm:
                bench.close()
            elif not ended:  # the bench failed (its reference died or sent nothing): start afresh next time
                warm.drop(key)
        # The whole command's stages, not only the child's: the build (or finding it stored), the
        # reference process's start-up (beside the build, so not part of the sum) and baselines,
        # then the evaluation's own phases.
        result = feedback.explained(result)  # the traceback's lines that say why (pipeline.generate.feedback)
        result = result.model_copy(update={"phases": {"build": round(prepared - started, 2),
                                                      **{f"reference_{k}": v for k, v in bench.phases.items()},
                                                      **result.phases}})
    if not db:
        return result, None
    run_id = db.start_run(json.dumps({"eval": str(job.path)}), "[]", job.backend, result.device or job.backend,
                          torch.__version__, torch.version.cuda, note=f"kgen eval {job.path}", kind="eval")
    task_id = db.upsert_task(job.task.name, str(job.task.path), job.task.source)
    attempt_id = db.save_attempt(Provenance(run_id=run_id, task_id=task_id, task=job.task.name, model="(file)",
                                            sample=0, backend=job.backend, template="-", completion_id=None,
                                            code_hash=job.code_hash, size=job.size_name, level=job.task.level,
                                            problem=job.task.problem), result)
    db.finish_run(run_id, "done")
    db.close()
    return result, attempt_id
