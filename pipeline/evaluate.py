"""The parent's side of evaluation: reference values, the candidate's child, comparisons, verdicts.

    bench = prepare(task, "small", "cpu", settings)          # one reference process per task and run
    result = evaluate(bench, code_path, build_dir, settings)  # one fresh sandboxed child per attempt

Seeds come from os.urandom per run and reach the candidate's child only after it imported the
candidate. Expected outputs stay in this process. Every number the child reports is checked here:
outputs against float64 references, times against the bandwidth floor and our own wall clock.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import sandbox, tasks, wire
from .config import EvalConfig
from .records import Baselines, EvalResult, Flag, Timing, TrialResult, Verdict
from .timing import BLOCK, TIMING_VERSION, calls_for, summarize_blocks

EVALUATOR_VERSION = "1"
NO_CUSTOM_KERNEL_FRACTION = 0.5  # share of the call's time in PyTorch's own ops that raises the flag
WALL_CLOCK_SLACK = 0.5  # the child may not claim calls more than 2x faster than our clock saw
WALL_CLOCK_ABS_MS = 25.0  # ...beyond what pipe latency and our own scheduling can explain
EVENT_SLACK, EVENT_ABS_MS = 0.5, 0.02  # launch-bound calls pipeline, so events may read below wall/call


class EvaluationError(RuntimeError):
    """The reference itself could not be computed (a broken task), so no candidate can be judged."""


def _seed() -> int:
    return int.from_bytes(os.urandom(6), "little")


@dataclass
class TaskBench:
    """Everything about one task in one run that every attempt is judged against."""

    task: tasks.TaskFile
    size: str | dict[str, Any]
    size_name: str
    backend: str
    device: str
    plan: dict[str, Any]
    tolerance: float
    expected: dict[int, dict[str, Any]] = field(default_factory=dict)
    expected_timed: list[dict[str, Any]] = field(default_factory=list)
    baselines: Baselines | None = None
    env: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # the reference process's seconds per stage


def make_plan(module, size: str | dict[str, Any], settings: EvalConfig) -> dict[str, Any]:
    trials = [{"index": i, "seed": _seed(), "variant": tasks.VARIANTS[i % len(tasks.VARIANTS)],
               "size": size, "repeat": True} for i in range(settings.trials)]
    shape_trials = []
    if settings.check_shapes:
        shape_trials = [{"index": settings.trials + j, "seed": _seed(), "variant": "scaled", "size": other}
                        for j, other in enumerate(tasks.other_sizes(module, size))]
    return {"init_seed": _seed(), "sample_seed": _seed(), "size": size, "trials": trials,
            "shape_trials": shape_trials, "timed": [],  # sized and filled by prepare, from the baselines
            "warm_seed": _seed(),
            "warmup": settings.warmup_calls, "profile": settings.profile, "floor_slack": settings.floor_slack}


def child_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan as the candidate's child gets it: timed seeds are handed out one call at a time."""
    return {**{k: v for k, v in plan.items() if k != "timed"}, "timed_calls": len(plan["timed"])}


def device_for(backend: str) -> str:
    return "cuda" if backend == "cuda" else "cpu"


