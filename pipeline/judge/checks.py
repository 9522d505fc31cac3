"""What the parent checks of the child's outputs (Checks, which the session is): each checked call's
values against the reference's float64 ones, here where they came ahead (AttemptPlan.specs), else in
the reference process (refproto.Compare); and the held-out sizes after their trials (held_out).

A passing held-out trial says the output was right, not whose code made it, so the child's profile
there (a claim, used only to refuse) must show its own kernel ran too (ShapeRun.served). Nothing is
timed there (docs/decisions/held-out-sizes.md).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from ..child import protocol as P
from ..policy import POLICY
from ..records import ShapeRun, TrialResult, Verdict
from . import judge, owncode, refproto as R
from .bench import EvaluationError
from .judge import Expected


class Checks:
    """The session's checks of values (pipeline.judge.session.Session, whose state they use)."""

    def values(self, slot: int, header: P.OutputHeader | None, want: Expected) -> judge.Slot | None:  # read in place
        if header is None or not header.written:
            return None
        return judge.Slot.of(self.outbox, slot, header.packed or [header.dtype or ""], [n for _, _, n in want.layout()])

    def fetch(self, key: str) -> Expected:
        """A checked call's expected values: made ahead (AttemptPlan.specs) or asked for now. A timed or
        Bound call's come without PyTorch's own error (refproto.Spec.errors), which saves the reference work:
        the trial of its size and variant describes it and sets its tolerance."""
        spec, trial = self._spec(key)
        if (want := self.expected.get(key)) is None or want.fd is None:
            want = self.expected[key] = self.bench.expected_for(self.plan.init_seed, key, spec, self.lane)
        if trial is not None and want.rel_errs is None:
            want = self.expected[key] = self._as_trial(trial, want)
        return want

    def _spec(self, key: str) -> tuple[dict[str, Any], Expected | None]:
        """A checked call's spec, and the judged trial that describes it where it asks for no errors of its own."""
        spec, trial = self.plan.checked[key], None
        if not spec.get("errors", True):
            trial = next((v for k, v in self.expected.items() if k.startswith("trial") and v.rel_errs is not None
                          and (self.plan.checked[k]["size"], self.plan.checked[k]["variant"]) == (spec["size"], spec["variant"])),
                         None)
            spec = spec if trial is not None else {**spec, "errors": True}  # no trial judged at its size: its own
        return spec, trial

    def _as_trial(self, trial: Expected, want) -> Expected:
        if trial.numel != want.numel or trial.shape != want.shape:
            raise EvaluationError(f"task {self.bench.task.name}: its output changes size with the seed "
                                  f"({want.shape}, its trial's {trial.shape})")
        return dataclasses.replace(trial, fd=getattr(want, "fd", None))

    def check(self, key: str, header: P.OutputHeader, values, like: Expected) -> TrialResult:
        """One checked call's output against its float64 values: here where they came ahead (fetch; the
        caller releases them), else in the reference process, which reads the outbox and computes them on its
        device, so large float64 values never cross to the host. `like`: an Expected of the call's size."""
        bench = self.bench
        tol, device, dtype = bench.tolerance, bench.device, bench.settings.dtype
        if self.plan.ahead:
            return judge.compare(header, values, self.fetch(key), tol, device, dtype)
        if (problem := judge.header_problem(header, values, like, device)) is not None:
            return problem  # values that never reached the outbox whole among them: nothing to send
        spec, trial = self._spec(key)
        parts = [(at, str(kind).removeprefix("torch."), end - first) for first, end, at, kind, _ in values.parts]
        got = bench.compare(self.plan.init_seed, R.Spec(key=key, **spec), self.outbox.fd, parts,
                            trial.errors() if trial is not None else None, self.lane)
        described = got.model_dump(include=set(R.Described.model_fields))
        want = Expected(**{**described, "parts": described["parts"] if bench.settings.grad else None}, fd=None)
        want = self.expected[key] = self._as_trial(trial, want) if trial is not None else want
        return judge.compare(header, values, want, tol, device, dtype, stats=got.stats)

    def release(self, key: str) -> None:  # a checked call's values, once compared (maps die with their views)
        if self.expected[key].fd is None:  # compared in the reference (check)
            return
        os.close(self.expected[key].fd)
        self.expected[key] = dataclasses.replace(self.expected[key], fd=None)  # its shapes, for later checks

    def discard(self, first: int = 1, count: int | None = None) -> None:
        """On the cpu, judged slots' pages back where large; never slot 0 (Bound calls write it in the window: faults)."""
        if self.bench.device == "cpu" and self.outbox.slot_values * 8 >= POLICY.discard_slot_bytes:
            self.outbox.discard(first, count)

    def trial(self, trial: P.Trial) -> TrialResult:
        bench = self.bench
        reply, _ = self.ask(trial, P.TrialDone, f"trial {trial.index}")
        like = next(v for k, v in self.expected.items() if self.plan.checked[k]["size"] == trial.size)  # its layout
        first, after, again = (self.values(i, h, like) for i, h in enumerate((reply.output, reply.after_sync, reply.repeat)))
        settled, same = judge.same_values(first, after), again is not None and judge.same_values(first, again)
        self.discard(1, 2 if same else 1)  # before the float64 forward; a repeat equal to the first is judged as it
        key = f"trial{trial.index}"
        try:
            result = self.check(key, reply.output, first, like)
            if result.ok and not reply.inputs_unchanged:
                result = judge.fail(Verdict.inputs_mutated, "the candidate changed its inputs")
            if result.ok and not settled:
                result = judge.fail(Verdict.nondeterministic, "the output changed after the call returned (work left running)")
            if result.ok and trial.repeat:
                # The same bytes as the first: the same values' verdict, its header judged on its own.
                second = ((judge.header_problem(reply.repeat or reply.output, first, like, bench.device) or result) if same
                          else self.check(key, reply.repeat or reply.output, again, like))
                if not second.ok:
                    result = judge.fail(Verdict.nondeterministic, f"a second call on the same inputs disagrees: {second.error}")
        finally:
            self.release(key)
        self.discard()
        label = trial.variant if trial.size == bench.size else f"{trial.variant}@{trial.size if isinstance(trial.size, str) else 'custom'}"
        result = result.model_copy(update={"index": trial.index, "variant": label})
        self.judged.append(result)
        return result

    def check_block(self, prefix: str, what: str, headers: list[P.OutputHeader]) -> tuple[Verdict, str] | None:
        """A Bound request's outputs, `prefix`_0, _1, ...: the checked ones (plan.checked) in full, every
        other one's shape against trial 0's, the expected output of the main size."""
        like = "trial0"
        for j, header in enumerate(headers):
            if f"{prefix}_{j}" not in self.plan.checked:
                if header.shape != self.expected[like].shape or not header.written:
                    return Verdict.mismatch, f"{what} {j} returned {header.type} of shape {header.shape}"
                continue
            try:
                r = self.check(f"{prefix}_{j}", header, self.values(j, header, self.expected[like]), self.expected[like])
            finally:
                self.release(f"{prefix}_{j}")
            if not r.ok:
                return r.verdict, f"{what} {j} returned a wrong result ({r.error}): cached, stale or drifting output"
        self.discard()
        return None


def held_out(session, trial: P.Trial, passed: TrialResult, interpreted_eager_ms: float | None) -> ShapeRun:
    """One held-out size whose trial passed (`session`: pipeline.judge.session.Session, mid-conversation).
    An Ended raised here ends the held-out sizes as a failed trial there would."""
    run = ShapeRun(size=passed.variant.split("@", 1)[1], correct=True)
    own = session.own
    if own is not None and own.holds_own is False:  # the parent's finding: nothing of its own to run
        run.own_ran = False
    elif session.settings.profile:
        at = time.monotonic()
        request = P.Profile(size=trial.size, repeats=POLICY.cpu_short_profiles, short_us=POLICY.cpu_short_profile_us)
        prof, _ = session.ask(request, P.ProfileDone, f"the profile at {run.size}")
        session.spent("shapes_profile", at)
        claim = owncode.pytorch_did_it(prof, interpreted_eager_ms, owncode.library_allowed(session.bench.task.level))
        run.own_ran = None if claim is None else not claim
        run.torch_fraction = prof.torch_fraction
    return run
