"""The judge's verdict: its outcomes (Verdict), its marks (Flag), what may be read of its figure
(Standing), the record that holds all of them (Outcome), and the rule that makes it.

Measure, then decide: what one evaluation measured (`Measured`, frozen: the session's verdict on
its values, the room, the parent's clock) turned by a pure rule (`decide`) into its `Decision`: the
Outcome, a refusal the rule made itself, whether the figure is kept, and whether the candidate is
judged again. Every threshold comes from pipeline.policy or the run's EvalConfig, carried in the
record: a time below what the inputs' bytes or the reference's arithmetic allow is
impossible_timing; a time the cpu's load or the protocol's noise swamped is no figure (re-timed); a
room below what the config requires, or one that left processes, keeps the verdict out of `best`.
`decide` reads nothing but its argument (tests/test_decide.py: a table of recorded measurements).
Nothing here imports the rest of the package but its policy (pipeline.records re-exports the types).
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .policy import POLICY


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class Verdict(str, enum.Enum):
    """The fixed set of outcomes an attempt can end in."""

    extract_failed = "extract_failed"
    build_failed = "build_failed"
    build_timeout = "build_timeout"
    load_failed = "load_failed"
    runtime_error = "runtime_error"
    timeout = "timeout"
    crashed = "crashed"
    wrong_type = "wrong_type"
    wrong_shape = "wrong_shape"
    wrong_dtype = "wrong_dtype"
    non_finite = "non_finite"
    mismatch = "mismatch"
    no_gradient = "no_gradient"
    missing_gradient = "missing_gradient"
    wrong_gradient = "wrong_gradient"
    inputs_mutated = "inputs_mutated"
    nondeterministic = "nondeterministic"
    impossible_timing = "impossible_timing"
    protocol_error = "protocol_error"
    correct = "correct"
    waiting_gpu = "waiting_gpu"
    model_error = "model_error"

    @property
    def failed_before_running(self) -> bool:
        return self in {Verdict.extract_failed, Verdict.build_failed, Verdict.build_timeout,
                        Verdict.model_error}


class Flag(str, enum.Enum):
    """Marks stored beside a correct verdict."""

    no_custom_kernel = "no_custom_kernel"
    shape_specialized = "shape_specialized"


class Standing(str, enum.Enum):
    """What may be read of a verdict's figure (its time and ratios)."""

    kept = "kept"
    """Timed on a fit device by a room that held every layer the config requires: the figure stands."""
    untrusted = "untrusted"
    """The room held less than the config requires, processes outlived it, or the parent's bound on its
    time was loose: the verdict stands, the attempt is kept out of `best`, the leaderboard, the
    library and evolve's parents."""
    unfit = "unfit"
    """The device was not fit to time it (pipeline.judge.health, or a cpu too loaded): no figure at all,
    and a resume on a fit device re-times it."""


class Outcome(Record):
    """The judge's whole verdict on one evaluation: what `decide` returns, and the
    only thing a reader needs to tell a verified kernel from the rest."""

    verdict: Verdict
    """The outcome."""
    findings: list[Flag] = Field(default_factory=list)
    """Marks beside a correct verdict that the parent found itself (pipeline.judge.owncode.flags_for)."""
    claims: list[Flag] = Field(default_factory=list)
    """Marks raised on the child's own report (its profile), which the parent did not check."""
    standing: Standing = Standing.kept
    """What may be read of the figure."""
    why: str | None = None
    """Why the standing is not `kept`, in one line."""
    earlier: str | None = None
    """Where a later evaluation made the verdict (Again.retime; and policy 8 and before), why the first
    one's clock gave none: its refusal, or why it had no figure."""

    @property
    def flags(self) -> list[Flag]:
        """Every mark, the parent's first."""
        return [*self.findings, *(f for f in self.claims if f not in self.findings)]


# EvalResult's fields before Outcome held them: rows stored then, and the short constructors
# (EvalResult(verdict=..., error=...)), are read into `outcome`.
_LEGACY = ("verdict", "flags", "claimed_flags", "trusted", "untrusted_reason", "device_unfit", "first_refusal")


