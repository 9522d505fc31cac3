"""The parent's side of evaluation: the reference process, the candidate's child, and the session
between them that ends in a verdict (pipeline.judge decides each check).

    bench = prepare(task, "small", "cpu", settings)          # one reference process per task and run
    result = evaluate(bench, code_path, build_dir, settings)  # one fresh sandboxed child per attempt
    bench.close()

Every attempt draws its own seeds (weights, trials, timed and bound calls) from os.urandom; the
long-lived reference process computes that attempt's expected outputs, in full and in float64,
before the candidate's child does anything on the device. The child learns each call's seed only in
the request that makes the call (pipeline.child.protocol); on the cpu the reference process also
packs each Bound call's inputs, which the parent writes into the child's inbox once its clock runs.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import backends, health, sandbox
from .child import protocol as P
from .child import memory, sizes, tasks
from .child.timing import BLOCK, TIMING_VERSION, calls_for, summarize_blocks
from .config import EvalConfig, cache_root
from .judge import Expected
from .records import Baselines, EvalResult, Flag, Timing, TrialResult, Verdict

EVALUATOR_VERSION = "2"
NO_CUSTOM_KERNEL_FRACTION = 0.5  # share of the call's time in PyTorch's own ops that raises the flag
# Null-model Bound requests before import: what a block costs besides the calls. Fifteen, not five:
# on the 2-core box in gradient mode about half of them stalled 1.5-2 ms, and where all five did the
# fastest was as slow as the candidate's own requests, so the estimate said nothing and the red
# team's forged clock was judged correct (two fresh-clone CI runs of four); each costs a few ms.
CALIBRATION_BLOCKS = 15
BOUND_REQUESTS = 5  # at least: the parent's estimate is the fastest of them (pipeline.judge.parent_estimate)
# On the cpu, Bound requests of one call each: with three spinning processes a core, a request of
# four 2.4 ms calls was always preempted (the fastest of five read 5.5 ms a call) and an honest kernel
# was refused; a one-call request fits between preemptions often enough for its fastest to count.
CPU_BOUND_REQUESTS = 12
CHECKED_TIMED = 16  # timed calls whose outputs are compared in full, chosen in secret per attempt
BOUND_SET_BYTES = 8 << 30  # input bytes a Bound request may hold at once
# On the cpu, Bound inputs come from the parent through the inbox, up to this many bytes a request:
# making the values in the child (torch's normal_, about 7 ms per million values on one core) costs
# ten times an mse call, and its noise would drown the calls in the parent's clock.
INBOX_BYTES = 1 << 30
HARNESS = "pipeline.child.harness"


class EvaluationError(RuntimeError):
    """The reference itself could not be computed (a broken task), so no candidate can be judged."""


def _seed() -> int:
    return int.from_bytes(os.urandom(6), "little")


@dataclass
class TaskBench:
    """One task in one run: its reference process (kept alive between attempts), baselines and sizes."""

    task: tasks.TaskFile
    size: str | dict[str, Any]
    size_name: str
    backend: str
    device: str
    tolerance: float
    settings: EvalConfig
    other_sizes: list[str] = field(default_factory=list)
    timed_calls: int = 0
    baselines: Baselines | None = None
    env: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # the reference process's seconds per stage
    references: dict[frozenset, sandbox.Child] = field(default_factory=dict)
    detached: bool = False  # a copy in another process (Ray): its references end with each attempt
    suspect: str | None = None  # why the baselines were measured on a device unfit to time (never cached)

    def __getstate__(self):  # a bench sent to another process starts its own reference there
        return {**self.__dict__, "references": {}, "detached": True}

    def _reference(self, env: dict[str, str] | None) -> sandbox.Child:
        """The reference process for a lane (its CUDA_VISIBLE_DEVICES): it computes on the lane's own
        GPU, so it never runs beside another lane's timing."""
        key = frozenset((env or {}).items())
        ref = self.references.get(key)
        if ref is not None and ref.proc.poll() is None:
            return ref
        ref = sandbox.start("pipeline.reference", [], 24 * 3600, {**compile_cache_env(), **(env or {})})
        ref.send({"task_path": str(self.task.path.resolve()), "device": self.device,
                  "threads": self.settings.cpu_threads, "dtype": self.settings.dtype, "grad": self.settings.grad,
                  "warm_compiler": self.settings.compile_baseline})
        ready = ref.receive()
        if not ready or ready.get("event") != "ready":
            _, log = ref.finish()
            raise EvaluationError(f"task {self.task.name}: reference process failed to start: {_tail(log)}")
        self.env = {k: ready[k] for k in ("device_name", "torch_version", "cuda_version")}
        self.references[key] = ref
        return ref

    def request(self, message: dict[str, Any], timeout: float, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Send the lane's reference one request; its messages up to `done`."""
        ref = self._reference(env)
        ref.deadline = time.monotonic() + timeout
        ref.send(message)
        out = []
        while (msg := ref.receive()) is not None and msg.get("event") != "done":
            out.append(msg)
        if msg is None:
            _, log = ref.finish()
            self.references.pop(frozenset((env or {}).items()), None)
            raise EvaluationError(f"task {self.task.name}: reference process failed on {message['op']}: {_tail(log)}")
        return out

    def expect(self, init_seed: int, specs: dict[str, dict[str, Any]], directory: str,
               env: dict[str, str] | None = None) -> tuple[dict[str, Expected], dict[str, str]]:
        """Expected outputs for this attempt's seeds, written whole into `directory`, and the files of
        the packed inputs the specs ask for (`"inputs": True`)."""
        msgs = self.request({"op": "expect", "init_seed": init_seed, "dir": directory,
                             "specs": [{"key": k, **v} for k, v in specs.items()]}, self.settings.timeout_s * 2, env)
        found = [m for m in msgs if m.get("event") == "expected"]
        return ({m["key"]: Expected(m["shape"], m["numel"], m["ref_dtype"], m["path"], m.get("fp32_rel_err"),
                                    m.get("parts") if self.settings.grad else None, m.get("rel_errs"),
                                    m.get("dtypes"))
                 for m in found if "shape" in m}, {m["key"]: m["inputs_path"] for m in found if "inputs_path" in m})

    def move_reference(self, started_with: dict[str, str], lane: dict[str, str]) -> None:
        """The reference started with `started_with` (a lane's GPU, other cores) now serves `lane`:
        every thread of every process in its session moves to the lane's cores (KGEN_CORES)."""
        ref = self.references.pop(frozenset(started_with.items()), None)
        if ref is None:
            return
        self.references[frozenset(lane.items())] = ref
        for pid in sandbox.session_members(ref.proc.pid):
            sandbox.pin_all(pid, lane.get("KGEN_CORES"))

    def close(self) -> None:
        references, self.references = list(self.references.values()), {}
        for ref in references:
            ref.kill()
            ref.finish(grace=0.1)


def compile_cache_env() -> dict[str, str]:
    """Where the reference process keeps torch.compile's caches (inductor's graphs and generated
    code, Triton's kernels): one folder that outlives it (KGEN_CACHE_DIR, default ~/.cache/kgen).
    A child's own HOME and TMPDIR are private and die with it, so without this every reference
    process compiled each task from nothing: 15 s of a 40 s `kgen eval` on the cpu, 9 s of a task's
    first attempt on each GPU lane. Only reference processes write here; a candidate's child can
    write nowhere but its own temp dir (Landlock), so it cannot plant code the reference would load."""
    root = cache_root()
    # Inductor keeps its precompiled header for cpu kernels (149 MB, about 5 s of g++) under the
    # temp folder whatever TORCHINDUCTOR_CACHE_DIR says (torch._inductor.codecache._HEADER_DIR), so
    # the reference's temp folder is one that outlives it too.
    tmp = root / "reference-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton"),
            "TMPDIR": str(tmp)}


