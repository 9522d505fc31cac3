"""What a run reports as it goes: one typed record per event, handed to the runner's `on_event` (the
CLI's progress shows them: pipeline.cli.progress). A slot's events come in this order: Planned, then
Cached or Asking (or OverBudget), Answered, Building and Built, Evaluating and Evaluated (Unfit where
the device was not fit to time), Stored; Failed where an attempt raised instead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..records import BuildResult, Completion, EvalResult
from .work import Slot


@dataclass(frozen=True)
class RunStart:
    """What a run is about to do: the first thing Progress reports."""

    run_id: str
    resumed: bool
    tasks: int
    models: int
    samples: int
    backend: str
    strategy: str
    stored: int
    """Attempts of this run already in the database (a resume does not redo them)."""
    todo: int
    """Slots still to do (a search's later turns come on top)."""
    build_workers: int | None = None
    """Builds at once, where the executor says."""


@dataclass(frozen=True)
class SlotEvent:
    slot: Slot
    """The attempt this is about."""


@dataclass(frozen=True)
class Planned(SlotEvent):
    """An attempt to make: it needs an answer, then is stored."""


@dataclass(frozen=True)
class Cached(SlotEvent):
    """The answer came from the completions cache (a resume asks no model twice)."""

    completion: Completion


@dataclass(frozen=True)
class OverBudget(SlotEvent):
    """Not asked: the run's budget is spent (a run with a larger budget picks it up)."""


@dataclass(frozen=True)
class Asking(SlotEvent):
    """The model call starts."""


@dataclass(frozen=True)
class Answered(SlotEvent):
    """The model answered, or its call failed (completion.error)."""

    completion: Completion


@dataclass(frozen=True)
class Building(SlotEvent):
    """The answer's code goes to a build child."""


@dataclass(frozen=True)
class Built(SlotEvent):
    result: BuildResult


@dataclass(frozen=True)
class Evaluating(SlotEvent):
    """The built candidate goes to the judge."""


@dataclass(frozen=True)
class Evaluated(SlotEvent):
    result: EvalResult


@dataclass(frozen=True)
class Unfit(SlotEvent):
    """The device was not fit to time during the attempt: its timings are not trusted."""

    reason: str


@dataclass(frozen=True)
class Stored(SlotEvent):
    result: EvalResult


@dataclass(frozen=True)
class Failed(SlotEvent):
    """The attempt raised: not stored (a resume does it again), and the run fails at its end."""

    error: BaseException


@dataclass(frozen=True)
class Prepared(SlotEvent):
    """The slot's task has its reference process and baselines: seconds per stage of that."""

    phases: dict[str, float]


@dataclass(frozen=True)
class Released:
    """A task's attempts are over: its reference process is closed and its memory goes back."""

    task: str


@dataclass(frozen=True)
class LaneNotice:
    """A lane taken out of service, in words (pipeline.run.lanes)."""

    line: str


Event = Union[RunStart, Planned, Cached, OverBudget, Asking, Answered, Building, Built, Evaluating, Evaluated, Unfit,
              Stored, Failed, Prepared, Released, LaneNotice]
