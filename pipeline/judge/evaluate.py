"""The parent's side of evaluation: a fresh sandboxed child per attempt (`evaluate`), in a session with
the task's long-lived reference process (pipeline.judge.bench.prepare: one per task and run).

Every attempt draws its own seeds from os.urandom (a batch's siblings share one draw, bench.Draws). The
reference describes the outputs before the child starts and computes each checked call's float64 values
as that call is checked (docs/decisions/memory-and-outputs.md); the child learns each call's seed only in
the request that makes it, and on the cpu Bound inputs are written into the stopped child's inbox.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import backends, sandbox
from ..child import HARNESS
from ..child import protocol as P
from ..child import memfd, replays
from ..child import tasks
from ..child.timing import METHOD
from ..config import EvalConfig
from ..records import EvalResult
from ..sandbox.spares import Spares
from . import health, owncode, refproto as R
from .bench import Ended, Secrets, TaskBench, _seed, lane_of
from ..verdicts import NO_FIGURE, Again, Measured, decide
from .judge import Expected
from .session import Session
from ..policy import POLICY


@dataclass
class AttemptPlan:
    """One attempt's secrets: every seed, and which Bound calls are checked in full."""

    init_seed: int
    warm_seed: int
    trials: list[P.Trial]
    bounds: list[list[int]]  # seeds per Bound request
    checked: dict[str, dict[str, Any]]  # expected-output key -> {size, seed, variant}
    inbox: bool = False  # Bound inputs come from the parent (their reference specs ask for "inputs")
    size: str | dict[str, Any] = ""  # the main size, at which every Bound call runs
    # cuda: each Bound request replays CUDA graphs (pipeline.child.replays) this many times,
    # with its digests' seed, and the replays whose digests are checked, chosen in secret.
    replays: int = 0
    digest_seeds: list[int] = field(default_factory=list)
    factor_seeds: list[int] = field(default_factory=list)  # revealed only in each request's Play
    replay_checks: list[list[int]] = field(default_factory=list)
    ahead: bool = False  # every expected value computed before the child starts (specs)
    inputs_ahead: bool = False  # every Bound request's inbox inputs packed before the child starts (specs)

    @staticmethod
    def draw(bench: TaskBench) -> AttemptPlan:
        s = bench.settings
        variants = tasks.VARIANTS
        trials = [P.Trial(index=i, seed=_seed(), variant=variants[i % len(variants)], size=bench.size)
                  for i in range(s.trials)]
        trials += [P.Trial(index=s.trials + j, seed=_seed(), variant="scaled", size=other, repeat=False)
                   for j, other in enumerate(bench.other_sizes)]
        calls = block_calls(bench.output_bytes)
        input_bytes = bench.baselines.input_bytes if bench.baselines else 0
        inbox = bench.device == "cpu" and 0 < input_bytes <= POLICY.inbox_bytes
        if inbox:  # short requests: the fastest is then one no other process preempted
            per = cpu_bound_calls(bench.baselines.eager.median_ms if bench.baselines else None, input_bytes,
                                  bench.output_bytes)
            # Fewer calls a request rather than inputs past ahead_bytes: else whether a draw is whole
            # (shared by siblings, inputs warm) turned on how fast eager ran on the day.
            per = max(1, min(per, POLICY.ahead_bytes // (POLICY.bound_requests * input_bytes)))
            # As many as fit ahead (POLICY.ahead_bytes): packed between the child's requests they ran cold.
            requests = max(POLICY.bound_requests, min(POLICY.cpu_bound_requests, POLICY.ahead_bytes // max(per * input_bytes, 1)))
            bounds = [[_seed() for _ in range(per)] for _ in range(requests)]
        else:
            per_bound = max(1, min(calls, POLICY.bound_set_bytes // max(input_bytes, 1)))
            bounds = [[_seed() for _ in range(per_bound)] for _ in range(POLICY.bound_requests)]
        checked = {f"trial{t.index}": {"size": t.size, "seed": t.seed, "variant": t.variant} for t in trials}
        rng = random.SystemRandom()
        # One call of every Bound request, chosen in secret (of as many requests as checked_count allows).
        for b in sorted(rng.sample(range(len(bounds)), min(len(bounds), checked_count(bench.output_bytes)))):
            j = rng.randrange(len(bounds[b]))
            checked[f"bound{b}_{j}"] = {"size": bench.size, "seed": bounds[b][j], "variant": "base", "errors": False}
        if bench.device == "cpu":  # more of the Bound calls (a GPU's replayed requests have their digests)
            rest = [(f"bound{b}_{j}", seed) for b, block in enumerate(bounds) for j, seed in enumerate(block)
                    if f"bound{b}_{j}" not in checked]
            more = checked_count(bench.output_bytes) - sum(k.startswith("bound") for k in checked)
            for key, seed in rng.sample(rest, min(max(0, more), len(rest))):
                checked[key] = {"size": bench.size, "seed": seed, "variant": "base", "errors": False}
        plan = AttemptPlan(_seed(), _seed(), trials, bounds, checked, inbox, bench.size)
        # float64 values (the output and, in gradient mode only, gradients of the inputs' size) of every
        # checked call, and the inbox's sets: ahead where small and known (specs).
        grads = input_bytes if s.grad else 0
        bound_bytes = input_bytes * sum(map(len, bounds)) if inbox else 0
        plan.ahead = 0 < bench.output_bytes and (bench.output_bytes + grads) * 2 * len(checked) + bound_bytes <= POLICY.ahead_bytes
        # The Bound requests' inputs ahead wherever they fit, whatever the expected values need: packed
        # between the child's requests, on its cores, they slowed its Bound calls (cold caches).
        plan.inputs_ahead = bound_bytes <= POLICY.ahead_bytes
        if bench.device.startswith("cuda") and bench.settings.replay_bound:
            plan.replays = min(replay_count(fastest_ms(bench)), replays.most_replays(len(bounds[0]), input_bytes))
            plan.digest_seeds = [_seed() for _ in bounds]
            plan.factor_seeds = [_seed() for _ in bounds]
            plan.replay_checks = [sorted(rng.sample(range(plan.replays), min(POLICY.replay_checks, plan.replays)))
                                  for _ in bounds]
        return plan

    def digest_items(self) -> list[R.DigestItem]:
        """The replayed Bound calls whose digests the reference computes (pipeline.child.replays)."""
        return [R.DigestItem(key=f"bound{b}@{r}", seeds=self.bounds[b], replay=r, replays=self.replays,
                             digest_seed=self.digest_seeds[b],
                             factor_seed=self.factor_seeds[b]) for b, checks in enumerate(self.replay_checks) for r in checks]

    def specs(self) -> dict[str, dict[str, Any]]:
        """What the reference computes before the child starts: all of it where small (`ahead`: work between
        the child's requests slowed its Bound calls); else each size's first checked call's shapes (they size the
        slots) and the first Bound inputs, the rest as needed (Session.fetch, TaskBench.bound_inputs)."""
        if self.ahead:
            specs = {key: {**spec, "output": True} for key, spec in self.checked.items()}
            for b, block in enumerate(self.bounds if self.inbox else []):
                for j, seed in enumerate(block):
                    key = f"bound{b}_{j}"
                    specs[key] = {"size": self.size, "seed": seed, "variant": "base", "inputs": True,
                                  "output": key in self.checked}
            return specs
        specs: dict[str, dict[str, Any]] = {}
        sizes: set[str] = set()
        for key, spec in self.checked.items():
            size = json.dumps(spec["size"], sort_keys=True)
            if size not in sizes:
                sizes.add(size)
                specs[key] = {**spec, "output": True, "values": False}
        for k in range(len(self.bounds) if self.inputs_ahead else 1) if self.inbox else ():
            specs.update(self.inputs_specs(k))
        return specs

    def inputs_specs(self, k: int) -> dict[str, dict[str, Any]]:
        """Bound request `k`'s packed inputs (the inbox path), without outputs."""
        return {f"in:bound{k}_{j}": {"size": self.size, "seed": seed, "variant": "base", "inputs": True, "output": False}
                for j, seed in enumerate(self.bounds[k])}


def block_calls(output_bytes: int) -> int:
    """Calls in a Bound request that is not replayed: METHOD.block, fewer where their outputs, each in its
    own outbox slot until checked, would pass POLICY.block_output_bytes (the judge's memory budget)."""
    return max(1, min(METHOD.block, POLICY.block_output_bytes // max(output_bytes, 1)))


def checked_count(output_bytes: int) -> int:
    """Bound calls whose outputs are compared in full: POLICY.checked_timed,
    fewer where their outputs together would pass POLICY.checked_output_bytes, never under
    POLICY.checked_min."""
    return max(POLICY.checked_min, min(POLICY.checked_timed, POLICY.checked_output_bytes // max(output_bytes, 1)))


def slot_words(want: Expected) -> int:
    """An outbox slot for one call's output, in 8-byte words: its values in the dtype PyTorch gives it (an
    output of another dtype or shape fails its header checks first); in gradient mode 8 bytes a value,
    since a gradient's dtype is judged from what the child wrote."""
    if want.parts or want.ref_dtype not in memfd.PACKED_DTYPES:
        return want.numel
    import torch

    return -(-want.numel * torch.empty((), dtype=getattr(torch, want.ref_dtype)).element_size() // 8)


def fastest_ms(bench: TaskBench) -> float | None:
    """The faster baseline's median call (eager or torch.compile), which sizes the plan."""
    b = bench.baselines
    if b is None:
        return None
    times = [x.median_ms for x in (b.eager, b.compiled) if x is not None and x.median_ms > 0]
    return min(times) if times else None


def replay_count(call_ms: float | None) -> int:
    """Replays a request: about POLICY.replay_target_ms of calls at the faster baseline's speed, so the
    request's noise and the graph's launch are spread over many calls."""
    if not call_ms:
        return POLICY.replays_max
    return max(POLICY.replays_min, min(POLICY.replays_max, math.ceil(POLICY.replay_target_ms / call_ms)))


def cpu_bound_calls(eager_ms: float | None, input_bytes: int, output_bytes: int) -> int:
    """Calls per Bound request on the cpu's inbox path: one unless eager is under POLICY.cpu_short_ms; then a
    block's, or more (POLICY.cpu_bound_max_calls at most) so they take POLICY.cpu_bound_ms, within
    POLICY.cpu_bound_set_bytes of inputs and POLICY.block_output_bytes of outputs."""
    if not eager_ms or eager_ms <= 0 or eager_ms >= POLICY.cpu_short_ms:
        return 1
    block = block_calls(output_bytes)
    calls = max(block, min(POLICY.cpu_bound_max_calls, math.ceil(POLICY.cpu_bound_ms / eager_ms)))
    calls = min(calls, POLICY.block_output_bytes // max(output_bytes, 1), POLICY.cpu_bound_set_bytes // max(input_bytes, 1))
    return max(1, calls)


def child_environment(backend: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """What a candidate's child gets in its environment besides the allow-list (sandbox), and the
    key its spare is kept under: `env` adds to it (a lane's CUDA_VISIBLE_DEVICES)."""
    return {"MAX_JOBS": str(os.cpu_count() or 1), **backends.child_env(backend), **(env or {})}


def spare_init(backend: str, settings: EvalConfig) -> dict[str, Any]:
    """The Init a spare for `backend` gets when released (the same as evaluate sends a fresh child)."""
    return P.Init(device=backends.device_for(backend), profiler=settings.profile).model_dump()


def evaluate(bench: TaskBench, code_path: Path, build_dir: Path, settings: EvalConfig,
             env: dict[str, str] | None = None, spares: Spares | None = None,
             watch: health.Watch | None = None, draw: str | None = None) -> EvalResult:
    """Judge one built candidate. `env` adds to the child's environment (a lane's CUDA_VISIBLE_DEVICES);
    `draw` names the siblings it shares its secrets with (bench.Draws; None: its own); `spares` gives a
    child started ahead (and starts the next); `watch` checks the device before and after (unfit: judged
    for correctness only; gone bad meanwhile: its timing marked). What decide sends back (too loaded, or a
    replayed time refused or lost in its nulls: Again) is judged afresh, up to `settings.load_retries`
    times; the last verdict stands, a retime's first reason in its outcome's `earlier`."""
    result, again = _judge(bench, code_path, build_dir, settings, env, spares, watch, draw=draw)
    spent, earlier = result.eval_seconds, None
    for _ in range(settings.load_retries):
        if again is Again.no:
            break
        if again is Again.retime:
            earlier = earlier or result.error or result.outcome.why
        result, again = _judge(bench, code_path, build_dir, settings, env, spares, watch)
        spent += result.eval_seconds
    if earlier:
        result = result.model_copy(update={"outcome": result.outcome.model_copy(update={"earlier": earlier})})
    return result.model_copy(update={"eval_seconds": spent})


def _secrets(bench: TaskBench, lane_env: dict[str, str] | None, before: dict[str, float], timeout_s: float) -> Secrets:
    """A fresh draw, and what the reference computes for it before the child starts (the expected values
    first, beside its compiler's warm-up), as memfds only this process holds (TaskBench.expect): no path
    names them, and sandbox.start passes a child only its own descriptors."""
    plan = AttemptPlan.draw(bench)
    mark = time.monotonic()
    expected, inputs = bench.expect(plan.init_seed, plan.specs(), lane_env)
    secrets = Secrets(plan, expected, {key.removeprefix("in:"): fd for key, fd in inputs.items()}, {})
    before["expect"] = round(time.monotonic() - mark, 3)
    mark = time.monotonic()
    try:
        secrets.digests = {m.key: m for m in bench.request(
            R.Digests(size=bench.size, init_seed=plan.init_seed, items=plan.digest_items()),
            timeout_s, lane_env) if isinstance(m, R.Digest)} if plan.replays else {}
    except BaseException:
        secrets.close()
        raise
    before["digests"] = round(time.monotonic() - mark, 3)
    return secrets


def _whole(secrets: Secrets) -> bool:
    """Whether a draw holds every value its attempt will check and every Bound input it will send
    (AttemptPlan.specs), so siblings can share it (bench.Draws)."""
    plan = secrets.plan
    return plan.ahead and (not plan.inbox or plan.inputs_ahead)


def _judge(bench: TaskBench, code_path: Path, build_dir: Path, settings: EvalConfig, env: dict[str, str] | None,
           spares: Spares | None, watch: health.Watch | None,
           draw: str | None = None) -> tuple[EvalResult, Again]:
    """One evaluation, and whether it is to be judged again (pipeline.verdicts.Again)."""

    started = time.monotonic()
    env = child_environment(bench.backend, env)
    lane_env = lane_of(env)
    if bench.device == "cpu" and "KGEN_CORES" not in env:  # the cores eager is timed on (sandbox.cpu_cores)
        env = {**env, "KGEN_CORES": sandbox.cpu_cores(settings.cpu_threads)}
    # Seconds spent before the child's conversation starts, kept beside its phases (where an
    # attempt's wall goes).
    before: dict[str, float] = {}
    # The parent's own look at the built code, before any of it runs (pipeline.judge.owncode).
    mark = time.monotonic()
    own = owncode.inspect_build(build_dir, bench.backend, Path(code_path).read_text())
    before["own_code"] = round(time.monotonic() - mark, 3)
    child = None
    expected: dict[str, Any] = {}
    inputs: dict[str, int] = {}
    try:
        if draw is None:
            secrets = _secrets(bench, lane_env, before, settings.timeout_s)
        else:
            secrets, shared = bench.draws.take(draw, lambda: _secrets(bench, lane_env, before, settings.timeout_s),
                                               _whole)
            before["shared_draw"] = float(shared)
        plan, expected, inputs, digests = secrets.plan, secrets.expected, secrets.inputs, secrets.digests
        mark = time.monotonic()
        unfit = watch.check(bench, lane_env) if watch is not None and not watch.recent() else None
        before["health"] = round(time.monotonic() - mark, 3)
        mark = time.monotonic()
        main = expected["trial0"]
        slot_values = max(slot_words(e) for e in expected.values())
        slots = max(3, *(len(b) for b in plan.bounds))
        set_bytes = {os.fstat(fd).st_size for fd in inputs.values()}
        if plan.inbox and len(set_bytes) != 1:  # inputs whose size changes with the seed: the child fills
            plan.inbox = False
            _close(inputs)
        sets = max(len(b) for b in plan.bounds) if plan.inbox else 0
        set_size = set_bytes.pop() if plan.inbox else 0
        at = memfd.inbox_offset(slot_values * slots * 8)
        need = at + set_size * sets
        init = P.Init(device=bench.device, profiler=settings.profile)
        child = spares.take(env, settings.timeout_s) if spares and need <= POLICY.outbox_bytes else None
        if child is None:
            room = sandbox.Jail(memory_bytes=int(settings.room_memory_gb * (1 << 30)))
            child = sandbox.start(HARNESS, ["eval"], settings.timeout_s, env, outbox=max(need, 8), jail=room)
            child.send(init)
        if spares and spares.refill:
            spares.spawn(env, init.model_dump())
        before["child"] = round(time.monotonic() - mark, 3)
        task_path, code, built = stage(child, bench.task.path, Path(code_path), Path(build_dir))
        job = P.Job(task_path=task_path, size=bench.size, code_path=code, build_dir=built, device=bench.device, memory_gb=settings.memory_limit_gb,
                    out_shape=main.shape, slot_values=slot_values, slots=slots, inbox_set_bytes=set_size,
                    inbox_sets=sets, threads=settings.cpu_threads, grad=bench.settings.grad, dtype=bench.settings.dtype,
                    own_kernels=backends.triton_kernels(Path(code_path).read_text()) if bench.backend == "triton" else [])
        inbox = memfd.Inbox(child.outbox_fd, at, set_size, sets) if plan.inbox else None
        session = Session(bench, child, plan, expected, memfd.Outbox(child.outbox_fd, slot_values, slots), spares, env,
                          inbox, inputs, timed=unfit is None, settings=settings)
        session.digests = digests
        # The bench's lane, not the child's environment (on the cpu it holds KGEN_CORES): else the session's
        # requests would start a second reference process while the first holds its memory.
        session.lane = lane_env
        session.own = own
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
        left = child.left  # by construction never; seen from outside, so said
    finally:
        if child is not None and child.proc.returncode is None:
            child.kill()
            child.finish(grace=0.1)
        _close(inputs)
        _close({key: want.fd for key, want in expected.items() if want.fd is not None})
        if bench.detached:
            bench.close()
    if watch is not None and unfit is None and result.timing is not None:
        mark = time.monotonic()
        unfit = watch.check(bench, lane_env)  # the device went bad while this attempt was timed
        before["health_after"] = round(time.monotonic() - mark, 3)
    unfit = unfit or (bench.suspect and f"baselines measured while {bench.suspect}")
    decision = decide(measured(result, list(settings.required_confinement), left=_pids(left),
                               loose_bound=session.loose_bound, unfit=unfit or None, clock=session.clock))
    # no figure from a device unfit to time: the candidate's time, its ratios, eager's beside it
    result = result.model_copy(update={"outcome": decision.outcome, **({"error": decision.error} if decision.error else {}),
                                       **(NO_FIGURE if not decision.figure else {})})
    ended = time.monotonic()
    return result.model_copy(update={
        "device": bench.env.get("device_name", ""), "torch_version": bench.env.get("torch_version", ""),
        "cuda_version": bench.env.get("cuda_version"), "baselines": bench.baselines,
        "grad": bench.settings.grad, "dtype": bench.settings.dtype, "own_code": own, "policy": POLICY.version,
        "eval_seconds": ended - started,
        "phases": {**before, **session.phases, "teardown": round(ended - session.last, 3)}}), decision.again


def stage(child: sandbox.Child, task_path: Path, code_path: Path, build_dir: Path) -> tuple[str, str, str]:
    """The task file, code and built extension as the child reads them: copies (links for the
    build) in its own read-only job folder, where it is jailed; else the originals."""
    if child.policy is None:
        return str(task_path.resolve()), str(code_path.resolve()), str(build_dir.resolve())
    built = child.stage_tree(build_dir, "build") if build_dir.is_dir() else str(child.job_dir / "build")
    return child.stage(task_path), child.stage(code_path, "candidate.py"), built


def _close(fds: dict[str, int]) -> None:
    """Close an attempt's secret descriptors (emptying `fds`): the maps the judge made of them stay
    valid while its views live."""
    for fd in fds.values():
        os.close(fd)
    fds.clear()


def _pids(pids: list[int]) -> str | None:
    return ", ".join(f"pid {p}" for p in pids) or None


def measured(result: EvalResult, required: list[str], **facts) -> Measured:
    """The record `decide` reads, from a session's result and the facts the parent saw around it."""
    o = result.outcome
    missing = result.confinement.missing(required) if result.confinement is not None else None
    return Measured(verdict=o.verdict, findings=o.findings, claims=o.claims, missing=missing, **facts)
