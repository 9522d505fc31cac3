"""One `kgen run` per database at a time: an advisory lock on a file beside the database.

    with RunLock(Path("db/kgen.db")) as lock:   # RunBusy (one line naming the other run) if one holds it
        lock.note(run_id)                       # what a second `kgen run` is told: this pid and run

Two runs on one database would each do every slot of the same plan (a resume reads what is stored,
not what another process is doing), so the second is refused. The lock is fcntl.flock on
`<database>.run.lock`: the kernel drops it when the process ends, however it ends (Ctrl-C, SIGKILL,
os._exit), so a stale file never blocks a later run. The file holds the holder's pid and, once it
has one, its run id, for the refusal's line.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path


class RunBusy(Exception):
    """Another process holds the database's run lock: one line naming it."""


def lock_path(db: Path) -> Path:
    return db.with_name(db.name + ".run.lock")


class RunLock:
    def __init__(self, db: Path):
        self.db, self.path = db, lock_path(db)
        self.fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # a folder we cannot write: no run can store there, and opening the store says so
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            who = f"pid {holder.get('pid', '?')}" + (f", run {holder['run']}" if holder.get("run") else "")
            raise RunBusy(f"another `kgen run` ({who}) is running on {self.db}: a second would do its work again; "
                          "wait for it to end, or pass --force to run beside it") from None
        self.fd = fd
        self.note(None)

    def note(self, run_id: str | None) -> None:
        """Write this process's pid and run id into the lock file (what a refused run is told)."""
        if self.fd is None:
            return
        data = json.dumps({"pid": os.getpid(), "run": run_id}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}