def lane_of(env: dict[str, str]) -> dict[str, str] | None:
    """The part of a child's environment that names its GPU lane and the lane's cores (KGEN_CORES),
    which keys the lane's reference process and pins it beside the lane's children."""
    return {k: v for k, v in env.items() if k in ("CUDA_VISIBLE_DEVICES", "KGEN_CORES")} or None


def device_for(backend: str) -> str:
    return backends.device_for(backend)


def prepare(task: tasks.TaskFile, size: str | dict[str, Any], backend: str, settings: EvalConfig,
            cached_baselines: Callable[[str], str | None] | None = None,
            env: dict[str, str] | None = None, watch: health.Watch | None = None) -> TaskBench:
    """Start the task's reference process and get its baselines (from `cached_baselines(key)` when
    it has them); the bench then serves every attempt of the task in this run. With `watch`, the
    device is checked before and after they are measured (pipeline.health)."""
    return measure_baselines(open_bench(task, size, backend, settings, env), cached_baselines, env, watch)


def open_bench(task: tasks.TaskFile, size: str | dict[str, Any], backend: str, settings: EvalConfig,
               env: dict[str, str] | None = None) -> TaskBench:
    """The task's bench with its reference process started (and, where torch.compile is timed,
    warming its compiler up), but no baselines yet: `kgen eval` opens it beside the build."""
    module = tasks.load_module(task, size, settings.dtype)
    if device_for(backend) != "cuda":  # on cuda, asking for free memory would open a CUDA context in this process
        memory.check_memory(module, device_for(backend), env=env)
    bench = TaskBench(task, size, sizes.effective_size(module, size), backend, device_for(backend),
                      tasks.tolerance(module, settings.tolerance), settings,
                      other_sizes=_held_out(module, size) if settings.check_shapes else [])
    started = time.monotonic()
    bench._reference(env)
    bench.phases = {"startup": round(time.monotonic() - started, 2)}
    return bench


