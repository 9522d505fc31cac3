"""The held-out sizes after their trials: whether the candidate's own kernel ran there and how fast.

A held-out trial that passes says the output was right, not whose code made it: a kernel hard-wired
to the declared size that hands every other size to PyTorch is right everywhere
(tests/redteam/hardwired_size_fallback.py). So at each held-out size whose trial passed the parent
asks for the child's profile of one call there (a claim: which ops took the time), times POLICY.shape_blocks
blocks of the candidate's calls with an eager block by the reference after each (the child paused),
as the main size is timed, and checks one call of each block against the reference in secret. The
library serves a kernel at a held-out size only where all three held (ShapeRun.served).

What this does not do: no Bound requests at these sizes, so the times are the child's clock; the
parent's bound on that clock was checked at the main size (pipeline.judge), and the parent's own
clock around each request is kept beside them (ShapeRun.wall_ms, an upper bound).
"""

from __future__ import annotations

import random
import time
from typing import Any

from ..child import protocol as P
from ..child.timing import BLOCK, summarize_blocks
from ..leaderboard import faster
from ..records import ShapeRun, Timing, TrialResult
from . import beside, owncode
from .bench import EvaluationError, _seed
from ..policy import POLICY


def draw(trials: list[P.Trial], main_size, calls: int = BLOCK) -> tuple[dict[int, list[list[int]]], dict[str, dict[str, Any]]]:
    """Per held-out trial (by index) the seeds of its timed blocks of `calls` calls, and the one call
    of each block the parent checks in full (chosen in secret, as the main blocks' are)."""
    rng = random.SystemRandom()
    seeds: dict[int, list[list[int]]] = {}
    checked: dict[str, dict[str, Any]] = {}
    for trial in trials:
        if trial.size == main_size:
            continue
        seeds[trial.index] = [[_seed() for _ in range(calls)] for _ in range(POLICY.shape_blocks)]
        for b, block in enumerate(seeds[trial.index]):
            j = rng.randrange(len(block))
            checked[f"shape{trial.index}_{b}_{j}"] = {"size": trial.size, "seed": block[j], "variant": "base"}
    return seeds, checked


def held_out(session, trial: P.Trial, passed: TrialResult, interpreted_eager_ms: float | None) -> ShapeRun:
    """One held-out size whose trial passed (`session`: pipeline.judge.session.Session, mid-conversation).
    An Ended raised here ends the held-out sizes as a failed trial there would."""
    label = passed.variant.split("@", 1)[1]
    run = ShapeRun(size=label, correct=True)
    own = session.own
    if own is not None and own.holds_own is False:  # the parent's finding: nothing of its own to run
        run.own_ran = False
    elif session.settings.profile:
        at = time.monotonic()
        prof, _ = session.ask(P.Profile(size=trial.size), P.ProfileDone, f"the profile at {label}")
        session.spent("shapes_profile", at)
        claim = owncode.pytorch_did_it(prof, interpreted_eager_ms, owncode.library_allowed(session.bench.task.level))
        run.own_ran = None if claim is None else not claim
        run.torch_fraction = prof.torch_fraction
    if not session.timed_too:
        run.error = "the device was not fit to time (pipeline.judge.health): not timed"
        return run
    times: list[float] = []
    eager: list[float] = []
    wall = 0.0
    for b, seeds in enumerate(session.plan.shape_timed.get(trial.index, [])):
        at = time.monotonic()
        reply, ms = session.ask(P.Timed(index=trial.index, seeds=seeds, size=trial.size), P.TimedDone,
                                f"timed block {b} at {label}")
        if len(reply.outputs) != len(seeds) or len(reply.times_ms) != len(seeds) or min(reply.times_ms) <= 0:
            run.correct, run.error = False, f"timed block {b} at {label}: a time or output missing or not positive"
            return run
        problem = session.check_block(f"shape{trial.index}_{b}", f"timed call at {label}", b * len(seeds),
                                      reply.outputs, like=f"trial{trial.index}")
        if problem:
            run.correct, run.error = False, problem[1]
            return run
        times.extend(reply.times_ms)
        wall += ms
        at = session.spent("shapes_child", at)
        try:
            with session.child.paused():  # what the candidate left running must not slow eager (as beside.eager_block)
                block = beside.reference_block(session, len(seeds), first=b == 0, compiled=False, size=trial.size)
            why = session.block_error
        except EvaluationError as exc:  # the reference died there; the next request starts it again
            block, why = None, str(exc)[-300:]
        finally:
            session.spent("shapes_eager", at)
        if block is None:
            run.error = f"eager at {label} was not timed: {why}"
            return run
        eager.extend(block)
    if not times or len(eager) != len(times):
        run.error = f"eager at {label} was not timed"
        return run
    # Quartiles over the calls, not the block means: of three means they would be extrapolated.
    run.time, run.eager = Timing(**summarize_blocks(times, 1)), Timing(**summarize_blocks(eager, 1))
    run.wall_ms = wall / len(times)
    run.faster = bool(faster(run.time.median_ms, run.time.p75_ms, run.eager.median_ms))
    return run
