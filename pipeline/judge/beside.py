"""What an attempt times besides the candidate's calls: the calibration (a null model's Bound requests
before the import, with the reference's null replays), the reference's eager and torch.compile blocks
right after each of the candidate's (the child stopped), so a speedup is a ratio of times taken in the
same window, and the reference's null replay beside each replayed Bound request (replayed). `session`
is the attempt's pipeline.judge.session.Session (not imported: the session imports this)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np

from ..child import protocol as P
from . import health, refproto as R
from .bench import EvaluationError, _seed
from ..records import Verdict
from .clocks import Window, calibration_offset
from .judge import digest_ok
from ..policy import POLICY


def calibrate(session: Any) -> None:
    """The calibration, while the child still runs only our own code: Bound requests of a null model
    (eager, then replayed from CUDA graphs where the plan replays), each timed by the parent's clock.
    The first of each kind makes the input sets and maps the inbox's pages: a warm-up, not counted."""
    bench, plan = session.bench, session.plan
    calls = len(plan.bounds[0])
    # The reference's compiler warm-up (pipeline.judge.reference.CompilerWarmup) has ended before the
    # calibration, so that it sees the machine the timed blocks will.
    bench.request(R.Settle(), bench.settings.timeout_s, session.lane)
    session.part("startup_settle")
    noise = [np.random.default_rng().integers(0, 256, session.inbox.set_bytes, dtype=np.uint8)
             for _ in range(calls)] if session.inbox else None
    # On the cpu each null request follows a cold eager block, as the candidate's do: back to back, the
    # nulls would meet warm caches and read low. Not where that costs over POLICY.cold_calibration_ms.
    eager_ms = bench.baselines.eager.median_ms if bench.baselines and bench.baselines.eager else None
    cold = bench.device == "cpu" and eager_ms is not None and eager_ms * calls <= POLICY.cold_calibration_ms
    # Blocks longer than that hide a few milliseconds' stall in their own noise, and cost seconds: the GPU's count.
    long = bench.device == "cpu" and eager_ms is not None and not cold
    blocks = POLICY.calibration_blocks["cpu" if bench.device == "cpu" and not long else "cuda"]
    for i in range(blocks + 1):
        if cold:
            with session.child.paused():
                reference_block(session, calls, False, cold=True)
        _, ms = session.ask_bound(-1 - i, [_seed() for _ in range(calls)], "calibration", noise)
        if i:
            session.calibration.append(Window(ms, calls, session.load))
    noise = None  # a copy of the inputs' size, which the float64 forwards to come need more
    if not plan.replays:
        return
    for i in range(blocks + 1):
        ready, _ = session.ask(P.Bound(index=-100 - i, seeds=[_seed() for _ in range(calls)], replays=plan.replays,
                                       digest_seed=_seed()), P.BoundReady, "calibration")
        if ready.graph_error:
            session.graph_failed = f"the null model could not be replayed: {ready.graph_error}"
            return
        _, ms = session.ask(P.Play(index=-100 - i, factor_seed=_seed()), P.BoundDone, "calibration")
        if not i:
            continue
        session.replay_calibration.append(Window(ms, plan.replays))
        # A null beside every window: the offset is the median of the pairs, which one pair off does not
        # move (docs/decisions/gpu-timing.md). A null replay costs milliseconds.
        at = time.monotonic()
        session.null_calibration.append(play(session, calls, pause=False).get("null"))
        session.spent("calibration_nulls", at)


def eager_block(session: Any, calls: int, first: bool, cold: bool = False) -> None:
    """As many eager (and, where compiled is timed beside, torch.compile) calls, timed by the reference
    right after the candidate's block with the child stopped; paired, each input set drawn is timed eager
    then compiled (one draw for both). `cold`: after a cpu Bound request, timed as its calls were."""
    at = time.monotonic()
    with session.child.paused():  # what the candidate left running must not slow the other side (sandbox.Child.pause)
        at = session.spent("timing_pause", at)
        pair = session.compile_beside
        eager, compiled = reference_block(session, calls, first, cold, pair)
        session.spent("timing_reference" if pair else "timing_eager", at)
        session.eager.append(eager)
        if not pair:
            return
        if compiled is None:  # torch.compile failed in the reference: the prepared baseline stands in
            session.compile_beside, session.compiled = False, []
        else:
            session.compiled.append(compiled)


def reference_block(session: Any, calls: int, first: bool, cold: bool = False,
                    pair: bool = False) -> tuple[list[float], list[float] | None]:
    """One block of eager calls timed by the reference process (its TimeBlock request with fresh seeds,
    Reference.time_block): their times, and with `pair` torch.compile's call by call (eager_block), None
    where torch.compile failed and eager was timed alone, or was not asked for."""
    bench = session.bench
    msgs = bench.request(R.TimeBlock(size=bench.size, init_seed=session.plan.init_seed, cold=cold,
                                     seeds=[_seed() for _ in range(calls)], pair=pair,
                                     warmup=bench.settings.warmup_calls if first else 0), bench.settings.timeout_s, session.lane)
    blocks = [m for m in msgs if isinstance(m, R.Block)]
    if not blocks:
        raise EvaluationError(f"the reference timed no eager block: {msgs[-1] if msgs else 'no reply'}")
    # Timed on a GPU still busy after a wait and a re-timing: the attempt is refused for it (IdleProbe).
    if (busy := blocks[0].busy) and busy.after_ms is not None:
        session.device_busy = _busy("timed", busy)
    return list(blocks[0].times_ms), (None if blocks[0].compiled_ms is None else list(blocks[0].compiled_ms))