def measure_baselines(bench: TaskBench, cached_baselines: Callable[[str], str | None] | None = None,
                      env: dict[str, str] | None = None, watch: health.Watch | None = None,
                      settle: bool = True) -> TaskBench:
    """The bench's baselines: from `cached_baselines(key)` when it has them, else timed now by its
    reference process (see `prepare`). With `settle`, cached ones also wait for the reference's
    compiler warm-up (pipeline.reference.CompilerWarmup): in a batch, another task's candidate may
    be timed on this lane as soon as this returns, and must not share the cpu with it. `kgen eval`,
    alone on its machine, leaves it running beside its `expect` (its session settles before the
    child's calibration)."""
    task, size, settings = bench.task, bench.size, bench.settings
    ready_at = time.monotonic()
    cached = cached_baselines(baseline_key(bench)) if cached_baselines else None
    if cached is None:  # the compiler's warm-up ends first, timed apart (the run's `reference` line)
        bench.request({"op": "settle"}, settings.timeout_s, env)
        bench.phases["settle"] = round(time.monotonic() - ready_at, 2)
        ready_at = time.monotonic()
    if cached is None and watch is not None:
        bench.suspect = watch.check(bench, env)
    if cached is not None:
        bench.baselines = Baselines.model_validate_json(cached)
        if settle:
            bench.request({"op": "settle"}, settings.timeout_s, env)
    else:
        seeds = [_seed() for _ in range(max(settings.timed_calls, settings.max_timed_calls))]
        msgs = bench.request({"op": "baselines", "size": size, "init_seed": _seed(), "baseline_seeds": seeds,
                              "warmup": settings.warmup_calls, "compile_baseline": settings.compile_baseline,
                              "timed_ms": settings.timed_ms, "timed_calls": settings.timed_calls,
                              "max_timed_calls": settings.max_timed_calls}, settings.timeout_s * 4, env)
        found = [m for m in msgs if m.get("event") == "baselines"]
        if not found:
            bench.close()
            raise EvaluationError(f"task {task.name}: the reference process sent no baselines")
        bench.baselines = _baselines(found[0])
        if watch is not None and bench.suspect is None:
            bench.suspect = watch.check(bench, env)
    b = bench.baselines
    bench.timed_calls = timed_count(settings, *([t.median_ms for t in (b.eager, b.compiled) if t] if b else []))
    bench.phases["baselines"] = round(time.monotonic() - ready_at, 2)
    return bench


