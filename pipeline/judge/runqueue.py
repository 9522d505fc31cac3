"""What a loaded machine added to a window the parent timed: the kernel's own account, which no
candidate forges.

/proc/<pid>/task/<tid>/schedstat holds, per thread, nanoseconds on a cpu and nanoseconds runnable but
waiting on a run queue. The parent reads them for the child's threads and its own around each
request it times (pipeline.judge.session.Session.ask), outside the window (a read costs tens of
microseconds a thread), and pipeline.judge.judge.unloaded_ms takes the load out of the window.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _stat(path: str) -> tuple[int, int]:
    try:
        with open(path) as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, IndexError, ValueError):
        return 0, 0


def threads(pid: int) -> dict[int, tuple[int, int]]:
    """(ns on a cpu, ns waiting on a run queue) of every live thread of `pid`."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    return {int(tid): _stat(f"/proc/{pid}/task/{tid}/schedstat") for tid in tids}


def waited_s(pid: int) -> float:
    """Seconds the main thread of `pid` has spent runnable but waiting on a run queue (one read)."""
    return _stat(f"/proc/{pid}/schedstat")[1] / 1e9


def own() -> tuple[int, int]:
    """The calling thread's (ns on a cpu, ns waiting)."""
    return _stat("/proc/thread-self/schedstat")


@dataclass
class Load:
    """One window's account, in milliseconds."""

    cpu_ms: float = 0.0
    """Time the child's threads spent on a cpu (all of them, added up)."""
    wait_ms: float = 0.0
    """The run-queue wait of the child's busiest thread (the most time on a cpu), plus the parent's."""


def between(before: tuple[dict[int, tuple[int, int]], tuple[int, int]],
            after: tuple[dict[int, tuple[int, int]], tuple[int, int]]) -> Load:
    """The load of a window from snapshots (threads(child), own()) taken before and after it. A thread
    that exited inside the window is missing from `after`: its time on a cpu and its wait are lost,
    which can only make the window read more loaded-free (pipeline.judge.judge.unloaded_ms), never less."""
    (was, parent_was), (now, parent_now) = before, after
    deltas = [(cpu - was.get(tid, (0, 0))[0], wait - was.get(tid, (0, 0))[1]) for tid, (cpu, wait) in now.items()]
    busiest = max(deltas, default=(0, 0))
    return Load(cpu_ms=sum(d[0] for d in deltas) / 1e6,
                wait_ms=(max(0, busiest[1]) + max(0, parent_now[1] - parent_was[1])) / 1e6)


def cores_of(pid: int) -> set[int] | None:
    """The cores `pid`'s main thread may run on (the parent pinned them: sandbox.pin), None if gone."""
    try:
        return os.sched_getaffinity(pid)
    except OSError:
        return None