def play(session: Any, calls: int, pause: bool, models: tuple[str, ...] = ()) -> dict[str, float]:
    """The reference's replays on its own clock (Reference.play): its null shaped as the candidate's Bound
    request, and `models`' (eager, compiled); with `pause`, the child stopped. {} where the GPU stayed busy
    (with `pause`, the attempt is refused for it) or the null failed; a model that failed is left out."""
    with session.child.paused() if pause else contextlib.nullcontext():
        bench = session.bench
        msgs = bench.request(R.Play(size=bench.size, init_seed=session.plan.init_seed, n_seeds=calls,
                                    replays=session.plan.replays, out_shape=session.out_shape, models=list(models)),
                             bench.settings.timeout_s, session.lane)
    played = [m for m in msgs if isinstance(m, R.Played)]
    if not played:
        return {}
    busy = played[0].busy
    if busy and busy.after_ms is not None:
        if pause:
            session.device_busy = _busy("replayed its models", busy)
        return {}
    return dict(played[0].ms)


def replayed(session: Any, k: int, seeds: list[int]) -> tuple[Verdict, str] | bool | None:
    """Bound request `k` replayed from CUDA graphs: True when its window counts; None where the
    forward could not be captured (the eager request follows, and the bound is loose from here);
    else the verdict of a checked replay whose digest is wrong."""
    plan = session.plan
    ready, _ = session.ask(P.Bound(index=k, seeds=seeds, replays=plan.replays, digest_seed=plan.digest_seeds[k]),
                           P.BoundReady, f"bound block {k}")
    if ready.graph_error:
        session.graph_failed = ready.graph_error
        session.bound_note = f"eager Bound requests: the forward could not be captured ({ready.graph_error[:320]})"
        if "out of memory" in ready.graph_error:  # whose the device's memory was, as the driver says
            refs = {ref.proc.pid for ref in session.bench.references.values()}
            held = health.memory_by_process(session.lane.get("CUDA_VISIBLE_DEVICES") if session.lane else None)
            session.bound_note += " [MiB by process: " + ", ".join(
                f"{pid}{' (reference)' if pid in refs else ''} {mib}" for pid, mib in sorted(held.items())) + "; " + ", ".join(
                f"the reference's allocated/reserved after its last request ({op}): {mib}"
                for op, mib in (getattr(ref, "memory", ("", None)) for ref in session.bench.references.values())) + "]"
        return None
    # Timed alone: the capture, which costs milliseconds that vary, stays out of the window.
    reply, ms = session.ask(P.Play(index=k, factor_seed=plan.factor_seeds[k]), P.BoundDone, f"bound block {k}")
    if len(reply.digests) != plan.replays:
        return Verdict.protocol_error, f"bound block {k}: {len(reply.digests)} digests for {plan.replays} replays"
    for r in plan.replay_checks[k]:
        want = session.digests.get(f"bound{k}@{r}")
        if want is None:
            return Verdict.protocol_error, f"no reference digest for bound block {k}, replay {r}"
        if not digest_ok(reply.digests[r], want.digest, want.scale, session.bench.tolerance,
                         session.bench.settings.dtype, session.expected.get("trial0")):
            return (Verdict.mismatch, f"bound block {k}, replayed call {r}: its digest {reply.digests[r]:.6g} is not "
                    f"the reference's {want.digest:.6g}: the work of a call was skipped or wrong")
    session.replay_windows.append(Window(ms, plan.replays))
    # Eager (and torch.compile) replayed beside it as the candidate's calls are, each less the null beside it.
    played = play(session, len(seeds), pause=True, models=("eager", "compiled") if session.compile_beside else ("eager",))
    session.null_windows.append(played.get("null"))
    if session.device_busy:
        return Verdict.impossible_timing, session.device_busy
    for kind, times in (("eager", session.eager), ("compiled", session.compiled)):
        if kind in played and "null" in played:
            times.append([max(0.0, played[kind] - played["null"]) / plan.replays])
    if session.compile_beside and "compiled" not in played:  # torch.compile could not be replayed: the baseline stands in
        session.compile_beside, session.compiled = False, []
    session.bound_note = f"replayed from CUDA graphs, {plan.replays} calls a request"
    return True


def _busy(doing: str, busy: R.Busy) -> str:
    """Why an attempt is refused where the reference's idle probe (pipeline.judge.health.IdleProbe)
    found the GPU busy after a wait and a re-timing, the child stopped."""
    return (f"the GPU ran other work while the reference {doing} (a probe took {busy.after_ms:.3f} ms, "
            f"{busy.idle_ms:.3f} idle), after a wait and a re-timing: work the candidate left running")


def paired_terms(calibration: list[Window], null_calibration: list[float | None], windows: list[Window],
                 nulls: list[float | None]) -> str:
    """What each paired estimate (clocks.paired_per_call) was made of, in ms, for the stored note: the
    calibration's median, the reference's null median, the pairs' offset, then each request's window and
    its null, to say which term moved where estimates scatter (docs/decisions/gpu-timing.md)."""
    def med(xs: list[float]) -> float:
        return float(np.median(xs)) if xs else float("nan")
    beside = [n for n in null_calibration if n is not None]
    offset = calibration_offset(calibration, null_calibration)
    offset = float("nan") if offset is None else offset
    pairs = ", ".join(f"{w.ms:.3f}/{n:.3f}" if n is not None else f"{w.ms:.3f}/-" for w, n in zip(windows, nulls))
    return (f" (calibration {med([w.ms for w in calibration]):.3f} ms over {len(calibration)}, the reference's null "
            f"{med(beside):.3f} ms over {len(beside)}, offset {offset:.3f} ms over the pairs; window/null {pairs})")