def _held_out(module, size) -> list[str]:
    """The sizes every correct candidate is also run at: the task's other declared presets (not its
    huge default), then one smaller and one larger shape drawn for this run (sizes.held_out_sizes),
    which no prompt showed; a failure at any is flagged shape_specialized."""
    declared = sizes.other_sizes(module, size)
    return declared + [s for s in sizes.held_out_sizes(module, random.SystemRandom()) if s not in declared]


def timed_count(settings: EvalConfig, *baseline_ms: float | None) -> int:
    """Timed calls for this task: more when its faster baseline is short (timing.calls_for); a kernel
    worth keeping is at least about that fast, and baselines and candidates then get the same rule."""
    fastest = min((t for t in baseline_ms if t), default=None)
    return calls_for(fastest, settings.timed_ms, settings.timed_calls, settings.max_timed_calls)


def baseline_key(bench: TaskBench) -> str:
    env, s = bench.env, bench.settings
    mode = [s.dtype] if s.dtype != "float32" else []
    mode += ["grad"] if s.grad else []  # forward plus backward is another baseline
    return ":".join([bench.task.name, bench.task.sha, bench.size_name, bench.backend, env["device_name"],
                     env["torch_version"], f"timing{TIMING_VERSION}", *mode])


def _baselines(msg: dict[str, Any]) -> Baselines:
    return Baselines(eager=Timing(**msg["eager"]), compiled=Timing(**msg["compiled"]) if "compiled" in msg else None,
                     floor_ms=msg["floor_ms"], bandwidth_gbs=msg["bandwidth_gbs"], input_bytes=msg["input_bytes"],
                     eager_plain_ms=msg.get("eager_plain_ms"), compiled_plain_ms=msg.get("compiled_plain_ms"))


def _tail(log: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in log.strip().splitlines()[-lines:]) or "(no output)"


