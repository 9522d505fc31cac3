"""Search over the judge's verdicts: a refining conversation per slot, or an evolving archive per task.

    work = search.work(runner, runner.slots)   # coroutines: one per conversation (refine) or task (evolve)

refine: the first prompt is the template's; after each attempt its verdict, rendered by the
feedback template (pipeline.generate.feedback), becomes the next user turn, until `max_turns` or the target.
evolve: generation 0 asks `population` children from the plain prompt; each later child's prompt
shows one to three parents from the task's archive (its correct, trusted, timed kernels), and a
child that fails gets `fix_turns` refine turns. Every turn is an attempt judged by the same
evaluator and stored with its turn, generation, parents and the exact messages sent.

A failed model call is not a turn: it is stored (a model_error attempt, no feedback, so the run
reports it) and its conversation stops there; an evolution stops after that generation, whose
archive the next one needs. A resume with --retry-errors, or a plain resume where the failure was
transient (pipeline.generate.llm.transient), cuts the conversation at the failed turn and asks it
again: the new verdict replaces the failed turn's row (the failed call stays in completions).

Resume: a conversation is rebuilt from its stored turns (their completions and the feedback stored
with them), so the messages of the next turn are the ones sent before a kill, and the model call is
answered from the completions cache; a stored turn is never judged again. Parents are chosen by a
seed made from the task, generation and child, over an archive that earlier generations fixed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import Config, Target
from ..generate import extract, feedback, llm
from ..records import Verdict, summary_fields
from ..store.store import Store

from .events import Event, Planned
from .work import Answer, Judged, Slot

class Driver(Protocol):
    """What a search needs of the batch that drives it (pipeline.run.batch.Runner is one): its config,
    store and run, and one step each to ask, judge and store a turn."""

    cfg: Config
    store: Store
    run_id: str
    retry_errors: bool
    """Whether stored failed model calls are asked again (else only transient ones are)."""
    on_event: Callable[[Event], None]

    def first_prompt(self, slot: Slot, text: str | None = None) -> tuple[str, list[dict[str, str]]]: ...

    async def generate(self, slot: Slot, prompt_id: str, messages: list[dict[str, str]]) -> Answer | None: ...

    async def judge(self, slot: Slot, answer: Answer) -> Judged: ...

    def store_attempt(self, slot: Slot, answer: Answer, judged: Judged, parents: list[str] | None = None,
                      feedback: str | None = None) -> str: ...


# What an earlier answer keeps in the conversation when only its summary line stays. The answer
# itself is its ModelNew code block (the prose around it helps nobody in a later turn), capped so
# that one runaway answer cannot fill the context.
ANSWER_CAP = 24_000
TOP_FOR_VARIETY = 8  # evolve: parents beyond the fastest are drawn from this many of the fastest


@dataclass(frozen=True)
class Exchange:
    """One finished turn as later turns see it."""

    answer: str
    """The assistant message: the answer's code block (or its capped text if none was found)."""
    feedback: str
    """The user message that judged it."""
    summary: str
    """One line for when the exchange is too old to be kept whole."""


def answer_text(text: str | None) -> str:
    found = extract.extract(text or "")
    if found.code:
        return f"```python\n{found.code.strip()}\n```"
    return (text or "(an empty answer)")[:ANSWER_CAP]


def turn_summary(turn: int, row: dict[str, Any]) -> str:
    line = f"turn {turn + 1}: {row['verdict']}"
    if row.get("speedup_eager"):
        line += f", {row['speedup_eager']:.3g}x eager"
    elif row.get("error"):
        line += f" ({str(row['error'])[:160]})"
    return line


def messages_for(first: list[dict[str, str]], exchanges: list[Exchange], keep: int) -> list[dict[str, str]]:
    """The conversation sent for the next turn: the first prompt, one summary line per exchange
    older than the last `keep` (their code is superseded and their verdicts are in the line), then
    the last `keep` exchanges whole (the code to improve, and what the judge said of it)."""
    old, recent = exchanges[:-keep] if len(exchanges) > keep else [], exchanges[-keep:]
    messages = [dict(m) for m in first]
    if old:
        messages[0]["content"] += ("\n\nEarlier answers in this conversation (no longer shown):\n"
                                   + "\n".join(f"- {e.summary}" for e in old))
    for e in recent:
        messages += [{"role": "assistant", "content": e.answer}, {"role": "user", "content": e.feedback}]
    return messages


def reached(target: Target, row: dict[str, Any]) -> bool:
    """True when a correct, trusted attempt timed on a fit device meets every figure the target
    gives (a target that gives none is never reached: the search runs all its turns)."""
    wanted = {k: v for k, v in target.model_dump().items() if v is not None}
    if not wanted or row.get("verdict") != Verdict.correct.value or row.get("trusted") == 0 or row.get("device_unfit"):
        return False
    return all(row.get(k) is not None and row[k] >= v for k, v in wanted.items())


