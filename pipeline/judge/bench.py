"""A task's bench (`prepare`: open_bench, then measure_baselines): its reference process (one per lane,
kept alive for the run), its baselines and the sizes every correct candidate is also run at. The attempt
itself is pipeline.judge.evaluate's.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import random
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import backends, sandbox
from ..child import sizes, tasks
from ..child.timing import METHOD
from ..config import EvalConfig, cache_root
from ..policy import POLICY
from ..records import Baselines, EvalResult, Verdict
from . import health, refproto as R
from ..verdicts import Clock
from .judge import Expected, mapped


class EvaluationError(RuntimeError):
    """The reference itself could not be computed (a broken task), so no candidate can be judged."""


def _seed() -> int:
    return int.from_bytes(os.urandom(6), "little")


@dataclass
class Secrets:
    """An attempt's draw: its plan (pipeline.judge.evaluate.AttemptPlan), the float64 expected values
    and packed Bound inputs as memfds only the parent holds, and the reference's replay digests."""

    plan: Any
    expected: dict[str, Expected]
    inputs: dict[str, int]
    digests: dict[str, R.Digest]

    def copy(self) -> Secrets:
        """The same draw with descriptors of its own, which the attempt closes as it checks them."""
        return Secrets(copy.deepcopy(self.plan),
                       {k: dataclasses.replace(e, fd=os.dup(e.fd)) if e.fd is not None else e
                        for k, e in self.expected.items()},
                       {k: os.dup(fd) for k, fd in self.inputs.items()}, copy.deepcopy(self.digests))

    def close(self) -> None:
        for fd in [*self.inputs.values(), *(e.fd for e in self.expected.values() if e.fd is not None)]:
            os.close(fd)
        self.inputs, self.expected = {}, {}


