"""An attempt that ends before its verdict on the calls: the child failed, broke the protocol, timed
out or died. The session raises Ended where it sees that; evaluate turns it into the result."""

from __future__ import annotations

import signal

from .. import sandbox
from ..records import EvalResult, Verdict
from .bench import _tail


class Ended(Exception):
    """The session is over before a verdict on the calls: the child failed, broke the protocol, timed
    out or died. Carries the verdict."""

    def __init__(self, result: EvalResult | None):
        super().__init__(result.error if result else "the child ended")
        self.result = result


def ended_early(child: sandbox.Child, code: int, log: str, what: str) -> EvalResult:
    if child.timed_out:
        return EvalResult(verdict=Verdict.timeout, error=f"killed after {child.deadline - child.started:.0f} s "
                          f"while waiting for {what}", detail=log[-4000:])
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return EvalResult(verdict=Verdict.crashed, error=f"child killed by {name} before {what}", detail=log[-4000:])
    return EvalResult(verdict=Verdict.crashed, error=f"child exited with status {code} before {what}: {_tail(log, 1)}",
                      detail=log[-4000:])