async def converse(runner: Driver, slot: Slot, prompt_id: str, first: list[dict[str, str]], max_turns: int,
                   done: Callable[[dict[str, Any]], bool], parents: list[str] | None = None) -> bool:
    """One conversation: turns from where the store left it until `done` says so or turns run out.
    False when it stopped at a failed model call (stored, or one a resume leaves as it is)."""
    cfg = runner.cfg.search
    prompts_dir = runner.cfg.path(runner.cfg.prompts_dir)
    stored = runner.store.slot_history(runner.run_id, slot.task.name, slot.model.name, slot.template, slot.sample,
                                       slot.backend, slot.generation)
    exchanges: list[Exchange] = []
    previous: str | None = None
    for row in stored[:max_turns]:
        if row["verdict"] == Verdict.model_error.value:
            # Asked again from here (each new verdict replaces the stored row of its turn), or the
            # turn the conversation stays stopped at.
            if runner.retry_errors or llm.transient(row["error"]):
                break
            return False
        if done(row) or row["feedback"] is None:
            return True
        exchanges.append(Exchange(answer_text(row["completion_text"]), row["feedback"], turn_summary(row["turn"], row)))
        previous = row["id"]
    for turn in range(len(exchanges), max_turns):
        now = dataclasses.replace(slot, turn=turn)
        runner.on_event(Planned(now))
        answer = await runner.generate(now, prompt_id, messages_for(first, exchanges, cfg.keep_turns))
        if answer is None:
            return True  # the budget is spent: a later run with a larger one resumes here
        judged = await runner.judge(now, answer)
        lineage = ([previous] if previous else []) + ((parents or []) if turn == 0 else [])
        if judged.result.verdict is Verdict.model_error:  # no answer to judge or to tell the model about
            runner.store_attempt(now, answer, judged, parents=lineage)
            return False
        text = feedback.render(cfg.feedback_template, prompts_dir, judged.result, judged.diagnostics,
                               turn=turn, max_turns=max_turns)
        row = summary_fields(judged.result)  # the figures a stored row has, for `done` and the summary line
        previous = runner.store_attempt(now, answer, judged, parents=lineage, feedback=text)
        if done(row):
            return True
        exchanges.append(Exchange(answer_text(answer.completion.text), text, turn_summary(turn, row)))
    return True


async def refine(runner: Driver, slot: Slot) -> None:
    prompt_id, first = runner.first_prompt(slot)
    target = runner.cfg.search.target
    await converse(runner, slot, prompt_id, first, runner.cfg.search.max_turns, lambda row: reached(target, row))


def choose_parents(archive: list[dict[str, Any]], k: int, rng: random.Random) -> list[dict[str, Any]]:
    """The fastest kernel, then up to k-1 others drawn at random from the next fastest: speed, and
    variety (a child of the single best only ever polishes one idea)."""
    if not archive:
        return []
    rest = archive[1:TOP_FOR_VARIETY]
    return [archive[0]] + rng.sample(rest, min(k - 1, len(rest)))


async def evolve(runner: Driver, base: Slot) -> None:
    """Generations of children for one task (and model, template, backend)."""
    cfg, store = runner.cfg.search, runner.store
    prompts_dir = runner.cfg.path(runner.cfg.prompts_dir)
    fixed = lambda row: row.get("verdict") == Verdict.correct.value or reached(cfg.target, row)  # noqa: E731
    for g in range(cfg.generations):
        archive = store.archive(runner.run_id, base.task.name, base.model.name, base.template, base.backend, g)
        if any(reached(cfg.target, row) for row in archive):
            return
        children = []
        for i in range(cfg.population):
            child = dataclasses.replace(base, sample=i, generation=g)
            parents = choose_parents(archive, cfg.parents, random.Random(f"{base.task.name}:{g}:{i}")) if g else []
            if parents:
                views = [feedback.parent_view(p, extract.extract(p["completion_text"] or "").code or "") for p in parents]
                text = feedback.render_evolve(cfg.evolve_template, prompts_dir, base.task.name, base.task.source,
                                              base.backend, g, views, runner.cfg.evaluation.grad,
                                              runner.cfg.evaluation.dtype, base.task.level)
                prompt_id, first = runner.first_prompt(child, text)
            else:  # generation 0, or nothing verified yet: the plain prompt
                prompt_id, first = runner.first_prompt(child)
            children.append(converse(runner, child, prompt_id, first, 1 + cfg.fix_turns, fixed,
                                     [p["id"] for p in parents]))
        if not all(await asyncio.gather(*children)):
            return  # a child's model call failed: the next generation waits for its archive (a resume)


def work(runner: Driver, slots: list[Slot]) -> list[Coroutine[Any, Any, None]]:
    """The work of a search run: a conversation per slot (refine), or one evolution per task, model,
    template and backend (evolve: `samples` gives way to the population)."""
    if runner.cfg.search.strategy == "refine":
        return [refine(runner, s) for s in slots]
    bases: dict[tuple, Slot] = {}
    for s in slots:
        bases.setdefault((s.task.name, s.model.name, s.template, s.backend), s)
    return [evolve(runner, s) for s in bases.values()]
