"""Live progress of a batch, one bar per stage, fed by the runner's events."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, ProgressColumn, \
    TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from .records import EvalResult, Verdict

class RateColumn(ProgressColumn):
    """Items finished per minute at this stage."""

    def render(self, task) -> Text:
        return Text(f"{task.speed * 60:.1f}/min" if task.speed else "-/min")


class QueuedColumn(ProgressColumn):
    """Items entered into this stage and not finished yet."""

    def render(self, task) -> Text:
        return Text(f"{int((task.total or 0) - task.completed)} queued")


STAGES = (("model", "model calls"), ("build", "builds"), ("eval", "evaluations"), ("attempt", "attempts stored"))


class Progress:
    def __init__(self, console: Console):
        self.bars = RichProgress(TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(),
                                 QueuedColumn(), TextColumn("{task.fields[note]}"), RateColumn(),
                                 TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=console, transient=False, disable=not console.is_terminal)
        self.ids = {key: self.bars.add_task(label, total=0, note="") for key, label in STAGES}
        self.failed = {key: 0 for key, _ in STAGES}
        self.unfit: set[str] = set()

    def __enter__(self) -> "Progress":
        self.bars.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bars.__exit__(*exc)

    def _grow(self, key: str) -> None:
        task = self.bars.tasks[self.ids[key]]
        self.bars.update(self.ids[key], total=(task.total or 0) + 1)

    def _done(self, key: str, failed: bool = False) -> None:
        self.failed[key] += failed
        note = f"[red]{self.failed[key]} failed[/]" if self.failed[key] else ""
        self.bars.update(self.ids[key], advance=1, note=note)

    def event(self, stage: str, slot: Any, info: Any) -> None:
        grows = {"planned": "attempt", "calling": "model", "building": "build", "evaluating": "eval"}
        if stage in grows:
            self._grow(grows[stage])
        elif stage == "completed":
            self._done("model", failed=bool(info.error))
        elif stage == "built":
            self._done("build", failed=not info.ok)
        elif stage == "evaluated":
            self._done("eval", failed=info.verdict is not Verdict.correct)
        elif stage == "unfit" and info not in self.unfit:  # once per reason, not once per attempt
            self.unfit.add(info)
            self.bars.console.print(Text(f"device not fit to time: {info}; timings are not trusted until it "
                                         f"recovers, and a resume re-times these attempts", style="yellow"))
        elif stage == "lane":  # a lane taken out of service (pipeline.lanes)
            self.bars.console.print(Text(info, style="yellow"))
        elif stage == "stored":
            result: EvalResult = info
            self._done("attempt", failed=result.verdict is not Verdict.correct)
            if self.bars.disable:  # no terminal (CI, a pipe): one plain line per attempt instead
                step = (f" / gen {slot.generation}" if getattr(slot, "generation", 0) else "") + (
                    f" / turn {slot.turn + 1}" if getattr(slot, "turn", 0) else "")
                print(f"{slot.task.name} / {slot.model.name} / sample {slot.sample}{step}: {result.verdict.value}"
                      + (f" ({result.error[:120]})" if result.error else ""), flush=True)