def _outcome_of(old: dict[str, Any]) -> dict[str, Any]:
    flags = list(old.get("flags") or [])
    claims = [f for f in old.get("claimed_flags") or [] if f in flags]
    if old.get("trusted", True) is False:
        standing, why = Standing.untrusted, old.get("untrusted_reason")
    elif old.get("device_unfit"):
        standing, why = Standing.unfit, old["device_unfit"]
    else:
        standing, why = Standing.kept, None
    return {"verdict": old["verdict"], "findings": [f for f in flags if f not in claims], "claims": claims,
            "standing": standing, "why": why, "earlier": old.get("first_refusal")}


# ---- measure, then decide ---------------------------------------------------------------------

# Where the device was unfit to time: none of the figure is kept (EvalResult's fields).
NO_FIGURE = {"timing": None, "eager_ratio": None, "compiled_ratio": None, "eager_beside": None,
             "compiled_beside": None, "wall_ms_per_call": None}


class Clock(Record):
    """The parent's time of the candidate's calls, and the floors it is held against."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ms: float
    """Milliseconds a call, the median of each Bound request's window net of a null request's
    (pipeline.judge.clocks): the parent's clock, on the cpu and on a GPU."""
    requests: int = 0
    """On the cpu, the Bound requests timed ..."""
    empty: int = 0
    """... and how many of them took no longer than the calibration's fastest null request (net 0)."""
    load_share: float | None = None
    """On the cpu, the share of the timed windows that went to run-queue waits (clocks.load_share)."""
    noise: float | None = None
    """On the cpu, the null requests' interquartile range over the median request's net time
    (clocks.null_noise): past POLICY.cpu_noise the calls are lost in the protocol's own variation."""
    floor_ms: float | None = None
    """The bandwidth floor: the input's bytes over the device's measured bandwidth (the lower of the
    bench's and one measured again now, where `ms` was below the bench's)."""
    input_bytes: int = 0
    bandwidth_gbs: float | None = None
    compute_floor_ms: float | None = None
    """The compute floor, where EvalConfig.compute_floor is on: the reference's flops at the best rate measured."""
    flops: int | None = None
    flops_per_s: float | None = None
    floor_slack: float = 0.85
    """EvalConfig.floor_slack: a time below a floor x this is impossible."""
    replayed: bool = False
    """Timed from replays on a GPU, each request less the reference's null replay beside it."""
    spread: float | None = None
    """The requests' interquartile range over their median (clocks.spread)."""


class Measured(Record):
    """What one evaluation ended with, as `decide` reads it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verdict: Verdict
    """The session's verdict: its trials and checked calls (and a GPU busy beside its requests)."""
    findings: list[Flag] = []
    """Marks the parent found itself (pipeline.judge.owncode.flags_for)."""
    claims: list[Flag] = []
    """Marks raised on the child's own profile."""
    missing: list[str] | None
    """The confinement layers the config requires that the room did not hold; None: the child never
    reported its confinement (it ended before it could)."""
    left: str | None = None
    """Processes of the attempt seen alive after it, from outside (by construction none)."""
    loose_bound: str | None = None
    """Why the parent's bound on the candidate's time was too loose to trust its figure."""
    unfit: str | None = None
    """Why the device was not fit to time it: the health check before or after, or baselines
    measured on an unfit device."""
    clock: Clock | None = None
    """The parent's time of the calls, where they were timed."""


class Again(str, enum.Enum):
    """Whether the candidate is judged again, and how."""

    no = "no"
    fresh = "fresh"
    """A fresh evaluation, up to EvalConfig.load_retries: the cpu was too loaded to time on (load is waited out)."""
    retime = "retime"
    """A fresh evaluation, up to EvalConfig.load_retries, the first's reason kept (Outcome.earlier): a GPU's
    replayed requests put under a floor, none longer than its null, or disagreeing past
    POLICY.replay_spread. Each request holds about POLICY.replay_target_ms of calls, or at KernelBench's
    sizes one call beside milliseconds of null, and a machine disturbed for a moment moves that null
    (docs/decisions/gpu-timing.md). A candidate that makes its own requests disagree gets no figure."""


