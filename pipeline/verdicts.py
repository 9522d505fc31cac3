"""The judge's verdict: its outcomes (Verdict), its marks (Flag), what may be read of its figure
(Standing), and the record that holds all of them (Outcome), which pipeline.judge.decide.decide returns.
Nothing here imports the rest of the package (pipeline.records re-exports every name).
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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
    """The judge's whole verdict on one evaluation: what `pipeline.judge.decide.decide` returns, and the
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
    """Where this is a second evaluation's verdict (a GPU's refusal on the parent's clock alone is
    judged again): the first one's refusal."""

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