class Draws:
    """Draws shared by sibling attempts (one task, turn and generation of a batch, all written before any was
    judged; docs/decisions/spares-and-startup.md). Nothing flows between them: a child never sees expected
    values, and feedback comes from earlier turns only. Whole draws alone are kept, the last KEEP."""

    KEEP = 2

    def __init__(self):
        self.lock = threading.Lock()
        self.kept: dict[str, Secrets] = {}

    def take(self, key: str, make: Callable[[], Secrets], shareable: Callable[[Secrets], bool]) -> tuple[Secrets, bool]:
        """The attempt's copy of the draw kept under `key`, else a new one from `make` (kept where
        `shareable`); and whether it was already kept."""
        with self.lock:
            if key in self.kept:
                return self.kept[key].copy(), True
            made = make()
            if not shareable(made):
                return made, False
            self.kept[key] = made
            while len(self.kept) > self.KEEP:
                self.kept.pop(next(iter(self.kept))).close()
            return made.copy(), False

    def close(self) -> None:
        with self.lock:
            kept, self.kept = list(self.kept.values()), {}
        for secrets in kept:
            secrets.close()


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
    baselines: Baselines | None = None
    env: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # the reference process's seconds per stage
    references: dict[frozenset, sandbox.Child] = field(default_factory=dict)
    detached: bool = False  # a copy in another process (Ray): its references end with each attempt
    suspect: str | None = None  # why the baselines were measured on a device unfit to time (never cached)
    cached: bool = False  # the baselines came from the database's cache (not timed, nothing to store)
    # A reference started ahead of its lane (pipeline.run.executor) runs nothing on the GPU until moved there:
    # its start-up beside the lane's timing makes the GPU read busy (docs/decisions/spares-and-startup.md).
    early: bool = False
    output_bytes: int = 0  # the main size's output, from the meta device (0: unknown); sizes a timed block
    draws: Draws = field(default_factory=Draws, repr=False, compare=False)  # sibling attempts' shared secrets

    def __getstate__(self):  # a bench sent to another process starts its own reference there, and draws
        return {k: v for k, v in self.__dict__.items() if k != "draws"} | {"references": {}, "detached": True}

    def __setstate__(self, state):
        self.__dict__.update(state, draws=Draws())

    def _key(self, env: dict[str, str] | None) -> frozenset:
        """Which reference process serves a lane. On the cpu one, whatever `env` says: the attempt's requests
        come with the child's KGEN_CORES and the bench's without, and keyed by them each would start its own,
        a second start and warm-up every task (docs/decisions/spares-and-startup.md)."""
        return frozenset() if self.device == "cpu" else frozenset((env or {}).items())

    def _reference(self, env: dict[str, str] | None) -> sandbox.Child:
        """The reference process for a lane (its CUDA_VISIBLE_DEVICES): it computes on the lane's own
        GPU, so it never runs beside another lane's timing."""
        key = self._key(env)
        ref = self.references.get(key)
        if ref is not None and ref.proc.poll() is None:
            return ref
        ours, theirs = R.pair()  # its expected values come as memfds over this socket
        # On the cpu pinned to the cores the candidate's child gets (sandbox.cpu_cores): both sides
        # of a speedup run on the same cores.
        pinned = {"KGEN_CORES": sandbox.cpu_cores(self.settings.cpu_threads)} if self.device == "cpu" else {}
        try:
            # The reference process runs this package's reference module (python -m).
            ref = sandbox.start(f"{__package__}.reference", ["--fd-socket", str(theirs.fileno())], 24 * 3600,
                                {**compile_cache_env(), **pinned, **(env or {})}, keep=(theirs.fileno(),), fork=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ref.handover = ours
        try:
            # spread_cores: where its `expect` may run on the cpu (every core of ours: nothing is timed
            # then, pipeline.judge.reference._spread); its timing stays on the pinned cores.
            ref.send(R.Start(task_path=str(self.task.path.resolve()), device=self.device, threads=self.settings.cpu_threads,
                             dtype=self.settings.dtype, grad=self.settings.grad, warm_compiler=self.settings.compile_baseline,
                             off_lane=self.early, spread_cores=sorted(os.sched_getaffinity(0)) if self.device == "cpu" else None))
            ready, why = _event(ref)
        except BaseException:
            # Not yet one of self.references, so close() would not find it: left running, it holds the GPU's memory.
            ref.kill()
            ref.finish(grace=0.1)
            raise
        if not isinstance(ready, R.Ready):
            _, log = ref.finish()
            raise EvaluationError(f"task {self.task.name}: reference process failed to start: {why}{_tail(log)}")
        self.env = ready.model_dump(exclude={"event"})
        self.references[key] = ref
        return ref

    def request(self, message: R.Request, timeout: float, env: dict[str, str] | None = None,
                fds: list[int] | None = None) -> list[R.Event]:
        """Send the lane's reference one request (`fds` just before it: a Compare's outbox); its events
        up to Done. One that dies, runs out of time, sends a line that is no event or not the
        descriptors it names has failed: EvaluationError."""
        ref = self._reference(env)
        ref.deadline = time.monotonic() + timeout
        if fds:
            socket.send_fds(ref.handover, [b"o"], fds)
        ref.send(message)
        out: list[R.Event] = []
        while True:
            event, why = _event(ref)
            if event is None or isinstance(event, R.Done):
                if event is not None:
                    ref.memory = (message.op, event.memory_mib)
                break
            out.append(event)
            if isinstance(event, R.ExpectedCall) and event.fds:
                try:
                    event.take(ref.handover)
                except OSError as exc:
                    ref.kill()
                    event, why = None, f"{exc}: "
                    break
        if event is None:
            R.close_all(out)
            _, log = ref.finish()
            self.references.pop(self._key(env), None)
            raise EvaluationError(f"task {self.task.name}: reference process failed on {message.op}: {why}{_tail(log)}")
        return out

    def floor_now(self, env: dict[str, str] | None = None) -> Baselines:
        """The floors measured again by the lane's reference, now, beside the time they judge; the bench
        keeps the lower of each. A floor taken while the box is busy, or cached from such a run, sits
        above what an honest kernel reaches in a quiet moment, and refuses it (docs/decisions/cpu-timing.md)."""
        b = self.baselines
        flops = (b.flops or 0) if self.settings.compute_floor else 0  # no rate to measure for a floor not checked
        got = next(m for m in self.request(R.Floor(input_bytes=b.input_bytes, flops=flops), self.settings.timeout_s, env)
                   if isinstance(m, R.Floors))
        for floor, rate in (("floor_ms", "bandwidth_gbs"), ("compute_floor_ms", "flops_per_s")):
            if getattr(got, floor) and getattr(got, floor) < (getattr(b, floor) or math.inf):
                b = b.model_copy(update={floor: getattr(got, floor), rate: getattr(got, rate)})
        self.baselines = b
        return b

    def clock(self, ms: float, env: dict[str, str] | None = None, **measured) -> Clock:
        """The parent's time of a call, with the floors it is held against (pipeline.verdicts.below_floor): the
        bench's, and where `ms` is below one of them x floor_slack, the lower of those and the floors
        measured again now (floor_now)."""
        slack, b = self.settings.floor_slack, self.baselines
        if b is None:
            return Clock(ms=ms, floor_slack=slack, **measured)
        # Not for a time of 0 (its requests lost in the protocol's noise): no figure, whatever the floors.
        if 0 < ms < max(b.floor_ms or 0, (b.compute_floor_ms if self.settings.compute_floor else None) or 0) * slack:
            b = self.floor_now(env)
        compute = dict(compute_floor_ms=b.compute_floor_ms, flops=b.flops, flops_per_s=b.flops_per_s)
        return Clock(ms=ms, floor_ms=b.floor_ms, input_bytes=b.input_bytes, bandwidth_gbs=b.bandwidth_gbs,
                     floor_slack=slack, **(compute if self.settings.compute_floor else {}), **measured)

    def expect(self, init_seed: int, specs: dict[str, dict[str, Any]],
               env: dict[str, str] | None = None) -> tuple[dict[str, Expected], dict[str, int]]:
        """Expected outputs for this attempt's seeds, whole (`"values": False`: shapes and dtypes alone), and
        the packed inputs the specs ask for (`"inputs": True`): sealed memfds from the reference, the caller's to
        close and never to pass on; no file holds them. Large outputs: one call's values at a time, as checked."""
        msgs = self.request(R.Expect(init_seed=init_seed, specs=[R.Spec(key=k, **v) for k, v in specs.items()]),
                            self.settings.timeout_s * 2, env)
        found = [m for m in msgs if isinstance(m, R.ExpectedCall)]
        return ({m.key: Expected(m.shape, m.numel, m.ref_dtype, m.fd("values_fd"), m.fp32_rel_err,
                                 m.parts if self.settings.grad else None, m.rel_errs, m.dtypes, m.own_errs)
                 for m in found if m.shape is not None},
                {m.key: m.fd("inputs_fd") for m in found if m.fd("inputs_fd") is not None})

    def expected_for(self, init_seed: int, key: str, spec: dict[str, Any], env: dict[str, str] | None = None) -> Expected:
        """One checked call's expected values (`expect`), the caller's to close."""
        return self.expect(init_seed, {key: {**spec, "output": True}}, env)[0][key]

    def compare(self, init_seed: int, spec: R.Spec, outbox_fd: int, parts: list[tuple[int, str, int]],
                errs: list | None, env: dict[str, str] | None = None) -> R.Compared:
        """One checked call's output, read from the outbox by the reference and compared there
        (refproto.Compare)."""
        msgs = self.request(R.Compare(init_seed=init_seed, spec=spec, parts=parts, tol=self.tolerance, errs=errs),
                            self.settings.timeout_s * 2, env, fds=[outbox_fd])
        return next(m for m in msgs if isinstance(m, R.Compared))

    def bound_inputs(self, plan, k: int, held: dict[str, int], env: dict[str, str] | None, set_bytes: int) -> list:
        """Bound request `k`'s packed input sets (the inbox path) as private copies: from `held` (packed
        before the child started), else packed now; one request's at a time, never an attempt's all at once."""
        keys = [f"bound{k}_{i}" for i in range(len(plan.bounds[k]))]
        if not all(key in held for key in keys):
            _, fds = self.expect(plan.init_seed, plan.inputs_specs(k), env)
            held.update({key.removeprefix("in:"): fd for key, fd in fds.items()})
        values = []
        for key in keys:
            fd = held.pop(key)
            try:
                values.append(mapped(fd).copy())
            finally:
                os.close(fd)
            if values[-1].size != set_bytes:
                raise EvaluationError(f"task {self.task.name}: its inputs change size with the seed "
                                      f"({values[-1].size} bytes packed, the inbox holds sets of {set_bytes})")
        return values

    def move_reference(self, started_with: dict[str, str], lane: dict[str, str]) -> None:
        """The reference started with `started_with` (a lane's GPU, other cores) now serves `lane`:
        every thread of every process in its session moves to the lane's cores (KGEN_CORES)."""
        self.early = False
        ref = self.references.pop(self._key(started_with), None)
        if ref is None:
            return
        self.references[self._key(lane)] = ref
        for pid in sandbox.session_members(ref.proc.pid):
            sandbox.pin_all(pid, lane.get("KGEN_CORES"))

    def close(self) -> None:
        self.draws.close()
        references, self.references = list(self.references.values()), {}
        for ref in references:
            ref.kill()
            ref.finish(grace=0.1)


def compile_cache_env() -> dict[str, str]:
    """Where reference processes keep torch.compile's caches (inductor's, Triton's): one folder that
    outlives them (KGEN_CACHE_DIR, default ~/.cache/kgen), else each compiles every task afresh. Only
    references write here; a candidate's child writes only its own temp dir, so it can plant nothing here."""
    root = cache_root()
    # Inductor keeps its cpu kernels' precompiled header under the temp folder whatever
    # TORCHINDUCTOR_CACHE_DIR says (codecache._HEADER_DIR), so the reference's temp folder outlives it too.
    tmp = root / "reference-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    # Compiled in the reference's own thread: inductor's pool of compile workers ran on the lane's cores
    # beside the timed blocks (docs/decisions/spares-and-startup.md).
    return {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton"),
            "TMPDIR": str(tmp), "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def lane_of(env: dict[str, str]) -> dict[str, str] | None:
    """The part of a child's environment that names its GPU lane and the lane's cores (KGEN_CORES),
    which keys the lane's reference process and pins it beside the lane's children."""
    return {k: v for k, v in env.items() if k in ("CUDA_VISIBLE_DEVICES", "KGEN_CORES")} or None


def prepare(task: tasks.TaskFile, size: str | dict[str, Any], backend: str, settings: EvalConfig,
            cached_baselines: Callable[[str], str | None] | None = None,
            env: dict[str, str] | None = None, watch: health.Watch | None = None) -> TaskBench:
    """Start the task's reference process and get its baselines (from `cached_baselines(key)` when
    it has them); the bench then serves every attempt of the task in this run. With `watch`, the
    device is checked before and after they are measured (pipeline.judge.health)."""
    return measure_baselines(open_bench(task, size, backend, settings, env), cached_baselines, env, watch)


def task_tolerance(module, device: str, dtype: str, default: float) -> float:
    """The task's relative tolerance (its KGEN_TOLERANCE, else `default`), at least POLICY.tf32_tol
    where a float32 call convolves on a GPU (cuDNN's TF32)."""
    tolerance = tasks.tolerance(module, default)
    if device == "cuda" and dtype == "float32" and sizes.convolves(module):
        return max(tolerance, POLICY.tf32_tol)
    return tolerance


def open_bench(task: tasks.TaskFile, size: str | dict[str, Any], backend: str, settings: EvalConfig,
               env: dict[str, str] | None = None, memory_checked: bool = False, early: bool = False) -> TaskBench:
    """The task's bench with its reference process started (its compiler warming up), no baselines yet (`kgen
    eval` opens it beside the build). `memory_checked`: the caller checked the size against memory already;
    `early`: started ahead of its lane, which may be timing another task (TaskBench.early)."""
    module = tasks.load_module(task, size, settings.dtype)
    device = backends.device_for(backend)
    if not memory_checked:
        sizes.check_memory(module, device, health.gpu_free_bytes((env or {}).get("CUDA_VISIBLE_DEVICES"))
                            if device == "cuda" else None, factor=POLICY.memory_factor[device])
    bench = TaskBench(task, size, sizes.effective_size(module, size), backend, device,
                      task_tolerance(module, device, settings.dtype, settings.tolerance), settings,
                      other_sizes=_held_out(module, size) if settings.check_shapes else [],
                      output_bytes=(sizes.footprint(module) or {}).get("output", 0), early=early)
    started = time.monotonic()
    bench._reference(env)
    bench.phases = {"startup": round(time.monotonic() - started, 2)}
    return bench


# A GPU's rates by (device, torch), the same for every task: measured once a kgen process, the best so far
# kept for each later task (docs/decisions/gpu-timing.md).
_RATES: dict[tuple[str, str], R.Rates] = {}


def best_rates(known: R.Rates | None, measured: Baselines) -> R.Rates | None:
    """The higher of each rate: one measured low (a busy moment) sets a floor an honest kernel beats."""
    if not measured.bandwidth_gbs:
        return known
    flops = max((r for r in (known and known.flops_per_s, measured.flops_per_s) if r), default=None)
    return R.Rates(bandwidth_gbs=max(measured.bandwidth_gbs, known.bandwidth_gbs if known else 0), flops_per_s=flops)


def measure_baselines(bench: TaskBench, cached_baselines: Callable[[str], str | None] | None = None,
                      env: dict[str, str] | None = None, watch: health.Watch | None = None,
                      settle: bool = True) -> TaskBench:
    """The bench's baselines: from `cached_baselines(key)` when it has them, else timed now by its
    reference. With `settle`, cached ones also wait for the compiler's warm-up, since in a batch another
    candidate may be timed on this lane as soon as this returns (`kgen eval` settles later, in its session)."""
    task, size, settings = bench.task, bench.size, bench.settings
    ready_at = time.monotonic()
    cached = usable(cached_baselines(baseline_key(bench)) if cached_baselines else None, settings)
    if cached is None:  # the compiler's warm-up ends first, timed apart (the run's `reference` line)
        bench.request(R.Settle(), settings.timeout_s, env)
        bench.phases["settle"] = round(time.monotonic() - ready_at, 2)
        ready_at = time.monotonic()
    if cached is None and watch is not None:
        bench.suspect = watch.check(bench, env)
    if cached is not None:
        bench.baselines, bench.cached = Baselines.model_validate_json(cached), True
        if settle:
            bench.request(R.Settle(), settings.timeout_s, env)
    else:
        seeds = [_seed() for _ in range(max(settings.timed_calls, settings.max_timed_calls))]
        device = (bench.env["device_name"], bench.env["torch_version"])
        msgs = bench.request(R.MeasureBaselines(size=size, init_seed=_seed(), baseline_seeds=seeds, warmup=settings.warmup_calls,
                                                rates=_RATES.get(device) if bench.device.startswith("cuda") else None,
                                                compile_baseline=settings.compile_baseline, timed_ms=settings.timed_ms,
                                                timed_calls=settings.timed_calls, max_timed_calls=settings.max_timed_calls),
                             settings.timeout_s * 4, env)
        found = [m for m in msgs if isinstance(m, R.Measured)]
        if not found:
            bench.close()
            raise EvaluationError(f"task {task.name}: the reference process sent no baselines")
        bench.baselines = found[0].baselines
        if bench.device.startswith("cuda") and (rates := best_rates(_RATES.get(device), bench.baselines)):
            _RATES[device] = rates
        bench.phases |= {f"baselines_{part}": spent for part, spent in bench.baselines.seconds.items()}
        if watch is not None and bench.suspect is None:
            bench.suspect = watch.check(bench, env)
    bench.phases["baselines"] = round(time.monotonic() - ready_at, 2)
    return bench


def _held_out(module, size) -> list[str]:
    """The sizes every correct candidate is also run at: the task's other declared presets (not its
    huge default), then one smaller and one larger shape drawn for this run (sizes.held_out_sizes),
    which no prompt showed; a failure at any is flagged shape_specialized."""
    declared = sizes.other_sizes(module, size)
    return declared + [s for s in sizes.held_out_sizes(module, random.SystemRandom()) if s not in declared]


def baseline_key(bench: TaskBench) -> str:
    """What a cached baseline is good for: the task file's sha, size, backend, device name, torch version
    (naming its CUDA build), timing protocol version, on the cpu a thread count other than one, and last the
    mode (a dtype other than float32, gradient): pipeline.cli.kbcompare tells modes apart by the key's end."""
    env, s = bench.env, bench.settings
    threads = [f"threads{s.cpu_threads}"] if bench.device == "cpu" and s.cpu_threads != 1 else []
    mode = [s.dtype] if s.dtype != "float32" else []
    mode += ["grad"] if s.grad else []  # forward plus backward is another baseline
    return ":".join([bench.task.name, bench.task.sha, bench.size_name, bench.backend, env["device_name"],
                     env["torch_version"], f"timing{METHOD.version}", *threads, *mode])


def usable(cached: str | None, settings: EvalConfig) -> str | None:
    """A cached baseline, unless this run times torch.compile and the cached one has no compiled
    time (a run with compile_baseline off stored it): then it is measured again, and replaces it. One
    whose compile failed says so (compile_error) and stands: it would only fail again."""
    if cached is None or not settings.compile_baseline:
        return cached
    known = Baselines.model_validate_json(cached)
    return cached if known.compiled is not None or known.compile_error else None


def _event(ref: sandbox.Child) -> tuple[R.Event | None, str]:
    """The reference's next event; else None and why, where the reference sent a line that is no
    event (then it is killed: it has failed, as if it had died)."""
    try:
        return ref.receive(lambda line: R.parse(R.EVENT, line, "a reply")), ""
    except R.Unparsed as exc:
        ref.kill()
        return None, f"{exc}: "


def _tail(log: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in log.strip().splitlines()[-lines:]) or "(no output)"


class Ended(Exception):
    """The session is over before a verdict on the calls: the child failed, broke the protocol, timed
    out or died. Carries the verdict; the session raises it where it sees that, evaluate turns it
    into the result."""

    def __init__(self, result: EvalResult | None):
        super().__init__(result.error if result else "the child ended")
        self.result = result


def ended_early(child: sandbox.Child, code: int, log: str, what: str) -> EvalResult:
    if child.timed_out:
        return EvalResult(verdict=Verdict.timeout, error=f"killed after {child.deadline - child.started:.0f} s "
                          f"while waiting for {what}", detail=log[-4000:])
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return EvalResult(verdict=Verdict.crashed, error=f"child killed by {name} before {what}", detail=log[-4000:])
    return EvalResult(verdict=Verdict.crashed, error=f"child exited with status {code} before {what}: {_tail(log, 1)}",
                      detail=log[-4000:])
