"""Which cores a child runs on: a GPU lane's timing processes on the lane's own cores, a cpu
evaluation's child and reference process on the same ones, builds on the rest."""

from __future__ import annotations

import contextlib
import os


def pin(pid: int, cores: str | None) -> None:
    """Keep a child on `cores` ("0,1"; KGEN_CORES in its environment), set right after exec so every
    thread and process it starts inherits it; seccomp then refuses sched_setaffinity to candidate code."""
    if not cores:
        return
    with contextlib.suppress(ProcessLookupError, ValueError, OSError):  # gone already, or cores this machine lacks
        os.sched_setaffinity(pid, {int(c) for c in cores.split(",")})


def cpu_cores(threads: int) -> str:
    """The cores a cpu evaluation's child and reference process share (taking turns): the first
    `threads` of ours (EvalConfig.cpu_threads), so no kernel reads faster for using more cores than eager.
    KGEN_CPU_CORES ("1" or "2,3") names the cores to take first, so two cpu jobs need not share one."""
    cores = sorted(os.sched_getaffinity(0))
    if (wanted := os.environ.get("KGEN_CPU_CORES", "").strip()):
        try:
            first = [int(c) for c in wanted.split(",")]
        except ValueError:
            raise ValueError(f"KGEN_CPU_CORES={wanted!r}: expected core numbers, comma-separated (like 1 or 2,3)") from None
        if not (mine := list(dict.fromkeys(c for c in first if c in cores))):  # each once: "1,1" is one core
            raise ValueError(f"KGEN_CPU_CORES={wanted!r}: none of these cores is among this process's {cores}")
        cores = mine + [c for c in cores if c not in mine]
    return ",".join(map(str, cores[:max(1, threads)]))


def pin_all(pid: int, cores: str | None) -> None:
    """Move every thread of a running child onto `cores` (a spare taken for a lane); later threads
    inherit the mask, and one started during the walk is caught by the next pass."""
    if not cores:
        return
    wanted = {int(c) for c in cores.split(",")}
    done: set[int] = set()
    for _ in range(3):
        try:
            tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")} - done
        except OSError:
            return  # gone
        if not tids:
            return
        for tid in tids:
            with contextlib.suppress(ProcessLookupError, ValueError, OSError):
                os.sched_setaffinity(tid, wanted)
        done |= tids


@contextlib.contextmanager
def on_cores(cores: str | None):
    """The calling thread (and what it starts meanwhile) on `cores` ("0,1"), then back: a lane's job
    in the parent times every window, so it runs on the lane's cores, not among the builds."""
    if not cores:
        yield
        return
    before = os.sched_getaffinity(0)  # on Linux, pid 0 is the calling thread
    os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def spread(cores: list[int] | None):
    """Every thread of this process on `cores`, with as many torch threads, for work nothing times (a
    checked call's values, while the child waits), then back."""
    if not cores:
        yield
        return
    import torch

    before, threads = ",".join(map(str, sorted(os.sched_getaffinity(0)))), torch.get_num_threads()
    pin_all(os.getpid(), ",".join(map(str, cores)))
    torch.set_num_threads(len(cores))
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        pin_all(os.getpid(), before)  # threads torch started meanwhile too
