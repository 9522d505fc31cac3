"""Candidate children started before they are needed (Spares), so an attempt does not wait for Python,
torch, CUDA and the profiler to start."""

from __future__ import annotations

import threading
import time
from typing import Any

from ..policy import POLICY
from . import Child, Jail, pin_all, start


class Spares:
    """Children started ahead, per environment (a GPU lane's); each runs no candidate code until taken
    and serves one attempt. With `cores` (cores no lane times on) up to `depth` start and initialise
    the device there at once, and one taken moves onto the lane's cores (KGEN_CORES); without, one
    waits with torch loaded, touching no device until `release`. `refill` false: a take starts no next
    (docs/decisions/spares-and-startup.md)."""

    def __init__(self, module: str, args: list[str], outbox: int | None = POLICY.outbox_bytes, refill: bool = True,
                 cores: str | None = None, depth: int = 2, jail: Jail | None = Jail()):
        self.module, self.args, self.outbox, self.refill, self.jail = module, args, outbox, refill, jail
        self.cores = cores or None
        self.depth = max(1, depth) if self.cores and refill else 1
        # Per environment, oldest first: [child, the Init still to send (None once sent)].
        self._waiting: dict[frozenset, list[list[Any]]] = {}
        self._lock = threading.Lock()

    def spawn(self, env: dict[str, str], init: dict[str, Any]) -> None:
        """Start spares for `env` until `depth` wait."""
        key = frozenset(env.items())
        with self._lock:
            queue = self._waiting.setdefault(key, [])
            while len(queue) < self.depth:
                if self.cores:
                    child = start(self.module, self.args, 24 * 3600, {**env, "KGEN_CORES": self.cores}, self.outbox,
                                  self.jail)
                    child.send(init)
                    queue.append([child, None])
                else:
                    queue.append([start(self.module, self.args, 24 * 3600, env, self.outbox, self.jail), init])

    def release(self, env: dict[str, str]) -> None:
        """Let the oldest waiting spare for `env` initialise its device now (those started ahead on
        their own cores already have)."""
        with self._lock:
            queue = self._waiting.get(frozenset(env.items())) or []
            entry = queue[0] if queue else None
            init = entry[1] if entry else None
            if entry is not None:
                entry[1] = None
        if init is not None:
            entry[0].send(init)

    def take(self, env: dict[str, str], timeout: float) -> Child | None:
        """The oldest spare for `env`, released, on the lane's cores and with a fresh deadline, or None."""
        self.release(env)
        with self._lock:
            queue = self._waiting.get(frozenset(env.items())) or []
            entry = queue.pop(0) if queue else None
        if entry is None:
            return None
        child = entry[0]
        if child.proc.poll() is not None:  # it died waiting (killed, out of memory): start afresh
            child.finish(grace=0.1)
            return None
        if self.cores:
            pin_all(child.pid, env.get("KGEN_CORES"))
        child.started = time.monotonic()
        child.deadline = child.started + timeout
        return child

    def close(self) -> None:
        with self._lock:
            waiting, self._waiting = [entry for queue in self._waiting.values() for entry in queue], {}
        for child, _ in waiting:
            child.kill()
            child.finish(grace=0.1)