def prepare(task: tasks.TaskFile, size: str | dict[str, Any], backend: str, settings: EvalConfig,
            cached_baselines: Callable[[str], str | None] | None = None,
            env: dict[str, str] | None = None) -> TaskBench:
    """Run the reference process for a task: expected outputs for this run's seeds, and baselines
    (taken from `cached_baselines(key)` when it has them)."""
    module = tasks.load_module(task, size)
    plan = make_plan(module, size, settings)
    bench = TaskBench(task, size, tasks.effective_size(module, size), backend, device_for(backend), plan,
                      tasks.tolerance(module, settings.tolerance))
    job = {"task_path": str(task.path.resolve()), "device": bench.device, "size": size, "init_seed": plan["init_seed"],
           "sample_seed": plan["sample_seed"], "trials": plan["trials"] + plan["shape_trials"],
           "warmup": plan["warmup"], "compile_baseline": settings.compile_baseline, "timed_ms": settings.timed_ms,
           "timed_calls": settings.timed_calls, "max_timed_calls": settings.max_timed_calls}
    started = time.monotonic()
    child = sandbox.start("pipeline.reference", [], settings.timeout_s * 2, env)
    child.send(job)
    ready = child.receive()
    if not ready or ready.get("event") != "ready":
        code, log = child.finish()
        raise EvaluationError(f"task {task.name}: reference process failed to start: {_tail(log)}")
    bench.env = {k: ready[k] for k in ("device_name", "torch_version", "cuda_version")}
    key = baseline_key(bench)
    cached = cached_baselines(key) if cached_baselines else None
    if cached is not None:
        bench.baselines = Baselines.model_validate_json(cached)
    seeds = [_seed() for _ in range(max(settings.timed_calls, settings.max_timed_calls))] if cached is None else []
    child.send({"baselines": cached is None, "baseline_seeds": seeds})
    while (msg := child.receive()) is not None and msg.get("event") != "done":
        if msg["event"] == "expected":
            bench.expected[msg["index"]] = msg
        elif msg["event"] == "expected_timed":
            bench.expected_timed.append(msg)
        elif msg["event"] == "baselines":
            bench.baselines = _baselines(msg)
        elif msg["event"] == "need_timed":
            b = bench.baselines
            medians = [t.median_ms for t in (b.eager, b.compiled) if t] if b else []
            plan["timed"] = [_seed() for _ in range(timed_count(settings, *medians))]
            child.send({"timed": plan["timed"]})
    code, log = child.finish()
    bench.phases = _reference_phases(started, child.messages)
    if msg is None or len(bench.expected_timed) != len(plan["timed"]):
        raise EvaluationError(f"task {task.name}: reference process failed (status {code}): {_tail(log)}")
    return bench


def timed_count(settings: EvalConfig, *baseline_ms: float | None) -> int:
    """Timed calls for this task: more when its faster baseline is short (timing.calls_for); a kernel
    worth keeping is at least about that fast, and baselines and candidates then get the same rule."""
    fastest = min((t for t in baseline_ms if t), default=None)
    return calls_for(fastest, settings.timed_ms, settings.timed_calls, settings.max_timed_calls)


