"""The parent's clock, the only one: the time recorded is each Bound request's window (request to reply)
less a null request's, per call, on the cpu and a GPU alike. A request reveals fresh inputs only as its
window opens and the harness copies nothing inside it, so nothing subtracted is work a candidate could
skip. The null is a null model's request before the import (net_per_call) and, on a GPU, the reference's
null replay beside each request (paired_per_call), which eager and compiled are timed net of too. The
child's clock is never read (docs/decisions/cpu-timing.md, gpu-timing.md). On the cpu, what a loaded
machine added comes out by the kernel's schedstat accounts, read outside the window (unloaded_ms).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable
from dataclasses import dataclass

from ..child.timing import summarize_blocks
from ..records import Ratio, Timing


def _stat(path: str) -> tuple[int, int]:
    try:
        with open(path) as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, IndexError, ValueError):
        return 0, 0


def threads_of(pid: int) -> dict[int, tuple[int, int]]:
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


@dataclass
class Window:
    """One request the parent timed: from its send to the reply's arrival."""

    ms: float
    calls: int
    load: Load | None = None
    """What the run queues took of it, and the child's time on a cpu in it (above)."""


def unloaded_ms(window: Window, threads: int = 1) -> float:
    """The window less what other processes took of it (cpu): less the run-queue waits of the child's
    busiest thread and the parent's, never below the child's cpu time over its `threads` cores. No
    candidate lowers this below its work: a wait is time it did not run."""
    if window.load is None:
        return window.ms
    return max(window.ms - window.load.wait_ms, window.load.cpu_ms / max(1, threads), 0.0)


def unloaded_run(run: Callable[[], list[list[float]]], calls: int, threads: int) -> list[list[float]]:
    """`run`'s call times (the reference's cold block, in this process) with its load taken out
    (unloaded_block), read from this process's threads around it."""
    before, at = threads_of(os.getpid()), time.perf_counter()
    times = run()
    load = between((before, (0, 0)), (threads_of(os.getpid()), (0, 0)))
    return unloaded_block(times, Window((time.perf_counter() - at) * 1e3, calls, load), threads)


def unloaded_block(times: list[list[float]], block: Window, threads: int) -> list[list[float]]:
    """The reference's cold block (cpu, beside a Bound request), each call's time scaled by the block's
    unloaded share (unloaded_ms), so both sides of a speedup have the load taken out one way."""
    share = unloaded_ms(block, threads) / block.ms if block.ms > 0 else 1.0
    return [[t * min(1.0, share) for t in side] for side in times]


def net_per_call(calibration: list[Window], bounds: list[Window], device: str = "cuda", threads: int = 1) -> list[float]:
    """Each Bound request's milliseconds a call less the calibration's null request: the median on a GPU
    (robust to a stalled one), the fastest on the cpu (a machine's stalls only add time), both sides
    unloaded there (unloaded_ms)."""
    if not calibration or not bounds:
        return []
    if device == "cpu":
        base = min(unloaded_ms(w, threads) for w in calibration)
        return [max(0.0, unloaded_ms(w, threads) - base) / w.calls for w in bounds]
    base = statistics.median(w.ms for w in calibration)
    return [max(0.0, w.ms - base) / w.calls for w in bounds]


def paired_per_call(calibration: list[Window], null_calibration: list[float | None], bounds: list[Window],
                    nulls: list[float | None]) -> list[float] | None:
    """Each replayed Bound request's ms a call less its own null (`nulls[k]`, the reference's replay beside it)
    and the offset, the median of the calibration's pairs (calibration_offset: pairs, as the GPU drifts;
    docs/decisions/gpu-timing.md). None where a request or the calibration has no null beside it."""
    offset = calibration_offset(calibration, null_calibration)
    if offset is None or not bounds or len(nulls) != len(bounds) or None in nulls:
        return None
    return [max(0.0, w.ms - (offset + null)) / w.calls for w, null in zip(bounds, nulls)]


def null_noise(calibration: list[Window], bounds: list[Window], per_call: list[float], threads: int = 1) -> float | None:
    """On the cpu, the null requests' interquartile range (unloaded_ms) over the median request's net
    time: how much of a request's calls the protocol's own variation could be. None where there are
    too few nulls or no request took longer than one."""
    work = [x * w.calls for x, w in zip(per_call, bounds)]
    if len(calibration) < 4 or not work or statistics.median(work) <= 0:
        return None
    q1, _, q3 = statistics.quantiles([unloaded_ms(w, threads) for w in calibration], n=4)
    return (q3 - q1) / statistics.median(work)


def spread(per_call: list[float]) -> float | None:
    """The requests' interquartile range over their median (statistics' exclusive quartiles); None
    where there are too few, or the median is 0."""
    if len(per_call) < 2 or statistics.median(per_call) <= 0:
        return None
    q1, _, q3 = statistics.quantiles(per_call, n=4)
    return (q3 - q1) / statistics.median(per_call)


def calibration_offset(calibration: list[Window], null_calibration: list[float | None]) -> float | None:
    """The median of the calibration's pairs, each window less the reference's null beside it
    (paired_per_call); None where they are not index for index or no window has a null beside it."""
    pairs = [w.ms - n for w, n in zip(calibration, null_calibration) if n is not None]
    if not pairs or len(null_calibration) != len(calibration):
        return None
    return statistics.median(pairs)


def load_share(windows: list[Window]) -> float:
    """The share of `windows`' milliseconds that went to run-queue waits (above): the
    child's busiest thread's and the parent's."""
    total = sum(w.ms for w in windows)
    waited = sum(w.load.wait_ms for w in windows if w.load is not None)
    return min(1.0, waited / total) if total > 0 else 0.0


def summarize(times: list[float]) -> Timing:
    """Median and quartiles of `times`."""
    return Timing(**summarize_blocks(times, 1))


def pair_ratios(per_call: list[float], reference: list[list[float]]) -> Ratio | None:
    """The reference's mean call over the candidate's, request by request (`reference[k]`: its calls
    timed beside request k): a machine whose speed drifts moves both sides of a pair alike. A request
    whose net time is 0 (its null stalled) has no ratio; None where none has, or they do not line up."""
    if len(reference) != len(per_call) or not all(reference):
        return None
    ratios = [statistics.fmean(theirs) / ours for theirs, ours in zip(reference, per_call) if ours > 0]
    if not ratios:
        return None
    s = summarize_blocks(ratios, 1)  # blocks of one: the ratios' own median and quartiles
    return Ratio(median=s["median_ms"], p25=s["p25_ms"], p75=s["p75_ms"], pairs=len(ratios))
