"""One attempt's conversation with its child, in the protocol's fixed order (pipeline.child.protocol):
each request is timed by the parent's clock and must get exactly the reply it calls for within its
step's limit. Anything else ends the attempt, never the run: `Failed` with its step's verdict, garbage
or an out-of-order reply `protocol_error`, silence `timeout`, a dead child `crashed`.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from .. import backends
from ..child import protocol as P
from ..child import memfd
from ..records import EvalResult, Outcome, TrialResult, Verdict
from . import beside, checks, clocks, owncode, refproto as R
from .checks import Checks
from .bench import Ended, TaskBench, ended_early, lane_of
from .clocks import Window, pair_ratios, summarize
from ..verdicts import Clock
from .judge import Expected
from ..policy import POLICY


class Session(Checks):
    def __init__(self, bench: TaskBench, child, plan, expected: dict[str, Expected], outbox: memfd.Outbox,
                 spares, env: dict[str, str], inbox: memfd.Inbox | None = None, inputs: dict[str, int] | None = None,
                 timed: bool = True, settings=None):
        self.bench, self.child, self.plan, self.expected, self.outbox = bench, child, plan, expected, outbox
        self.spares, self.env = spares, env
        self.timed_too = timed  # False on a device unfit to time (pipeline.judge.health): correctness only
        self.settings = settings or bench.settings  # this evaluation's (its limits may differ from the bench's)
        self.inbox, self.inputs = inbox, inputs or {}
        self.phases: dict[str, float] = {}
        self.last = self.part_from = time.monotonic()
        self.step = "loading the task"
        self.confinement: P.Confinement | None = None
        self.device_busy: str | None = None  # the reference's probe saw other work on the GPU (IdleProbe)
        self.judged: list[TrialResult] = []
        self.calibration: list[Window] = []
        self.bound_windows: list[Window] = []
        # Replayed Bound requests (cuda): calibration and windows; the reference's null replays index for index
        # (None where none: clocks.paired_per_call); its digests of the checked replays; why capture failed.
        self.replay_calibration, self.replay_windows = [], []
        self.null_calibration, self.null_windows = [], []  # list[float | None] each
        self.out_shape: list[int] = []
        self.digests: dict[str, R.Digest] = {}
        self.graph_failed: str | None = None
        self.loose_bound: str | None = None  # why a correct result is kept untrusted (its windows count host work)
        self.bound_note: str | None = None  # how the parent's clock measured (EvalResult.bound_note)
        self.per_call: list[float] = []  # each Bound request's net ms a call, on the parent's clock (parent_clock)
        self.estimate: float | None = None  # their median: the time recorded
        self.load: clocks.Load | None = clocks.Load()  # the last window's (ask); None on a GPU
        self.clock: Clock | None = None  # the parent's time of the calls, for decide
        # The reference's eager and torch.compile calls beside the candidate's requests, request by request:
        # on the cpu its cold blocks' calls, on a GPU its replays' net ms a call (beside.replayed).
        self.eager: list[list[float]] = []
        self.compiled: list[list[float]] = []
        b = bench.baselines
        self.compile_beside = bool(b and b.compiled and self.settings.compile_baseline)
        self.lane = lane_of(env)
        self.own = None  # the parent's look at the built code (pipeline.judge.owncode), set by evaluate

    # ---- the conversation ----------------------------------------------------------------------

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = round(now - self.last, 3)
        self.last = self.part_from = now

    def part(self, name: str) -> None:
        """A part of the phase under way, timed from the last mark or part (the phase keeps its total)."""
        now = time.monotonic()
        self.phases[name] = round(now - self.part_from, 3)
        self.part_from = now

    def spent(self, name: str, since: float) -> float:
        """Add the seconds since `since` to a part that recurs (the timing phase's: where its seconds
        go); returns now, for the next part."""
        now = time.monotonic()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - since, 3)
        return now

    def ask(self, request: P.Message | None, kind: type, what: str,
            reveal: list[np.ndarray] | None = None) -> tuple[Any, float]:
        """Send `request` (None: the reply to an earlier one) and return the reply of type `kind`
        with the parent's milliseconds from send to arrival. `reveal`: input sets written into the
        inbox while the child is stopped, so that no work on them can happen before the clock starts."""
        self.step = what
        limit = self.limit(request)
        # Revealed inputs are written while the child is stopped, then the clock starts: the write is the
        # parent's work (a child that will not stop gets it in its window); a stopped thread waits on no run queue.
        stopped = self.child.pause() if reveal else None
        # Load out of windows on the cpu only (clocks.unloaded_ms): on a GPU the reads would be most of a window.
        counted = self.bench.device == "cpu"
        pid = self.child.pid
        child_before = clocks.threads_of(pid) if counted else {}
        waited = clocks.waited_s(pid)
        parent_before = clocks.own()
        sent = time.monotonic()
        if reveal:
            self.inbox.reveal(reveal, clocks.cores_of(pid))
        if stopped is not None:
            parent_before = clocks.own()
            sent = time.monotonic()
            self.child.resume(stopped)
        if request is not None:
            self.child.send(request)
        # The limit counts time the child could run: its main thread's run-queue waits are added, up to the
        # ceiling (or the child's deadline), so a loaded box times out no honest step; crowding its own core
        # buys at most the cap, and a hang waits on no run queue.
        ends = [sent + limit]
        cap = sent + self.settings.step_ceiling_s if limit < self.settings.step_ceiling_s else self.child.deadline

        def later() -> float:
            ends.append(min(cap, sent + limit + clocks.waited_s(pid) - waited))
            return ends[-1]

        try:
            reply, at = self.child.reply(ends[0], later)
            parent_after = clocks.own()
        except TimeoutError:
            if ends[-1] >= self.child.deadline:
                raise Ended(None) from None  # the child's own deadline: finalize() names it
            raise Ended(EvalResult(verdict=Verdict.timeout, error=f"no reply in {ends[-1] - sent:.1f} s while waiting "
                                   f"for {what} (the limit for that step, {limit:.1f} s, and the time the child waited "
                                   f"for a cpu: pipeline.judge.session.Session.limit)", trials=list(self.judged))) from None
        except P.ProtocolError as exc:
            self.child.kill()
            raise Ended(EvalResult(verdict=Verdict.protocol_error, error=f"while waiting for {what}: {exc}")) from None
        if reply is None:
            raise Ended(None)
        self.load = (clocks.between((child_before, parent_before), (clocks.threads_of(pid), parent_after))
                     if counted else None)
        if isinstance(reply, P.Failed):
            raise Ended(self.failed(reply, what))
        index = getattr(request, "index", None)
        if not isinstance(reply, kind) or getattr(reply, "index", index) != index:
            self.child.kill()
            raise Ended(EvalResult(verdict=Verdict.protocol_error, error=f"while waiting for {what}: the child sent "
                                   f"{type(reply).__name__}{_at(reply)} instead of {kind.__name__}{_at(request)}"))
        return reply, (at - sent) * 1e3

    def limit(self, request: P.Message | None) -> float:
        """Seconds the child gets to answer `request`: the floor plus step_factor x its calls at eager's
        baseline, at most the ceiling. Setup gets three floors (a kernel compiled on first use); loading and a
        trial at another size (calls the baseline does not measure) the ceiling."""
        s, b = self.settings, self.bench.baselines
        eager_s = b.eager.median_ms / 1e3 if b and b.eager else None
        floor = 3 * s.step_floor_s if isinstance(request, P.Setup) else s.step_floor_s
        if request is None or (isinstance(request, P.Trial) and request.size != self.bench.size):
            calls = None
        elif isinstance(request, P.Bound):
            calls = request.calls
        elif isinstance(request, P.Play):
            calls = self.plan.replays
        elif isinstance(request, P.Setup):
            calls = request.warmup
        elif isinstance(request, P.Trial):
            calls = 3  # the call, its repeat, and the harness's copies around them
        else:
            calls = 0
        if calls is None or eager_s is None:
            return s.step_ceiling_s
        return min(s.step_ceiling_s, floor + s.step_factor * calls * eager_s)

    def failed(self, reply: P.Failed, what: str) -> EvalResult:
        verdict = Verdict.load_failed if reply.op == "import" else Verdict.runtime_error
        if reply.kind:  # gradient mode's own failures (pipeline.child.grad): the child's word only rejects
            verdict = Verdict(reply.kind)
        return EvalResult(verdict=verdict, error=f"{what}: {reply.error}" if reply.op != "import" else reply.error,
                          detail=reply.traceback, trials=list(self.judged))

    def run(self, job: P.Job) -> EvalResult:
        plan, bench = self.plan, self.bench
        self.child.send(job)
        self.out_shape = list(job.out_shape)
        ready, _ = self.ask(None, P.Ready, "loading the task")
        # What the parent set and checked itself (pipeline/sandbox/confine.py); the child's own report
        # (ready.confinement) is a claim, kept only where no jail ran.
        self.confinement = self.child.confinement() if self.child.policy is not None else ready.confinement
        self.part("startup_ready")
        beside.calibrate(self)
        self.part("startup_calibration")
        self.mark("startup")
        self.ask(P.Import(), P.Imported, "the import")
        self.mark("import")
        self.ask(P.Setup(init_seed=plan.init_seed, warm_seed=plan.warm_seed, warmup=bench.settings.warmup_calls),
                 P.SetupDone, "building ModelNew and warming up")
        main = [t for t in plan.trials if t.size == bench.size]
        for trial in main:
            result = self.trial(trial)
            if not result.ok:
                return EvalResult(verdict=result.verdict, error=f"trial {result.index} ({result.variant}): "
                                  f"{result.error}", trials=list(self.judged))
        self.mark("trials")
        problem = self.timing() if self.timed_too else None
        if self.spares:
            self.spares.release(self.env)  # nothing is timed on this device any more in this attempt
        self.mark("timing")
        # What the attempt records: the parent's Bound windows, net, a value a request (parent_clock), whose
        # median is the estimate; eager and torch.compile as the reference timed them beside each request.
        calls = sum(w.calls for w in (self.bound_windows or self.replay_windows))
        timing = summarize(self.per_call).model_copy(update={"n": calls}) if self.per_call else None
        eager, compiled = ([t for ts in side for t in ts] for side in (self.eager, self.compiled))
        ratios = dict(eager_ratio=pair_ratios(self.per_call, self.eager), compiled_ratio=pair_ratios(self.per_call, self.compiled))
        eager, compiled = (summarize(ts) if ts else None for ts in (eager, compiled))
        if problem:
            return EvalResult(verdict=problem[0], error=problem[1], trials=list(self.judged), timing=timing,
                              eager_beside=eager, compiled_beside=compiled, **ratios)
        profile = None
        if bench.settings.profile:
            request = P.Profile(repeats=POLICY.cpu_short_profiles, short_us=POLICY.cpu_short_profile_us)
            profile, _ = self.ask(request, P.ProfileDone, "the profile")
        self.mark("profile")
        shape_results, shape_runs = [], []
        # Eager as timed beside this attempt's blocks, where it was: a baseline from minutes before, under
        # another load, let a fallback to PyTorch go unflagged.
        interpreted = ((statistics.median(t for ts in self.eager for t in ts) if any(self.eager) else self.bench.baselines.eager.median_ms)
                       if backends.interpreted(self.bench.backend) and self.bench.baselines else None)
        for trial in plan.trials[len(main):]:
            try:
                shape_results.append(self.trial(trial))
                if shape_results[-1].ok:  # whose code ran there (pipeline.judge.checks)
                    shape_runs.append(checks.held_out(self, trial, shape_results[-1], interpreted))
            except Ended as ended:  # a kernel that fails at another size is flagged, not rejected
                error = ended.result.error if ended.result else f"no result at {trial.size}"
                shape_results.append(TrialResult(index=trial.index, variant=f"scaled@{trial.size}", ok=False,
                                                 verdict=ended.result.verdict if ended.result else Verdict.crashed,
                                                 error=error))
                break
        self.mark("other_sizes")
        self.child.send(P.Finish())
        sizes = [bench.size_name] + [t.variant.split("@", 1)[1] for t in shape_results if t.ok]
        flags, claimed = owncode.flags_for(profile, shape_results, self.own, shape_runs, interpreted,
                                           owncode.library_allowed(bench.task.level))
        outcome = Outcome(verdict=Verdict.correct, findings=[f for f in flags if f not in claimed], claims=claimed)
        return EvalResult(outcome=outcome, shapes=shape_runs,
                          own_fraction=owncode.own_share(profile),
                          trials=list(self.judged), sizes=sizes,
                          timing=timing, eager_beside=eager, compiled_beside=compiled, **ratios,
                          detail=profile.model_dump_json() if profile else None)

    def finalize(self, result: EvalResult | None, code: int, log: str) -> EvalResult:
        if result is None:
            result = ended_early(self.child, code, log, self.step).model_copy(update={"trials": list(self.judged)})
        update: dict[str, Any] = {"confinement": self.confinement, "output": log[-4000:] or None,
                                  "bound_note": self.bound_note}
        if self.estimate is not None:
            update["wall_ms_per_call"] = self.estimate
        if result.verdict is not Verdict.correct and not result.detail:
            update["detail"] = log[-4000:]
        return result.model_copy(update=update)

    # ---- checks --------------------------------------------------------------------------------

    def timing(self) -> tuple[Verdict, str] | None:
        """The Bound requests, each checked as its reply is in, then the parent's clock over them. The
        reference frees what its blocks and replays kept however the requests ended."""
        bench = self.bench
        try:
            if (problem := self.bound_requests()):
                return problem
        finally:
            bench.request(R.Release(), bench.settings.timeout_s, self.lane)
        return self.parent_clock()

    def parent_clock(self) -> tuple[Verdict, str] | None:
        """The one clock: each Bound request's window less a null's, per call (clocks.net_per_call, or
        paired_per_call where replayed); unreplayed GPU windows hold host work, so that figure stays out of
        `best`. What the time means is decide's (pipeline.verdicts), from `self.clock`."""
        bench, cpu = self.bench, self.bench.device == "cpu"
        share = noise = None
        if cpu:
            per_call = clocks.net_per_call(self.calibration, self.bound_windows, "cpu", self.settings.cpu_threads)
            share = clocks.load_share(self.bound_windows + self.calibration)
            noise = clocks.null_noise(self.calibration, self.bound_windows, per_call, self.settings.cpu_threads)
        elif self.replay_windows and not self.bound_windows:
            per_call = clocks.paired_per_call(self.replay_calibration, self.null_calibration, self.replay_windows,
                                             self.null_windows)
            if per_call is not None:
                self.bound_note = (self.bound_note or "") + ("; each less a null replay of the reference's beside it: "
                                    + ", ".join(f"{x * 1e3:.2f}" for x in per_call) + " us a call"
                                    + beside.paired_terms(self.replay_calibration, self.null_calibration,
                                                          self.replay_windows, self.null_windows))
            else:
                per_call = clocks.net_per_call(self.replay_calibration, self.replay_windows, bench.device)
        else:
            per_call = clocks.net_per_call(self.calibration, self.bound_windows, bench.device)
            why = (f"its calls could not be replayed from a CUDA graph ({self.graph_failed[:160]})" if self.graph_failed
                   else "replay_bound is off, so its calls were not replayed from CUDA graphs")
            self.loose_bound = f"{why}: the parent's windows count the calls' host work (launches, Python)"
        if not per_call:
            return Verdict.protocol_error, "no Bound request was timed"
        self.per_call, self.estimate = per_call, statistics.median(per_call)
        self.clock = bench.clock(self.estimate, self.lane, requests=len(per_call), empty=sum(x <= 0 for x in per_call),
                                 load_share=share, noise=noise, replayed=bool(self.replay_windows and not self.bound_windows),
                                 spread=clocks.spread(per_call))
        return None

    def bound_requests(self) -> tuple[Verdict, str] | None:
        """The plan's Bound requests, each checked as its reply is in, and eager beside each: replayed
        as its calls were (beside.replayed), or on the cpu a cold block timed as they were."""
        plan, at = self.plan, time.monotonic()
        for k, bound_seeds in enumerate(plan.bounds):
            if plan.replays and not self.graph_failed:
                replayed = beside.replayed(self, k, bound_seeds)
                at = self.spent("timing_bounds", at)
                if replayed is not None and replayed is not True:
                    return replayed
                if replayed is True:
                    continue
            # Private copies, read before the window as the files were: a child that will not
            # stop gets the write inside it (ask), and a first touch of a map's pages there costs.
            values = self.bench.bound_inputs(plan, k, self.inputs, self.lane, self.inbox.set_bytes) if self.inbox else None
            reply, ms = self.ask_bound(k, bound_seeds, f"bound block {k}", values)
            at = self.spent("timing_bounds", at)
            if len(reply.outputs) != len(bound_seeds):
                return Verdict.protocol_error, f"bound block {k}: {len(reply.outputs)} outputs for {len(bound_seeds)}"
            self.bound_windows.append(Window(ms, len(bound_seeds), self.load))
            if (problem := self.check_block(f"bound{k}", "bound block call", reply.outputs)):
                return problem
            at = self.spent("timing_checks", at)
            cpu = self.bench.device == "cpu"
            beside.eager_block(self, len(bound_seeds), first=len(self.bound_windows) == 1, cold=cpu)
            if self.device_busy:
                return Verdict.impossible_timing, self.device_busy
            at = time.monotonic()
        return None

    def ask_bound(self, index: int, seeds: list[int], what: str, values: list[np.ndarray] | None) -> tuple[P.BoundDone, float]:
        """An eager Bound request and its milliseconds: values through the inbox (the parent's, written
        in the window) or a seed per call. In gradient mode on the inbox an Arm goes first, untimed,
        with the seeds each call's upstream is drawn from (P.Arm)."""
        if not self.inbox:
            return self.ask(P.Bound(index=index, seeds=seeds), P.BoundDone, what)
        if self.bench.settings.grad:
            self.ask(P.Arm(index=index, seeds=seeds), P.BoundReady, what)
        return self.ask(P.Bound(index=index, inbox=len(seeds)), P.BoundDone, what, values)

def _at(message: Any) -> str:
    return f" ({message.index})" if getattr(message, "index", None) is not None else ""