class Decision(Record):
    model_config = ConfigDict(frozen=True, extra="forbid")

    outcome: Outcome
    error: str | None = None
    """The refusal's reason, where the rule refused (the floors); else the session's error stands."""
    figure: bool = True
    """False where the device was unfit to time: no figure is kept (NO_FIGURE)."""
    again: Again = Again.no


def below_floor(c: Clock) -> str | None:
    """Why a time is impossible: below the bandwidth floor, or the compute floor, x the slack."""
    if c.floor_ms and c.ms < c.floor_ms * c.floor_slack:
        return (f"median {c.ms:.4g} ms is below the bandwidth floor {c.floor_ms:.4g} ms ({c.input_bytes / 1e6:.1f} MB "
                f"at {c.bandwidth_gbs or 0:.0f} GB/s): the input cannot have been read")
    if c.compute_floor_ms and c.ms < c.compute_floor_ms * c.floor_slack:
        return (f"median {c.ms:.4g} ms is below the compute floor {c.compute_floor_ms:.4g} ms ({(c.flops or 0) / 1e9:.3g} "
                f"GFLOP at the device's best measured {(c.flops_per_s or 0) / 1e12:.3g} TFLOP/s): the reference's "
                f"arithmetic cannot have been done (evaluation.compute_floor: false for a task whose algebra skips it)")
    return None


def _clock(m: Measured) -> tuple[str | None, str | None, bool]:
    """(a refusal, why the time is no figure, whether that is the cpu's load) from the parent's
    clock: the protocol's noise, the floors, the load, in that order."""
    c = m.clock
    if c is None or m.verdict is not Verdict.correct:
        return None, None, False
    if c.requests and 2 * c.empty >= c.requests:  # the protocol's noise around calls of microseconds, not a time
        return None, (f"the calls are too short to time here: {c.empty} of {c.requests} Bound requests "
                      f"took no longer than a null request"), False
    if c.noise is not None and c.noise > POLICY.cpu_noise:
        return None, (f"the calls are too short to time here: the null request varies by {c.noise:.0%} of "
                      f"a request's calls"), False
    if c.replayed and c.spread is not None and c.spread > POLICY.replay_spread:
        return None, (f"the requests disagree: their interquartile range is {c.spread:.2g} times their median "
                      f"(the GPU or its host was disturbed while they were timed)"), False
    if (why := below_floor(c)) is not None:
        return why, None, False
    if m.verdict is Verdict.correct and c.load_share is not None and c.load_share >= POLICY.loaded_share:
        return None, (f"the cpu was loaded: {c.load_share:.0%} of the timed windows went to run-queue waits "
                      f"(other processes, or the candidate's own threads)"), True
    return None, None, False


def decide(m: Measured) -> Decision:
    """The rule. The room comes first: a figure from a room below what the config requires is never
    kept, whatever else holds; then the device and the clock."""
    refusal, clock_unfit, loaded = _clock(m)
    verdict = Verdict.impossible_timing if refusal else m.verdict
    unfit = m.unfit or clock_unfit
    why = None
    if m.missing is None:
        why = "the child never reported its confinement"
    elif m.missing:
        why = f"confinement below what the config requires: no {', '.join(m.missing)}"
    elif m.left:
        why = f"processes of the attempt outlived it: {m.left}"
    elif m.loose_bound and verdict is Verdict.correct:
        why = m.loose_bound
    if why is not None:
        standing = Standing.untrusted
        why = f"{why}; not timed: {unfit}" if unfit else why
    elif unfit:
        standing, why = Standing.unfit, unfit
    else:
        standing = Standing.kept
    marks = dict(findings=m.findings, claims=m.claims) if refusal is None else {}  # marks sit beside a pass
    outcome = Outcome(verdict=verdict, standing=standing, why=why, **marks)
    if standing is Standing.unfit and loaded and not m.unfit:
        again = Again.fresh
    elif m.clock is not None and m.clock.replayed and (refusal or (clock_unfit and not m.unfit)):
        again = Again.retime
    else:
        again = Again.no
    return Decision(outcome=outcome, error=refusal, figure=not unfit, again=again)

