"""The units of a batch's work, shared by the runner (pipeline.run.batch) and its search
(pipeline.run.search): a Slot is one planned attempt, an Answer what a model said to its prompt,
and Judged what the pipeline made of that answer."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..child import tasks
from ..config import ModelConfig
from ..generate.diagnostics import Diagnostic
from ..records import Completion, EvalResult


@dataclass(frozen=True)
class Slot:
    """One planned attempt."""

    task: tasks.TaskFile
    model: ModelConfig
    template: str
    sample: int
    backend: str
    turn: int = 0
    """Which turn of its conversation (refine, or an evolve child's fixes); 0 for single."""
    generation: int = 0
    """Which generation of its task's archive (evolve); 0 otherwise."""

    @property
    def key(self) -> tuple[str, str, str, int, str]:
        return (self.task.name, self.model.name, self.template, self.sample, self.backend)


@dataclass(frozen=True)
class Answer:
    """A model's answer to one prompt, as stored."""

    completion_id: str
    completion: Completion
    messages: list[dict[str, str]]


@dataclass(frozen=True)
class Judged:
    """What the pipeline made of an answer: the verdict, the hash of the code it judged, the compiler's errors."""

    result: EvalResult
    code_hash: str | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)
