"""An attempt's cgroup: a limit on its processes (threads count) and its memory, made by the parent
before the room starts (`make`; the jail joins `Room.folders` before it forks) and removed once the
room is gone (`Room.remove`). cgroup v2 where its pids and memory controllers can be enabled, else v1's;
only as root. The parent reads a process's cgroup for itself from /proc/PID/cgroup (`Room.holds`).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PARENT = "kgen"  # every room's cgroup sits under this one


@dataclass(frozen=True)
class Room:
    folders: list[str]
    """The cgroup folders a process of the room joins (one for v2, one per controller for v1)."""
    expected: list[tuple[str, str]]
    """What /proc/PID/cgroup says for a member: (controller, path); controller "" for v2."""

    def holds(self, pid: int) -> bool:
        """Whether process `pid` is in every one of the room's cgroups."""
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                lines = [line.rstrip("\n").split(":", 2) for line in f]
        except OSError:
            return False
        have = {(c, path) for _, controllers, path in lines for c in (controllers.split(",") if controllers else [""])}
        return all(want in have for want in self.expected)

    def members(self) -> list[int]:
        """Pids in the room's cgroups (as this pid namespace numbers them)."""
        pids: set[int] = set()
        for folder in self.folders:
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in Path(folder, "cgroup.procs").read_text().split())
        return sorted(pids)

    def remove(self, wait: float = 2.0) -> bool:
        """Remove the room's cgroups once they hold no process; False where one stayed (it is left,
        holding what is in it, for `kgen doctor` and the operator to see)."""
        end = time.monotonic() + wait
        left = list(self.folders)
        while left:
            for folder in list(left):
                try:
                    os.rmdir(folder)
                    left.remove(folder)
                except FileNotFoundError:
                    left.remove(folder)
                except OSError:
                    pass
            if left and time.monotonic() > end:
                return False
            if left:
                time.sleep(0.01)
        return True


def _v2_ready() -> bool:
    """cgroup v2 at /sys/fs/cgroup with the pids and memory controllers enabled for our folder."""
    try:
        have = set((ROOT / "cgroup.controllers").read_text().split())
    except OSError:
        return False
    if not {"pids", "memory"} <= have:
        return False
    try:
        (ROOT / PARENT).mkdir(exist_ok=True)
        if not {"pids", "memory"} <= set((ROOT / "cgroup.subtree_control").read_text().split()):
            (ROOT / "cgroup.subtree_control").write_text("+pids +memory")
        (ROOT / PARENT / "cgroup.subtree_control").write_text("+pids +memory")
        return True
    except OSError:
        return False


def _v1_ready() -> bool:
    return all((ROOT / c / "cgroup.procs").exists() for c in ("pids", "memory"))


def _sweep(parent: Path, workdirs: Path) -> None:
    """Remove the empty cgroups killed kgens left: those whose maker (the pid after the name's last dot)
    has exited or, for a name without one, whose workdir (`workdirs`/NAME) is gone. rmdir refuses a
    cgroup that still holds a process."""
    try:
        names = [entry.name for entry in os.scandir(parent) if entry.is_dir() and entry.name.startswith("kgen-child-")]
    except OSError:
        return
    for name in names:
        _, _, maker = name.rpartition(".")
        if maker.isdigit() and _alive(int(maker)) or not maker.isdigit() and (workdirs / name).exists():
            continue
        with contextlib.suppress(OSError):
            os.rmdir(parent / name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def make(name: str, pids: int, memory_bytes: int, workdirs: Path | None = None) -> Room | None:
    """A room's cgroups with these limits, or None where this host does not let us make them
    (not root, or neither v2 nor v1 pids and memory controllers). `workdirs`: where rooms' workdirs
    live, for sweeping what killed runs left."""
    if os.geteuid() != 0:
        return None
    if workdirs is not None:
        for parent in (ROOT / PARENT, ROOT / "pids" / PARENT, ROOT / "memory" / PARENT):
            _sweep(parent, workdirs)
    name = f"{name}.{os.getpid()}"  # its maker, for `_sweep`
    try:
        if _v2_ready():
            folder = ROOT / PARENT / name
            folder.mkdir()
            (folder / "pids.max").write_text(str(pids))
            (folder / "memory.max").write_text(str(memory_bytes))
            with contextlib.suppress(OSError):
                (folder / "memory.swap.max").write_text("0")
            return Room([str(folder)], [("", f"/{PARENT}/{name}")])
        if _v1_ready():
            folders = []
            for controller, limits in (("pids", {"pids.max": pids}),
                                       ("memory", {"memory.limit_in_bytes": memory_bytes})):
                folder = ROOT / controller / PARENT / name
                folder.mkdir(parents=True)
                folders.append(str(folder))
                for key, value in limits.items():
                    (folder / key).write_text(str(value))
            return Room(folders, [("pids", f"/{PARENT}/{name}"), ("memory", f"/{PARENT}/{name}")])
    except OSError:
        return None
    return None


def available() -> str | None:
    """Which cgroup version rooms would use here ("v2", "v1"), or None."""
    if os.geteuid() != 0:
        return None
    return "v2" if _v2_ready() else "v1" if _v1_ready() else None
