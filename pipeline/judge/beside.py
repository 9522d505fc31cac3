"""The reference's blocks, timed by the reference process right after each of the candidate's timed
blocks (never beside it, while the candidate's process is stopped): eager, then torch.compile of the
same model, so each speedup is a ratio of times taken in the same window. `session` is the
attempt's pipeline.judge.session.Session (not imported: the session imports this)."""

from __future__ import annotations

import time
from typing import Any

from .bench import _seed


def eager_block(session: Any, calls: int, first: bool) -> None:
    """As many eager calls, then as many torch.compile calls, timed by the reference process right
    after the candidate's block (never beside it): the speedups are ratios of times taken in the
    same window."""
    at = time.monotonic()
    session.child.pause()  # what the candidate left running must not slow the other side (sandbox.Child.pause)
    try:
        at = session.spent("timing_pause", at)
        session.eager.extend(reference_block(session, calls, first, compiled=False))
        at = session.spent("timing_eager", at)
        if session.compile_beside:
            times = reference_block(session, calls, first, compiled=True)
            session.spent("timing_compiled", at)
            if times is None:  # torch.compile failed in the reference: the prepared baseline stands in
                session.compile_beside, session.compiled = False, []
            else:
                session.compiled.extend(times)
    finally:
        session.child.resume()

def reference_block(session: Any, calls: int, first: bool, compiled: bool, size=None) -> list[float] | None:
    """One block timed by the reference process (eager, or torch.compile of the same model), at
    the main size or `size`; None when it reports the block failed."""
    bench = session.bench
    msgs = bench.request({"op": "time_block", "size": bench.size if size is None else size,
                          "held_out": size is not None, "init_seed": session.plan.init_seed,
                          "seeds": [_seed() for _ in range(calls)], "compiled": compiled,
                          "warmup": bench.settings.warmup_calls if first else 0}, bench.settings.timeout_s, session.lane)
    if (failed := [m for m in msgs if m.get("event") == "block_failed"]):
        session.block_error = failed[0].get("error")
        return None
    for m in msgs:
        if m.get("event") == "block" and m.get("busy") and "after_ms" in m["busy"]:
            busy = m["busy"]
            session.device_busy = (f"the GPU ran other work while the reference timed (a probe took "
                                f"{busy['after_ms']:.3f} ms, {busy['idle_ms']:.3f} idle), after a wait and a re-timing: "
                                "work the candidate left running")
    return [t for m in msgs if m.get("event") == "block" for t in m["times_ms"]]
