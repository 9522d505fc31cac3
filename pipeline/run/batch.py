"""A batch from plan to summary: prompt, model, extract, build, evaluate, store, as overlapping stages.

    run_id = asyncio.run(Runner(cfg, store).run())

A run is a deterministic plan (task x model x template x sample). Its key is a hash of what it
plans, so running the same config again resumes that run and does only the slots not yet stored.
Model calls run concurrently (a limit per endpoint), builds on a CPU pool, evaluations one at a time
per device, so a device never waits on a compiler while work is ready. Only this process writes
the database.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Callable

from .. import backends, sandbox
from ..build import build as build_stage
from ..child import sizes, tasks
from ..config import Config, ModelConfig
from ..generate import diagnostics, extract, feedback, llm, prompts
from ..generate.llm import ChatRequest, Provider, make_provider
from ..judge.bench import TaskBench, baseline_key
from ..records import BuildResult, EvalResult, Provenance, Verdict
from ..store.store import Store
from .events import (Answered, Asking, Built, Building, Cached, Evaluated, Evaluating, Event, Failed, LaneNotice,
                     OverBudget, Planned, Prepared, Released, RunStart, Stored, Unfit)
from .executor import Executor, make_executor
from .work import Answer, Judged, Slot

MEMORY_WAIT_S = 2.0  # between a reference's tries for memory that other tasks' references give back
AHEAD_BENCHES = 8  # task references a GPU lane may have open when one more would start beside its build


def resolve_backend(requested: str, order: list[str] | tuple[str, ...] = ("cuda", "cpu")) -> tuple[str, bool]:
    """(backend, gpu_present): `requested`, or for auto the first of `order` this machine runs."""
    return backends.resolve(requested, order), backends.gpu_present()


def plan_slots(cfg: Config, backend: str) -> list[Slot]:
    from .kernelbench import select_tasks

    task_files = select_tasks(cfg)
    return [Slot(t, m, cfg.prompt_template, s, backend)
            for t in task_files for m in cfg.models for s in range(cfg.samples)]


def plan_key(cfg: Config, backend: str, slots: list[Slot]) -> str:
    planned = {"slots": [list(s.key) + [s.task.sha] for s in slots], "size": cfg.tasks.size,
               "evaluation": cfg.evaluation.model_dump(), "backend": backend}
    if cfg.search.strategy != "single":  # a single run's key stays what it was before search existed
        planned["search"] = cfg.search.model_dump()
    return hashlib.sha256(json.dumps(planned, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_key(model: ModelConfig, messages: list[dict[str, str]], sample: int, backend: str, task: str,
              turn: int = 0) -> str:
    """Everything that changes a completion, nothing that only changes transport (retries, timeouts)."""
    parts = {"provider": model.provider, "base_url": model.base_url, "model": model.model,
             "replay_file": model.replay_file, "sampling": model.sampling.model_dump(), "messages": messages,
             "sample": sample, "backend": backend if model.provider == "replay" else None,
             "task": task if model.provider == "replay" else None}
    if turn and model.provider == "replay":  # a replay file answers by turn too
        parts["turn"] = turn
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class RunFailed(RuntimeError):
    """Attempts of a run that could not be judged (a reference process that failed, say): the rest
    are stored, the run is marked failed, and the same command judges what is left."""

    def __init__(self, run_id: str, count: int, first: Exception):
        self.run_id, self.count, self.first = run_id, count, first
        super().__init__(f"{count} attempt{'s' if count != 1 else ''} could not be judged "
                         f"(first: {type(first).__name__}: {str(first).splitlines()[0] if str(first) else ''})")


class Runner:
    def __init__(self, cfg: Config, store: Store, backend: str | None = None,
                 on_event: Callable[[Event], None] | None = None):
        self.cfg = cfg
        self.store = store
        self.backend, self.gpu = resolve_backend(backend or cfg.backend, cfg.auto_backends)
        if not backends.on_gpu(self.backend):  # a KGEN_CPU_CORES naming no usable core: now, not after every build
            try:
                sandbox.cpu_cores(1)
            except ValueError as exc:
                raise backends.BackendError(str(exc)) from None
        self.on_event = on_event or (lambda event: None)
        self.providers: dict[str, Provider] = {m.name: make_provider(m, cfg.base_dir) for m in cfg.models}
        self.slots = plan_slots(cfg, self.backend)
        self.key = plan_key(cfg, self.backend, self.slots)
        self.generated = cfg.path(cfg.generated_dir)
        self.builds_root = cfg.path(cfg.build_dir)
        self.executor: Executor = make_executor(cfg, self.backend, lambda line: self.on_event(LaneNotice(line)))
        self.build_locks: dict[str, asyncio.Lock] = {}
        self.benches: dict[str, asyncio.Task] = {}
        # Attempts still to judge per task, in a single-shot run (None in a search, which plans turns
        # as it goes): a task's reference process is closed at 0, so its GPU memory goes back.
        self.left: Counter[str] | None = None
        self.size_names: dict[str, str] = {}
        self.task_ids: dict[str, str] = {}
        self.spent_tokens = 0
        self.spent_usd = 0.0
        self.over_budget = 0
        self.retry_errors = False
        self.failed_calls: list[str] = []  # the errors of this run's stored failed model calls, at its end
        self.model_slots = {m.name: asyncio.Semaphore(m.max_concurrency) for m in cfg.models}

    async def run(self, fresh: bool = False, retry_errors: bool = False) -> str:
        import torch

        run_id = None if fresh else self.store.find_run(self.key)
        resumed = run_id is not None
        if run_id is None:
            config_json = self.cfg.model_dump_json(exclude={"base_dir"})
            plan_json = json.dumps([list(s.key) for s in self.slots])
            device = torch.cuda.get_device_name() if backends.on_gpu(self.backend) else self.backend
            run_id = self.store.start_run(config_json, plan_json, self.backend, device, torch.__version__,
                                          torch.version.cuda, key=self.key)
        else:
            self.store.resume_run(run_id)
        self.run_id = run_id
        self.retry_errors = retry_errors
        done = self.store.attempt_slots(run_id)
        redo = self._redo(run_id, retry_errors)
        todo = [s for s in self.slots if s.key not in done or s.key in redo]
        single = self.cfg.search.strategy == "single"
        # A search stores several attempts per slot and plans each turn as it comes (pipeline.run.search).
        stored = len(self.slots) - len(todo) if single else len(self.store.attempts(run=run_id))
        self.on_event(RunStart(
            run_id=run_id, resumed=resumed, tasks=len({s.task.name for s in self.slots}),
            models=len(self.cfg.models), samples=self.cfg.samples, backend=self.backend,
            strategy=self.cfg.search.strategy, stored=stored, todo=len(todo),
            build_workers=getattr(self.executor, "workers", None)))
        if single:
            self.left = Counter(slot.task.name for slot in todo)
            for slot in todo:
                self.on_event(Planned(slot))
        for t in {s.task.name: s.task for s in self.slots}.values():
            self.task_ids[t.name] = self.store.upsert_task(t.name, str(t.path), t.source)
        self.spent_tokens, self.spent_usd = self.store.run_spending(run_id)
        try:
            if self.cfg.search.strategy == "single":
                work = [self._attempt(s) for s in todo]
            else:  # a search resumes inside each conversation: every slot goes in (pipeline.run.search)
                from . import search
                work = search.work(self, self.slots)
            results = await asyncio.gather(*work, return_exceptions=True)
        finally:
            self.executor.close()
            for pending in self.benches.values():
                _close_bench(pending)
        failures = [r for r in results if isinstance(r, BaseException)]
        self.failed_calls = [a["error"] or "" for a in self.store.attempts(run=run_id, verdict=Verdict.model_error)]
        status = ("failed" if failures else "budget_reached" if self.over_budget
                  else "model_errors" if self.failed_calls else "done")
        self.store.finish_run(run_id, status)
        if failures:
            first = failures[0]
            if isinstance(first, tasks.TaskError) or not isinstance(first, Exception):
                raise first
            raise RunFailed(run_id, len(failures), first) from first
        return run_id

    def _budget_left(self) -> bool:
        b = self.cfg.budget
        return not ((b.max_tokens is not None and self.spent_tokens >= b.max_tokens)
                    or (b.max_usd is not None and self.spent_usd >= b.max_usd))

    def _redo(self, run_id: str, retry_errors: bool) -> set[tuple]:
        """Stored slots to do again: failed model calls (all when asked, else those a transient failure
        stopped: a server down or hung), slots that waited for a GPU we now have, and correct ones
        whose device was not fit to time them (re-timed; still unfit, still marked)."""
        again = {Verdict.waiting_gpu.value} if self.gpu and self.backend == "cuda" else set()
        if retry_errors:
            again.add(Verdict.model_error.value)
        return {(a["task"], a["model"], a["template"], a["sample"], a["backend"])
                for a in self.store.attempts(run=run_id)
                if a["verdict"] in again or (a["verdict"] == Verdict.correct.value and a.get("device_unfit"))
                or (a["verdict"] == Verdict.model_error.value and llm.transient(a["error"]))}

    async def _attempt(self, slot: Slot) -> None:
        """A single-shot slot: the plain prompt, one answer, one verdict."""
        try:
            prompt_id, messages = self.first_prompt(slot)
            answer = await self.generate(slot, prompt_id, messages)
            if answer is not None:
                try:
                    verdict = await self.judge(slot, answer)
                except Exception as exc:
                    self.on_event(Failed(slot, exc))  # not stored: a resume does it again (its reason is: judge)
                    raise
                self.store_attempt(slot, answer, verdict)
        finally:
            self._one_done(slot.task.name)

    def _one_done(self, name: str) -> None:
        """One of a task's attempts is over: after its last, the task's reference process is closed.
        Each holds its inputs on the GPU: kept open to the batch's end, they leave a later task's
        reference too little memory and the task is lost (docs/decisions/memory-and-outputs.md)."""
        if self.left is None:
            return
        self.left[name] -= 1
        pending = self.benches.get(name)
        if self.left[name] <= 0 and pending is not None and pending.done():
            del self.benches[name]
            if _close_bench(pending):
                self.on_event(Released(name))

    def _others_open(self, name: str) -> bool:
        """Whether another task's reference is open or starting and will be closed when its attempts
        are over (a single-shot run): memory it holds comes back, so a reference that did not fit may
        wait for it."""
        return self.left is not None and any(other != name and self.left[other] > 0 for other in self.benches)

    def first_prompt(self, slot: Slot, text: str | None = None) -> tuple[str, list[dict[str, str]]]:
        """The prompt a conversation starts from (the template's, or `text`), stored; its messages."""
        if text is None:
            text = prompts.render(slot.template, slot.task, slot.backend, self.cfg.path(self.cfg.prompts_dir),
                                  self.cfg.evaluation.grad, self.cfg.evaluation.dtype)
        prompt_id = self.store.save_prompt(self.task_ids[slot.task.name], slot.template, slot.backend, text)
        return prompt_id, prompts.messages(text)

    async def generate(self, slot: Slot, prompt_id: str, messages: list[dict[str, str]]) -> Answer | None:
        """The model's answer to `messages`, from the cache when these exact messages were answered
        before in this run (a resumed run repeats no call; a new one, --new, asks afresh); None when
        the budget is spent."""
        key = cache_key(slot.model, messages, slot.sample, slot.backend, slot.task.name, slot.turn)
        cached = self.store.cached_completion(key, self.run_id)
        if cached:
            self.on_event(Cached(slot, cached[1]))
            return Answer(cached[0], cached[1], messages)
        # The budget is checked once a call slot is ours, so calls queued behind it see its cost.
        async with self.model_slots[slot.model.name]:
            if not self._budget_left():
                self.over_budget += 1  # not stored: a later run with a larger budget picks it up
                self.on_event(OverBudget(slot))
                return None
            self.on_event(Asking(slot))
            completion = await self.providers[slot.model.name].complete(
                ChatRequest(task=slot.task.name, backend=slot.backend, messages=messages, sample=slot.sample,
                            turn=slot.turn))
        cost = (completion.usage.prompt_tokens * slot.model.price.input_per_mtok
                + completion.usage.completion_tokens * slot.model.price.output_per_mtok) / 1e6
        self.spent_tokens += completion.usage.prompt_tokens + completion.usage.completion_tokens
        self.spent_usd += cost
        completion_id = self.store.save_completion(
            self.run_id, self.task_ids[slot.task.name], prompt_id, slot.model.name, slot.model.provider,
            slot.model.base_url, slot.sample, key, completion, cost)
        self.on_event(Answered(slot, completion))
        return Answer(completion_id, completion, messages)

    async def judge(self, slot: Slot, answer: Answer) -> Judged:
        """Extract, build and evaluate one answer (nothing stored yet). One that cannot be judged raises,
        its reason kept at once (Store.note_unjudged): a run cut short never reaches the end that names it."""
        try:
            return await self._judge(slot, answer)
        except Exception as exc:
            self.store.note_unjudged(self.run_id, slot.task.name, slot.model.name, slot.sample, slot.backend,
                                     f"{type(exc).__name__}: {exc}", slot.turn, slot.generation)
            raise

    async def _judge(self, slot: Slot, answer: Answer) -> Judged:
        completion = answer.completion
        if completion.error:
            return Judged(EvalResult(verdict=Verdict.model_error, error=completion.error))
        extraction = extract.extract(completion.text)
        if extraction.error:
            return Judged(EvalResult(verdict=Verdict.extract_failed, error=extraction.error))
        code_path = extract.save(extraction, self.generated)
        code_hash = extraction.code_hash
        if slot.backend == "cuda" and not self.gpu:
            return Judged(EvalResult(verdict=Verdict.waiting_gpu, error="no CUDA device here: evaluated when a "
                                     "GPU run resumes this run"), code_hash)
        self._prepare_ahead(slot)
        built = await self._build(code_path, code_hash, slot)
        if not built.ok:
            verdict = Verdict.build_timeout if built.timed_out else Verdict.build_failed
            return Judged(EvalResult(verdict=verdict, error=build_stage.failure_line(built)), code_hash,
                          diagnostics.compiler_errors(built.log, extraction.code or "", candidate_name=code_path.name))
        bench = await self._bench(slot)
        self.on_event(Evaluating(slot))
        # Siblings (one task's attempts at one turn and generation, written before any was judged)
        # share their secrets (pipeline.judge.bench.Draws).
        result = await self.executor.evaluate(bench, code_path, Path(built.build_dir), self.cfg.evaluation,
                                              draw=f"turn {slot.turn}, generation {slot.generation}")
        result = feedback.explained(result)  # the lines that say why, for the model and the error column
        self.on_event(Evaluated(slot, result))
        if result.device_unfit:
            self.on_event(Unfit(slot, result.device_unfit))
        return Judged(result, code_hash)

    def store_attempt(self, slot: Slot, answer: Answer, judged: Judged, parents: list[str] | None = None,
                      feedback: str | None = None) -> str:
        task = slot.task
        origin = Provenance(run_id=self.run_id, task_id=self.task_ids[task.name], task=task.name, model=slot.model.name,
                            sample=slot.sample, backend=slot.backend, template=slot.template, size=self._size_name(slot),
                            completion_id=answer.completion_id, code_hash=judged.code_hash, turn=slot.turn,
                            generation=slot.generation, parents=parents or [], messages=answer.messages,
                            feedback=feedback, level=task.level, problem=task.problem)
        attempt_id = self.store.save_attempt(origin, judged.result)
        self.on_event(Stored(slot, judged.result))
        return attempt_id

    def _size_name(self, slot: Slot) -> str:
        """The size that actually runs for this task (a derived `small` names the globals it set)."""
        if slot.task.name not in self.size_names:
            module = tasks.load_module(slot.task, self.cfg.tasks.size)
            self.size_names[slot.task.name] = sizes.effective_size(module, self.cfg.tasks.size)
        return self.size_names[slot.task.name]

    async def _build(self, code_path: Path, code_hash: str, slot: Slot) -> BuildResult:
        lock = self.build_locks.setdefault(code_hash, asyncio.Lock())
        async with lock:  # one build per hash: the second attempt with the same code reuses it
            import torch

            if (known := build_stage.reusable(self.store.get_build(code_hash, torch.__version__))):
                return known
            self.on_event(Building(slot))
            result = await self.executor.build(code_path, code_hash, self.builds_root,
                                               self.cfg.evaluation.build_timeout_s)
            self.store.save_build(result, slot.backend, torch.__version__)
            self.on_event(Built(slot, result))
            return result

    def _prepare_ahead(self, slot: Slot) -> None:
        """On GPU lanes, the task's reference and baselines started beside its first build, not after
        it: a lane waits idle for the batch's first builds (about a minute), and every baseline taken
        then is one less between two verdicts (seconds a task, docs/decisions/spares-and-startup.md). At most
        AHEAD_BENCHES a lane open at once (each a reference process with the GPU's context); past
        that a task's reference starts once its build is done, as without this."""
        if not (self.gpu and backends.on_gpu(slot.backend)) or slot.task.name in self.benches:
            return
        if len(self.benches) >= AHEAD_BENCHES * self.executor.lanes:
            return
        self._bench_future(slot).add_done_callback(_seen)

    async def _bench(self, slot: Slot) -> TaskBench:
        """The task's reference, computed once per run and task, the first time an attempt needs it."""
        return await self._bench_future(slot)

    def _bench_future(self, slot: Slot) -> asyncio.Future:
        name = slot.task.name
        if name not in self.benches:
            async def prepare() -> TaskBench:
                known = self.store.all_baselines()
                while True:
                    try:
                        bench = await self.executor.prepare(slot.task, self.cfg.tasks.size, slot.backend,
                                                            self.cfg.evaluation, known)
                        break
                    except sizes.SizeError:
                        # Other tasks' references hold memory they give back when their attempts
                        # are over; only with none left is the size itself too big for the device.
                        if not self._others_open(name):
                            raise
                        await asyncio.sleep(MEMORY_WAIT_S)
                remember_baselines(self.store, bench)
                self.on_event(Prepared(slot, dict(bench.phases)))
                if self.left is not None and self.left[name] <= 0:  # started ahead; every build failed meanwhile
                    self.benches.pop(name, None)
                    bench.close()
                    self.on_event(Released(name))
                return bench

            self.benches[name] = asyncio.ensure_future(prepare())
        return self.benches[name]


def _seen(pending: asyncio.Future) -> None:
    """A bench started ahead whose task's builds all failed is never awaited: its failure, if any,
    is taken here (asyncio would otherwise print it as never retrieved)."""
    if not pending.cancelled():
        pending.exception()


def _close_bench(pending: asyncio.Future) -> bool:
    """Close a task's reference process if its bench was made (not pending, cancelled or failed)."""
    if pending.done() and not pending.cancelled() and pending.exception() is None:
        pending.result().close()
        return True
    return False


def remember_baselines(store: Store, bench: TaskBench) -> None:
    """Cache a task's baselines under their key, so later runs on the same device skip timing them
    (never ones measured on a device that was not fit to time; ones read from the cache stay as stored)."""
    if bench.baselines and not bench.suspect and not bench.cached:
        store.save_baseline(baseline_key(bench), bench.task.name, bench.size_name,
                            bench.env["device_name"], bench.env["torch_version"], bench.baselines.model_dump_json())