@dataclass
class AttemptPlan:
    """One attempt's secrets: every seed, and which timed and bound calls are checked in full."""

    init_seed: int
    warm_seed: int
    trials: list[P.Trial]
    timed: list[list[int]]  # seeds per timed block
    bounds: list[list[int]]  # seeds per Bound request
    checked: dict[str, dict[str, Any]]  # expected-output key -> {size, seed, variant}
    inbox: bool = False  # Bound inputs come from the parent (their reference specs ask for "inputs")
    size: str | dict[str, Any] = ""  # the main size, at which every timed and bound call runs

    @staticmethod
    def draw(bench: TaskBench) -> AttemptPlan:
        s = bench.settings
        variants = tasks.VARIANTS
        trials = [P.Trial(index=i, seed=_seed(), variant=variants[i % len(variants)], size=bench.size)
                  for i in range(s.trials)]
        trials += [P.Trial(index=s.trials + j, seed=_seed(), variant="scaled", size=other, repeat=False)
                   for j, other in enumerate(bench.other_sizes)]
        n = bench.timed_calls
        timed = [[_seed() for _ in range(min(BLOCK, n - first))] for first in range(0, n, BLOCK)]
        input_bytes = bench.baselines.input_bytes if bench.baselines else 0
        inbox = bench.device == "cpu" and 0 < input_bytes <= INBOX_BYTES
        if inbox:  # one call a request: the fastest is then one no other process preempted
            bounds = [[_seed()] for _ in range(CPU_BOUND_REQUESTS)]
        else:
            per_bound = max(1, min(BLOCK, BOUND_SET_BYTES // max(input_bytes, 1)))
            bounds = [[_seed() for _ in range(per_bound)] for _ in range(max(BOUND_REQUESTS, min(8, len(timed))))]
        checked = {f"trial{t.index}": {"size": t.size, "seed": t.seed, "variant": t.variant} for t in trials}
        flat = [(f"timed{b}_{j}", seed) for b, block in enumerate(timed) for j, seed in enumerate(block)]
        rng = random.SystemRandom()
        for key, seed in rng.sample(flat, min(CHECKED_TIMED, len(flat))):
            checked[key] = {"size": bench.size, "seed": seed, "variant": "base"}
        for b, block in enumerate(bounds):  # one call of every Bound request, chosen in secret
            j = rng.randrange(len(block))
            checked[f"bound{b}_{j}"] = {"size": bench.size, "seed": block[j], "variant": "base"}
        return AttemptPlan(_seed(), _seed(), trials, timed, bounds, checked, inbox, bench.size)

    def specs(self) -> dict[str, dict[str, Any]]:
        """What the reference computes for this attempt: every checked output, and on the inbox path
        every Bound call's packed inputs."""
        specs = {key: {**spec, "output": True} for key, spec in self.checked.items()}
        if self.inbox:
            for b, block in enumerate(self.bounds):
                for j, seed in enumerate(block):
                    key = f"bound{b}_{j}"
                    specs[key] = {"size": self.size, "seed": seed, "variant": "base", "inputs": True,
                                  "output": key in self.checked}
        return specs


class Ended(Exception):
    """The session is over before a verdict on the calls: the child failed, broke the protocol, timed
    out or died. Carries the verdict."""

    def __init__(self, result: EvalResult | None):
        super().__init__(result.error if result else "the child ended")
        self.result = result


def child_environment(backend: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """What a candidate's child gets in its environment besides the allow-list (sandbox), and the
    key its spare is kept under: `env` adds to it (a lane's CUDA_VISIBLE_DEVICES)."""
    return {"MAX_JOBS": str(os.cpu_count() or 1), **backends.child_env(backend), **(env or {})}


def spare_init(backend: str, settings: EvalConfig) -> dict[str, Any]:
    """The Init a spare for `backend` gets when released (the same as evaluate sends a fresh child)."""
    return P.Init(device=device_for(backend), profiler=settings.profile).model_dump()


def evaluate(bench: TaskBench, code_path: Path, build_dir: Path, settings: EvalConfig,
             env: dict[str, str] | None = None, spares: sandbox.Spares | None = None,
             watch: health.Watch | None = None) -> EvalResult:
    """Judge one built candidate; `env` adds to the child's environment (a lane's CUDA_VISIBLE_DEVICES).
    With `spares`, the child is one started ahead of time, and the next attempt's is started now.
    With `watch`, the device is checked before and after: on an unfit one the candidate is judged
    for correctness only, and a device that went bad during the attempt marks its timing."""
    from .session import Session

    started = time.monotonic()
    env = child_environment(bench.backend, env)
    plan = AttemptPlan.draw(bench)
    lane_env = lane_of(env)
    unfit = watch.check(bench, lane_env) if watch is not None else None
    # Seconds spent before the child's conversation starts, kept beside its phases (issue 14: where
    # an attempt's wall goes).
    before = {"health": round(time.monotonic() - started, 3)}
    workdir = tempfile.mkdtemp(prefix="kgen-expected-")  # ours alone: no child can read it
    child = None
    try:
        mark = time.monotonic()
        expected, inputs = bench.expect(plan.init_seed, plan.specs(), workdir, lane_env)
        before["expect"] = round(time.monotonic() - mark, 3)
        mark = time.monotonic()
        main = expected["trial0"]
        slot_values = max(e.numel for e in expected.values())
        slots = max(3, BLOCK, max(len(b) for b in plan.bounds))
        set_bytes = {os.path.getsize(path) for path in inputs.values()}
        if plan.inbox and len(set_bytes) != 1:  # inputs whose size changes with the seed: the child fills
            plan.inbox, inputs = False, {}
        sets = max(len(b) for b in plan.bounds) if plan.inbox else 0
        set_size = set_bytes.pop() if plan.inbox else 0
        at = P.inbox_offset(slot_values * slots * 8)
        need = at + set_size * sets
        init = P.Init(device=bench.device, profiler=settings.profile)
        child = spares.take(env, settings.timeout_s) if spares and need <= sandbox.OUTBOX_BYTES else None
        if child is None:
            child = sandbox.start(HARNESS, ["eval"], settings.timeout_s, env, outbox=max(need, 8))
            child.send(init)
        if spares and spares.refill:
            spares.spawn(env, init.model_dump())
        before["child"] = round(time.monotonic() - mark, 3)
        job = P.Job(task_path=str(bench.task.path.resolve()), size=bench.size, code_path=str(Path(code_path).resolve()),
                    build_dir=str(Path(build_dir).resolve()), device=bench.device, memory_gb=settings.memory_limit_gb,
                    out_shape=main.shape, slot_values=slot_values, slots=slots, inbox_set_bytes=set_size,
                    inbox_sets=sets, threads=settings.cpu_threads, grad=bench.settings.grad, dtype=bench.settings.dtype,
                    own_kernels=backends.triton_kernels(Path(code_path).read_text()) if bench.backend == "triton" else [])
        inbox = P.Inbox(child.outbox_fd, at, set_size, sets) if plan.inbox else None
        session = Session(bench, child, plan, expected, P.Outbox(child.outbox_fd, slot_values, slots), spares, env,
                          inbox, inputs, timed=unfit is None, settings=settings)
        try:
            result = session.run(job)
        except Ended as ended:
            result = ended.result
        finally:
            session.outbox.close()
            if inbox:
                inbox.close()
            if spares:
                spares.release(env)
        code, log = child.finish(grace=3.0)
        result = session.finalize(result, code, log)
    finally:
        if child is not None and child.proc.returncode is None:
            child.kill()
            child.finish(grace=0.1)
        shutil.rmtree(workdir, ignore_errors=True)
        if bench.detached:
            bench.close()
    result = _trust(result, settings)
    if watch is not None and unfit is None and result.timing is not None:
        mark = time.monotonic()
        unfit = watch.check(bench, lane_env)  # the device went bad while this attempt was timed
        before["health_after"] = round(time.monotonic() - mark, 3)
    unfit = unfit or (bench.suspect and f"baselines measured while {bench.suspect}")
    if unfit:
        result = result.model_copy(update={"device_unfit": unfit})
    ended = time.monotonic()
    return result.model_copy(update={
        "device": bench.env.get("device_name", ""), "torch_version": bench.env.get("torch_version", ""),
        "cuda_version": bench.env.get("cuda_version"), "baselines": bench.baselines,
        "grad": bench.settings.grad, "dtype": bench.settings.dtype,
        "eval_seconds": ended - started,
        "phases": {**before, **session.phases, "teardown": round(ended - session.last, 3)}})


def _trust(result: EvalResult, settings: EvalConfig) -> EvalResult:
    if result.confinement is None:
        return result.model_copy(update={"trusted": False, "untrusted_reason": "the child never reported its confinement"})
    missing = result.confinement.missing(list(settings.required_confinement))
    if missing:
        return result.model_copy(update={"trusted": False, "untrusted_reason":
                                         f"confinement below what the config requires: no {', '.join(missing)}"})
    return result


def ended_early(child: sandbox.Child, code: int, log: str, what: str) -> EvalResult:
    if child.timed_out:
        return EvalResult(verdict=Verdict.timeout, error=f"killed after {child.deadline - child.started:.0f} s "
                          f"while waiting for {what}", detail=log[-4000:])
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return EvalResult(verdict=Verdict.crashed, error=f"child killed by {name} before {what}", detail=log[-4000:])
    return EvalResult(verdict=Verdict.crashed, error=f"child exited with status {code} before {what}: {_tail(log, 1)}",
                      detail=log[-4000:])


def flags_for(profile: P.ProfileDone | None, shape_results: list[TrialResult],
              interpreted_eager_ms: float | None = None) -> list[Flag]:
    """`interpreted_eager_ms`: eager's time, where Triton's interpreter ran the candidate's kernels.
    Their Python time would hide PyTorch's share of the call there, so PyTorch did the work when its
    ops alone took half as long as eager's whole call."""
    flags = []
    if profile and profile.torch_fraction is not None:
        if interpreted_eager_ms:
            pytorch_did_it = (profile.torch_us or 0.0) / 1000 >= NO_CUSTOM_KERNEL_FRACTION * interpreted_eager_ms
        else:
            pytorch_did_it = profile.torch_fraction > NO_CUSTOM_KERNEL_FRACTION
        if pytorch_did_it:
            flags.append(Flag.no_custom_kernel)
    if any(not t.ok for t in shape_results):
        flags.append(Flag.shape_specialized)
    return flags


def summarize(times: list[float]) -> Timing:
    return Timing(**summarize_blocks(times))
