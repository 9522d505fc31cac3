"""Progress of a batch, fed by the runner's events: live bars in a terminal, plain lines in a pipe.

    with Progress(console) as progress:
        Runner(cfg, store, on_event=progress.event).run()

Both say first what the run is (new or resumed, how many attempts, what is already stored) and
roughly how long its builds take. In a terminal, one bar per stage whose total is what is really
queued, the attempts stored before a resume included (a resumed run never shows 0/0). Piped (CI,
a log file), one line per event that matters (an answer came, a build ended, a verdict, an attempt
stored) and, every `interval` seconds, one line of counts per stage, so a log never goes quiet
while builds run. Names and errors came from a config, a model or a compiler: plain.visible.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, ProgressColumn, \
    TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from ..build.headers import PREPARING, READY
from ..records import EvalResult, Verdict
from ..run.events import (Answered, Built, Building, Cached, Evaluated, Evaluating, Event, Failed, LaneNotice,
                          OverBudget, Planned, Prepared, Released, RunStart, Stored, Unfit)
from .plain import visible
from .tables import short_error

# What a first build costs, told to a user who waits on one (docs/decisions/builds-and-headers.md). Triton
# compiles in the child.
BUILD_COST = {
    "cpu": "a C++ extension (g++ through load_inline) takes about 30-90 s to build on 2 cores, and the "
           "first build in a new venv also precompiles torch's headers (1-3 minutes on 2 cores, longer on a "
           "loaded box)",
    "cuda": "a CUDA extension (nvcc through load_inline) takes about 20-100 s to build",
}


STAGES = (("model", "model answers"), ("build", "builds"), ("eval", "evaluations"), ("attempt", "attempts stored"))


class RateColumn(ProgressColumn):
    """Items finished per minute at this stage."""

    def render(self, task) -> Text:
        return Text(f"{task.speed * 60:.1f}/min" if task.speed else "-/min")


class Progress:
    def __init__(self, console: Console, interval: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.console = console
        self.live = console.is_terminal
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self.bars = RichProgress(TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[note]}"), RateColumn(), TimeElapsedColumn(),
                                 TimeRemainingColumn(), console=console, transient=False, disable=not self.live)
        self.ids = {key: self.bars.add_task(label, total=0, note="") for key, label in STAGES}
        self.total = {key: 0 for key, _ in STAGES}
        self.done = {key: 0 for key, _ in STAGES}
        self.failed = {key: 0 for key, _ in STAGES}
        self.before = 0  # attempts stored before this process started (a resume)
        self.cached = 0  # answers taken from the completion cache
        self.unfit: set[str] = set()
        self.preparing = False  # the fast-build headers are being made: builds wait (pipeline.build.headers)
        self.lock = threading.RLock()  # events come from the runner's loop, lane notices from threads
        self.stop = threading.Event()
        self.ticker: threading.Thread | None = None
        self.closed = False  # stdout's pipe lost its reader

    def __enter__(self) -> "Progress":
        self.started = self.clock()
        self.bars.__enter__()
        if not self.live and self.interval > 0:
            self.ticker = threading.Thread(target=self._tick, name="kgen-progress", daemon=True)
            self.ticker.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: object) -> None:
        """The last line: `done`, or `interrupted` where Ctrl-C or SIGTERM ended the run. A stdout whose
        reader is gone (`kgen run | tee log` and Ctrl-C) never replaces the exception that ends the run."""
        self.stop.set()
        if self.ticker:
            self.ticker.join()
        try:
            self.bars.__exit__(kind, value, tb)
        except OSError:
            pass
        if not self.live:
            interrupted = kind is not None and issubclass(kind, KeyboardInterrupt)
            self._line("interrupted" if interrupted else "done", self.summary())

    def _tick(self) -> None:
        while not self.stop.wait(self.interval):
            self._line("progress", self.summary())

    def summary(self) -> str:
        """One line of counts per stage."""
        with self.lock:
            parts = []
            for key, label in STAGES:
                part = f"{label} {self.done[key]}/{self.total[key]}"
                extra = [f"{self.failed[key]} failed"] if self.failed[key] else []
                if key == "model" and self.cached:
                    extra.append(f"{self.cached} from the cache")
                if key == "attempt" and self.before:
                    extra.append(f"{self.before} from before")
                if key == "build" and self.preparing:
                    extra.append(PREPARING)
                parts.append(part + (f" ({', '.join(extra)})" if extra else ""))
            return "; ".join(parts)

    def _line(self, what: str, text: str) -> None:
        """One plain line (piped output), prefixed with the seconds since the run began; none once the
        pipe's reader is gone (the run goes on, and stores what it does)."""
        with self.lock:
            if self.closed:
                return
            try:
                print(f"{self.clock() - self.started:6.0f}s  {what:<9} {visible(text)}", flush=True)
            except BrokenPipeError:
                self.closed = True

    def _say(self, text: str, style: str = "") -> None:
        """A line that matters in both modes (the plan, a device taken out of service)."""
        if self.live:
            self.bars.console.print(Text(visible(text), style=style))
        else:
            self._line("note", text)

    def _count(self, key: str, grow: int = 0, done: int = 0, failed: bool = False) -> None:
        with self.lock:
            self.total[key] += grow
            self.done[key] += done
            self.failed[key] += bool(done and failed)
            note = f"{self.failed[key]} failed" if self.failed[key] else ""
            if key == "attempt" and self.before:
                note = ", ".join(filter(None, [f"{self.before} from before", note]))
            if key == "model" and self.cached:
                note = ", ".join(filter(None, [f"{self.cached} from the cache", note]))
            if key == "build" and self.preparing:
                note = ", ".join(filter(None, [PREPARING, note]))
            self.bars.update(self.ids[key], total=self.total[key], completed=self.done[key],
                             note=Text(note, style="red" if self.failed[key] else ""))

    def event(self, event: Event) -> None:
        slot = getattr(event, "slot", None)
        if isinstance(event, RunStart):
            self._started(event)
        elif isinstance(event, Planned):  # an attempt to make: it needs an answer, then is stored
            self._count("model", grow=1)
            self._count("attempt", grow=1)
        elif isinstance(event, Cached):
            with self.lock:
                self.cached += 1
            self._count("model", done=1)
        elif isinstance(event, Answered):
            info = event.completion
            self._count("model", done=1, failed=bool(info.error))
            self._event("answered", slot, f"model call failed: {short_error(info.error)}" if info.error else
                        f"answer in {info.seconds:.1f} s, {info.usage.completion_tokens} tokens")
        elif isinstance(event, OverBudget):
            self._count("model", done=1)
            self._count("attempt", grow=-1)  # not stored: a run with a larger budget picks it up
            self._event("skipped", slot, "not asked: the budget is spent")
        elif isinstance(event, Building):
            self._count("build", grow=1)
        elif isinstance(event, Built):
            info = event.result
            self._count("build", done=1, failed=not info.ok)
            from ..build.build import NOTHING_TO_BUILD, failure_line

            if not info.ok:
                line = (f"build {'timed out' if info.timed_out else 'failed'} after {info.seconds:.0f} s: "
                        f"{short_error(failure_line(info))}")
            elif info.log == NOTHING_TO_BUILD:
                line = "nothing to build (no C++ extension)"
            else:
                line = f"kept from an earlier build ({info.seconds:.0f} s then)" if info.cached else f"built in {info.seconds:.0f} s"
            self._event("built", slot, line)
        elif isinstance(event, Evaluating):
            self._count("eval", grow=1)
        elif isinstance(event, Evaluated):
            self._count("eval", done=1, failed=event.result.verdict is not Verdict.correct)
            self._event("judged", slot, _verdict(event.result))
        elif isinstance(event, Failed):  # an attempt that raised: not stored, the run fails at its end
            self._count("eval", done=1, failed=True)
            self._event("error", slot, f"{type(event.error).__name__}: {short_error(str(event.error))}")
        elif isinstance(event, Stored):
            self._count("attempt", done=1, failed=event.result.verdict is not Verdict.correct)
            self._event("stored", slot, event.result.verdict.value)
        elif isinstance(event, Unfit) and event.reason not in self.unfit:  # once per reason, not per attempt
            self.unfit.add(event.reason)
            self._say(f"device not fit to time: {event.reason}; timings are not trusted until it recovers, and a "
                      "resume re-times these attempts", style="yellow")
        elif isinstance(event, Prepared) and not self.live:  # a task's reference process: seconds per stage
            spent = ", ".join(f"{k} {v:.1f} s" for k, v in event.phases.items())
            self._line("reference", f"{slot.task.name}: {spent}")
        elif isinstance(event, Released) and not self.live:  # its attempts are over: its memory goes back
            self._line("reference", f"{event.task}: closed, the task's attempts are over")
        elif isinstance(event, LaneNotice):  # a lane taken out of service, or the fast-build headers
            if event.line.startswith((PREPARING, READY)):
                with self.lock:
                    self.preparing = event.line.startswith(PREPARING)
                self._count("build")  # the build bar's note says it (or no longer does)
            self._say(event.line, style="" if event.line.startswith((PREPARING, READY)) else "yellow")

    def _event(self, what: str, slot: Any, text: str) -> None:
        if self.live:
            return  # the bars show it
        step = (f" / gen {slot.generation}" if getattr(slot, "generation", 0) else "") + (
            f" / turn {slot.turn + 1}" if getattr(slot, "turn", 0) else "")
        self._line(what, f"{slot.task.name} / {slot.model.name} / sample {slot.sample}{step}: {text}")

    def _started(self, start: RunStart) -> None:
        with self.lock:
            self.before = start.stored
            self._count("attempt", grow=start.stored, done=start.stored)
        plan = f"{_n(start.tasks, 'task')} x {_n(start.models, 'model')} x {_n(start.samples, 'sample')} on {start.backend}"
        if start.strategy != "single":
            plan += f", {start.strategy} search (later turns are added as they come)"
        if start.resumed:
            self._say(f"resuming run {start.run_id}: {plan}; {start.stored} attempts stored before, "
                      f"{start.todo} slots to do")
        else:
            self._say(f"run {start.run_id}: {plan}; {start.todo} slots to do")
        cost = BUILD_COST.get(start.backend)
        if cost and start.todo:
            at_once = f", {start.build_workers} at a time" if start.build_workers else ""
            self._say(f"each answer's code is built before it is judged{at_once}: {cost}; builds/ keeps "
                      "them, so a resumed or repeated run reuses them")
        if not self.live and start.todo:
            self._say(f"one line per answer, build, verdict and stored attempt; counts every {self.interval:.0f} s")


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _verdict(result: EvalResult) -> str:
    """"correct, 12.8x eager, ..."; for a correct result stored without a figure or kept out of
    `best`, why: "correct, not timed (unfit: ...)", "correct, 3x eager, not verified (untrusted: ...)"."""
    from ..leaderboard import not_verified_reason, result_fields

    text = result.verdict.value
    why = not_verified_reason(result_fields(result))
    if result.device_unfit and result.verdict is Verdict.correct:  # no figure at all (EvalResult.time_ms)
        flags = f" (flags: {', '.join(f.value for f in result.flags)})" if result.flags else ""
        return f"{text}, not timed (unfit: {result.device_unfit}){flags}"
    if result.speedup_eager is not None:
        text += f", {result.speedup_eager:.3g}x eager"
    if result.speedup_compile is not None:
        text += f", {result.speedup_compile:.3g}x torch.compile"
    if result.flags:
        text += f" (flags: {', '.join(f.value for f in result.flags)})"
    elif why:
        text += f", not verified ({why})"
    if result.error:
        text += f": {short_error(result.error, 160)}"
    return text