def _reference_phases(started: float, messages: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds from start to the last message of each kind (start-up, expected outputs, baselines)."""
    ends: dict[str, float] = {}
    for m in messages:
        ends[m.get("event", "?")] = m["_at"] - started
    names = {"ready": "startup", "expected": "trials", "expected_timed": "timed_outputs", "baselines": "baselines",
             "done": "done"}
    return {names[k]: round(v, 2) for k, v in ends.items() if k in names}


def baseline_key(bench: TaskBench) -> str:
    env = bench.env
    return ":".join([bench.task.name, bench.task.sha, bench.size_name, bench.backend, env["device_name"],
                     env["torch_version"], f"timing{TIMING_VERSION}"])


def _baselines(msg: dict[str, Any]) -> Baselines:
    return Baselines(eager=Timing(**msg["eager"]), compiled=Timing(**msg["compiled"]) if "compiled" in msg else None,
                     floor_ms=msg["floor_ms"], bandwidth_gbs=msg["bandwidth_gbs"], input_bytes=msg["input_bytes"],
                     eager_plain_ms=msg.get("eager_plain_ms"), compiled_plain_ms=msg.get("compiled_plain_ms"))


def _tail(log: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in log.strip().splitlines()[-lines:]) or "(no output)"


def compare(got: dict[str, Any], want: dict[str, Any], tol: float, device: str) -> TrialResult:
    """Judge one output digest against the reference's; index and variant are filled by the caller."""
    def fail(verdict: Verdict, error: str, **extra) -> TrialResult:
        return TrialResult(index=0, variant="", ok=False, verdict=verdict, error=error, **extra)

    if not got.get("exact_tensor"):
        return fail(Verdict.wrong_type, f"returned {got.get('type')}, expected exactly torch.Tensor")
    if got["device"].split(":")[0] != device:
        return fail(Verdict.wrong_type, f"returned a tensor on {got['device']}, expected {device}")
    if got["shape"] != want["shape"]:
        return fail(Verdict.wrong_shape, f"shape {tuple(got['shape'])}, the reference returns {tuple(want['shape'])}")
    if want.get("ref_dtype") and got["dtype"] != want["ref_dtype"]:
        return fail(Verdict.wrong_dtype, f"dtype {got['dtype']}, the reference returns {want['ref_dtype']}")
    if not got.get("finite", True):
        return fail(Verdict.non_finite, "output holds NaN or Inf")
    a, b = wire.values(got), wire.values(want)
    if a.shape != b.shape:
        return fail(Verdict.mismatch, "output digest has the wrong number of values")
    diff = np.abs(a - b)
    mag = np.abs(b)
    # Magnitude-aware: relative per element, with the output's mean magnitude as the absolute
    # floor, so zeros never pass against a non-zero reference (KernelBench #165).
    bound = tol * (mag + (mag.mean() if mag.size else 0.0))
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = max_abs / max(float(mag.max()) if mag.size else 0.0, 1e-30)
    ok = bool(np.all(diff <= bound))
    if ok and "sum" in want:
        ok = abs(got["sum"] - want["sum"]) <= tol * max(want["abs_sum"], 1e-30)
    if not ok:
        return fail(Verdict.mismatch, f"max relative error {max_rel:.3g} exceeds tolerance {tol:g}",
                    max_abs_err=max_abs, max_rel_err=max_rel)
    return TrialResult(index=0, variant="", ok=True, max_abs_err=max_abs, max_rel_err=max_rel)


def judge_trial(msg: dict[str, Any], want: dict[str, Any], spec: dict[str, Any], bench: TaskBench) -> TrialResult:
    at = spec["size"] if isinstance(spec["size"], str) else "custom"
    label = {"index": spec["index"], "variant": spec["variant"] if spec["size"] == bench.size
             else f"{spec['variant']}@{at}"}
    if "error" in msg:
        return TrialResult(**label, ok=False, verdict=Verdict.runtime_error, error=msg["error"])
    result = compare(msg["output"], want, bench.tolerance, bench.device)
    if result.ok and not msg.get("inputs_unchanged", True):
        result = TrialResult(index=0, variant="", ok=False, verdict=Verdict.inputs_mutated,
                             error="the candidate changed its inputs")
    if result.ok and msg.get("output_after_sync") != msg["output"]:
        result = TrialResult(index=0, variant="", ok=False, verdict=Verdict.nondeterministic,
                             error="the output changed after the call returned (work left running)")
    if result.ok and "repeat" in msg:
        again = compare(msg["repeat"], want, bench.tolerance, bench.device)
        if not again.ok:
            result = TrialResult(index=0, variant="", ok=False, verdict=Verdict.nondeterministic,
                                 error=f"a second call on the same inputs disagrees: {again.error}")
    return result.model_copy(update=label)


def evaluate(bench: TaskBench, code_path: Path, build_dir: Path, settings: EvalConfig,
             env: dict[str, str] | None = None, spares: sandbox.Spares | None = None) -> EvalResult:
    """Judge one built candidate; `env` adds to the child's environment (a lane's CUDA_VISIBLE_DEVICES).
    With `spares`, the child is one started ahead of time, and the next attempt's is started now."""
    started = time.monotonic()
    env = {"MAX_JOBS": str(os.cpu_count() or 1), **(env or {})}
    init = {"device": bench.device, "profiler": settings.profile}
    job = {"task_path": str(bench.task.path.resolve()), "size": bench.size, "code_path": str(Path(code_path).resolve()),
           "device": bench.device, "memory_gb": settings.memory_limit_gb,
           "extensions_dir": str(Path(build_dir).resolve())}
    child = spares.take(env, settings.timeout_s) if spares else None
    if child is None:
        child = sandbox.start("pipeline.harness", ["eval"], settings.timeout_s, env)
        child.send(init)
    if spares:
        spares.spawn(env, init)
    child.send(job)
    messages: dict[str, dict[str, Any]] = {}
    trials: dict[int, dict[str, Any]] = {}
    next_seed = 0
    while (msg := child.receive()) is not None:
        event = msg.get("event")
        if event == "imported":
            messages.setdefault(event, msg)
            child.send(child_plan(bench.plan))
        elif event == "need_seeds" and _seed_request_ok(msg, len(bench.plan["timed"]), next_seed):
            next_seed = msg["index"] + msg["count"]
            child.send({"seeds": bench.plan["timed"][msg["index"]:next_seed]})
        elif event == "trial" and isinstance(msg.get("index"), int):
            trials.setdefault(msg["index"], msg)
        elif event in ("ready", "load_failed", "block_start", "block_end", "timing", "profile", "done"):
            messages.setdefault(event, msg)
        if event == "timing" and spares:
            spares.release(env)  # nothing is timed on this device any more in this attempt
        if event in ("done", "load_failed"):
            break
    if spares:
        spares.release(env)
    code, log = child.finish()
    result = _verdict(bench, messages, trials, child, code, log)
    ended = time.monotonic()
    return result.model_copy(update={
        "device": bench.env.get("device_name", ""), "torch_version": bench.env.get("torch_version", ""),
        "cuda_version": bench.env.get("cuda_version"), "baselines": bench.baselines,
        "eval_seconds": ended - started, "phases": _phases(started, messages, ended)})


# Each phase ends at the first message of its name; a phase whose message never came is left out.
_PHASE_ENDS = (("startup", "ready"), ("import", "imported"), ("trials", "block_start"), ("timing", "timing"),
               ("profile", "profile"), ("other_sizes", "done"))


def _phases(started: float, messages: dict[str, dict[str, Any]], ended: float) -> dict[str, float]:
    phases, last = {}, started
    for phase, event in _PHASE_ENDS:
        at = messages.get(event, {}).get("_at")
        if at is not None:
            phases[phase] = round(at - last, 3)
            last = at
    phases["teardown"] = round(ended - last, 3)
    return phases


def _seed_request_ok(msg: dict[str, Any], total: int, expected: int) -> bool:
    """Seeds go out one block at a time, in order, never ahead of the block about to be timed."""
    first, count = msg.get("index"), msg.get("count")
    return first == expected and first < total and count == min(BLOCK, total - first)


def _ended_early(child, code: int, log: str, what: str) -> EvalResult:
    if child.timed_out:
        return EvalResult(verdict=Verdict.timeout, error=f"killed after {child.deadline - child.started:.0f} s "
                          f"while waiting for {what}", detail=log[-4000:])
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return EvalResult(verdict=Verdict.crashed, error=f"child killed by {name} before {what}", detail=log[-4000:])
    return EvalResult(verdict=Verdict.crashed, error=f"child exited with status {code} before {what}: {_tail(log, 1)}",
                      detail=log[-4000:])


def _verdict(bench: TaskBench, messages, trials, child, code: int, log: str) -> EvalResult:
    if "ready" not in messages:
        return _ended_early(child, code, log, "loading the task")
    if "load_failed" in messages:
        m = messages["load_failed"]
        return EvalResult(verdict=Verdict.load_failed, error=m["error"], detail=m.get("traceback"))
    judged: list[TrialResult] = []
    for spec in bench.plan["trials"]:
        if spec["index"] not in trials:
            return _ended_early(child, code, log, f"trial {spec['index']}").model_copy(update={"trials": judged})
        t = judge_trial(trials[spec["index"]], bench.expected[spec["index"]], spec, bench)
        judged.append(t)
        if not t.ok:
            return EvalResult(verdict=t.verdict, error=f"trial {t.index} ({t.variant}): {t.error}", trials=judged,
                              detail=trials[spec["index"]].get("traceback"))
    timing_msg = messages.get("timing")
    if timing_msg is None:
        return _ended_early(child, code, log, "timing").model_copy(update={"trials": judged})
    wall = _wall_per_call(messages)
    problem = _check_timing(bench, timing_msg, messages, wall)
    timing = Timing(**summarize_blocks(timing_msg["times_ms"])) if problem is None or problem[0] != Verdict.crashed else None
    if problem:
        return EvalResult(verdict=problem[0], error=problem[1], trials=judged, timing=timing, wall_ms_per_call=wall)
    flags = []
    prof = messages.get("profile", {})
    if prof.get("torch_fraction") is not None and prof["torch_fraction"] > NO_CUSTOM_KERNEL_FRACTION:
        flags.append(Flag.no_custom_kernel)
    for spec in bench.plan["shape_trials"]:
        msg = trials.get(spec["index"])
        t = judge_trial(msg, bench.expected[spec["index"]], spec, bench) if msg else TrialResult(
            index=spec["index"], variant=f"scaled@{spec['size']}", ok=False, verdict=Verdict.crashed,
            error="no result at this size")
        judged.append(t)
        if not t.ok and Flag.shape_specialized not in flags:
            flags.append(Flag.shape_specialized)
    detail = json.dumps({"profile": prof}) if prof else None
    return EvalResult(verdict=Verdict.correct, flags=flags, trials=judged, timing=timing, wall_ms_per_call=wall,
                      detail=detail)


def _wall_per_call(messages) -> float | None:
    start, end = messages.get("block_start"), messages.get("block_end")
    if not start or not end or not isinstance(end.get("calls"), int) or end["calls"] <= 0:
        return None
    return (end["_at"] - start["_at"]) * 1e3 / end["calls"]


def _check_timing(bench: TaskBench, msg: dict[str, Any], messages, wall: float | None) -> tuple[Verdict, str] | None:
    times, outputs = msg.get("times_ms"), msg.get("outputs")
    n = len(bench.plan["timed"])
    if not isinstance(times, list) or not isinstance(outputs, list) or len(times) != n or len(outputs) != n:
        return Verdict.crashed, f"timing report malformed: expected {n} timed calls"
    if not all(isinstance(t, (int, float)) and np.isfinite(t) and t > 0 for t in times):
        return Verdict.impossible_timing, "a timed call reported a non-positive or non-finite time"
    for i, (got, want) in enumerate(zip(outputs, bench.expected_timed)):
        r = compare(got, want, bench.tolerance, bench.device)
        if not r.ok:
            return r.verdict, f"timed call {i} returned a wrong result ({r.error}): cached, stale or drifting output"
    median = summarize_blocks(times)["median_ms"]
    b = bench.baselines
    if b and b.floor_ms and median < b.floor_ms * _floor_slack(bench):
        return (Verdict.impossible_timing, f"median {median:.4g} ms is below the bandwidth floor {b.floor_ms:.4g} ms "
                f"({b.input_bytes / 1e6:.1f} MB at {b.bandwidth_gbs:.0f} GB/s): the input cannot have been read")
    if wall is None:
        return Verdict.crashed, "the wall-clock block was not reported"
    block = messages["block_end"]
    calls = block["calls"]
    child_ms = block.get("ms")
    if not isinstance(child_ms, (int, float)) or not np.isfinite(child_ms) or child_ms <= 0:
        return Verdict.impossible_timing, "the wall-clock block reported no valid time"
    # The child's own clock over the block against ours over the same calls: a tampered clock reads
    # low. Ours also counts pipe latency and our own scheduling, hence the absolute slack.
    if child_ms < wall * calls * WALL_CLOCK_SLACK and wall * calls - child_ms > WALL_CLOCK_ABS_MS:
        return (Verdict.impossible_timing, f"the child's clock says {child_ms / calls:.4g} ms per call but the "
                f"parent's wall clock saw {wall:.4g} ms per call: the timer was tampered with")
    # On a GPU, timed calls against back-to-back calls on the child's own wall clock (checked
    # against ours above): a patched event timer reads far below it. Not on the CPU, where a loaded
    # machine made honest back-to-back blocks 50x slower than flushed single calls (a thread pool
    # waiting on a descheduled thread), so the check could only reject honest work.
    if bench.device != "cpu" and median < EVENT_SLACK * child_ms / calls - EVENT_ABS_MS:
        return (Verdict.impossible_timing, f"timed calls say {median:.4g} ms per call but back-to-back calls "
                f"took {child_ms / calls:.4g} ms each: the per-call timer was tampered with, or the call is "
                f"bound by host work (which the hold ahead of each timed call hides) rather than device work")
    return None


def _floor_slack(bench: TaskBench) -> float:
    return bench.plan.get("floor_slack", 0.85)
