"""The held-out sizes after their trials: whose code computed the right answer there.

A held-out trial that passes says the output was right, not whose code made it: a kernel hard-wired
to the declared size that hands every other size to PyTorch is right everywhere
(tests/redteam/hardwired_size_fallback.py). So at each held-out size whose trial passed the parent
asks for the child's profile of one call there (a claim: which ops took the time, used only to
refuse). The library serves a kernel at a held-out size only where both held (ShapeRun.served).

Nothing is timed here: the only times kgen records are the parent's, at the main size
(docs/decisions/held-out-sizes.md).
"""

from __future__ import annotations

import time

from ..child import protocol as P
from ..policy import POLICY
from ..records import ShapeRun, TrialResult
from . import owncode


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
