"""Evaluation lanes: one attempt at a time per device, and a device that fails is taken out of service.

A lane is one GPU (local executor) or one Ray actor holding one GPU; on the cpu backend, the
machine. A lane runs one child at a time, so nothing else computes on its device while it times.
After each job the lane says whether its device is still fit (pipeline.judge.health): a lane found unfit
is retired for the rest of the run with one message, and the job it was doing goes to another lane,
so its verdict and timing come from a device that is fit. The last lane is never retired: with
nowhere else to go, its jobs keep the correctness verdict and their timing is marked unfit, as on a
one-GPU machine (a resume re-times them).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Generic, Hashable, TypeVar

Lane = TypeVar("Lane")


class LaneFailed(Exception):
    """A job found its lane's device unfit. Carries what the job produced there, a result or the
    exception it raised (used only when no other lane is left), and why."""

    def __init__(self, reason: str, result: Any):
        super().__init__(reason)
        self.reason = reason
        self.result = result


class Lanes(Generic[Lane]):
    """A pool of lanes handed out one job at a time.

    Jobs carry a key (the task): a lane keeps a task's reference process, and the first attempt of a
    task on a lane pays for starting it and for compiling the reference beside it (several times what
    the next attempt pays: docs/decisions/spares-and-startup.md). So a free lane takes, in order,
    the oldest job of a task it has run before, the oldest of a task no lane has run, the oldest.
    Nothing waits for a particular lane: a free lane never stays idle while jobs wait."""

    def __init__(self, lanes: list[Lane], notice: Callable[[str], None] | None = None,
                 name: Callable[[Lane], str] = str):
        if not lanes:
            raise ValueError("no evaluation lanes")
        self.live = list(lanes)
        self.retired: dict[str, str] = {}
        """Retired lanes by name, with why."""
        self.notice = notice or (lambda message: None)
        self.name = name
        self.idle: list[Lane] = list(lanes)
        self.waiting: list[tuple[Hashable, asyncio.Future]] = []
        self.seen: dict[str, set[Hashable]] = {name(lane): set() for lane in lanes}

    def __len__(self) -> int:
        return len(self.live)

    async def run(self, job: Callable[[Lane], Awaitable[Any]], key: Hashable = None) -> Any:
        """Run `job` on a free lane (one that ran `key` before, if free); if it raises LaneFailed and
        another lane is in service, retire this one and run the job again elsewhere."""
        while True:
            lane = await self._acquire(key)
            self.seen[self.name(lane)].add(key)
            retired = False
            try:
                return await job(lane)
            except LaneFailed as failed:
                if len(self.live) == 1:
                    if isinstance(failed.result, BaseException):  # the job raised on the unfit device
                        raise failed.result
                    return failed.result
                self._retire(lane, failed.reason)
                retired = True
            finally:
                if not retired:
                    self._release(lane)

    async def _acquire(self, key: Hashable) -> Lane:
        if self.idle:
            lane = next((lane for lane in self.idle if key in self.seen[self.name(lane)]), self.idle[0])
            self.idle.remove(lane)
            return lane
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((key, future))
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # handed a lane just as it was cancelled
                self._release(future.result())
            raise

    def _release(self, lane: Lane) -> None:
        self.waiting = [(key, f) for key, f in self.waiting if not f.done()]
        if not self.waiting:
            self.idle.append(lane)
            return
        mine = self.seen[self.name(lane)]
        claimed = set().union(*(self.seen[self.name(other)] for other in self.live))
        index = next((i for i, (key, _) in enumerate(self.waiting) if key in mine),
                     next((i for i, (key, _) in enumerate(self.waiting) if key not in claimed), 0))
        _, future = self.waiting.pop(index)
        future.set_result(lane)

    def _retire(self, lane: Lane, reason: str) -> None:
        self.live.remove(lane)
        self.retired[self.name(lane)] = reason
        left = ", ".join(self.name(other) for other in self.live)
        self.notice(f"lane {self.name(lane)} taken out of service: {reason}; its attempts go to lane "
                    f"{left}")
