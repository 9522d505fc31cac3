"""What the parent confines a candidate's process to before any of its code runs (`jail_policy`,
applied by the jail in a fork of the zygote), and what it then checks for itself (`verified`: /proc and
the jail's status line, never the candidate's own report).

A child's workdir (sandbox.start) holds `tmp/` (its HOME, TMPDIR and cwd: the one place it writes),
`job/` (what the parent stages: code, task file, built extension; read-only) and `py/` (links to the
packages it imports, so the project folder, the database's, is never a path it can read).
"""

from __future__ import annotations

import glob
import os
import stat
import sys
from pathlib import Path

from ..child import PACKAGE_ROOT
from ..child import protocol as P
from ..child.jail import landlock
from ..child.jail.jail import children
from .cgroup import Room

NOBODY = 65534
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
# Folders every process may write that outlive an attempt, and /run, where host services keep their
# sockets: each child gets fresh, empty ones (but for what it needs beneath them).
SCRATCH_MASKS = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/var/run")
# The layers a room must have for a candidate to run in it, where we are root (pipeline.child.jail.jail
# refuses to start the command otherwise); without root, all but the cgroup, which needs root.
LAYERS = ("filesystem", "seccomp", "netns", "ipcns", "utsns", "pidns", "cgroup", "limits")


def enabled() -> bool:
    """KGEN_JAIL=0 turns the jail off (a debugging aid; such attempts are stored untrusted)."""
    return os.environ.get("KGEN_JAIL", "1") != "0"


def _traversable_by_others(path: str) -> bool:
    try:
        return bool(os.stat(path).st_mode & stat.S_IXOTH)
    except OSError:
        return True  # missing: nothing to expose


def _blockers(paths: list[str]) -> dict[str, set[str]]:
    """Folders on the way to `paths` that an unprivileged uid cannot cross (a 0700 /root holding
    pyenv's Python, say), each with the names beneath it that must stay reachable."""
    found: dict[str, set[str]] = {}
    for path in paths:
        parts = Path(path).parts
        for i in range(1, len(parts) - 1):
            folder = str(Path(*parts[:i + 1]))
            if not _traversable_by_others(folder):
                found.setdefault(folder, set()).add(parts[i + 1])
    return found


def _python_paths() -> tuple[str, ...]:
    """Python, its standard library and packages; never the project folder (the database's)."""
    project = os.path.abspath(PACKAGE_ROOT)
    # Never the working directory: `python -m` puts it first on sys.path, and kgen runs from the
    # user's project folder, its database included.
    cwd = os.path.abspath(os.getcwd())
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    for p in sys.path:
        q = os.path.abspath(p) if p else ""
        if q and os.path.isdir(q) and q not in (project, cwd) and not project.startswith(q + os.sep) \
                and not cwd.startswith(q + os.sep):
            paths.add(q)
    return tuple(sorted(paths))


def drop_to() -> int | None:
    """The uid children run as: nobody when we are root (the jail makes what they need reachable),
    else our own (no privilege to drop)."""
    return NOBODY if os.geteuid() == 0 else None


def jail_policy(workdir: Path, top_packages: list[str], writable: list[str] = (), extra_read: list[str] = (),
                gpu: bool = True, room: Room | None = None, file_bytes: int = 0, home_bytes: int = 0) -> dict:
    """The policy for a child whose workdir is `workdir` (sandbox.start lays it out). `writable`:
    folders it may write besides its tmp/ (a build's output folder, inside the workdir too);
    `extra_read`: folders it may read besides Python, the system and its workdir (the fast-build headers);
    `room`: the attempt's cgroups (pipeline.sandbox.cgroup), which the jail joins before it forks;
    `file_bytes`: the largest file it may write; `home_bytes`: the size of its HOME, a tmpfs."""
    # The system and /proc files a child may read (its own /proc entry the jail adds).
    read = [*landlock.SYSTEM_READ, *(f"/proc/{n}" for n in landlock.PROC_READ), *_python_paths(),
            *(str(Path(PACKAGE_ROOT) / top) for top in top_packages), str(workdir), *extra_read]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            read.append(os.environ[var])
    write = [str(workdir / "tmp"), *writable]
    devices = [*DEVICES, *(sorted(glob.glob("/dev/nvidia*")) if gpu else [])]
    rules = [(p, "read") for p in read] + [(p, "write") for p in write] + [(d, "device") for d in devices]
    rules.append(("/dev", "list"))
    uid = drop_to()
    masks: list[tuple[str, str, list[str]]] = []
    if uid is not None:  # root: a mount namespace of its own (the jail needs privilege for it)
        # What the child reads or writes under a scratch folder stays; Landlock still limits it to those paths.
        keep = [p for p in (*read, *write) if os.path.exists(p)]
        for scratch in SCRATCH_MASKS:
            if os.path.isdir(scratch) and not os.path.islink(scratch):
                inside = sorted({Path(p).relative_to(scratch).parts[0] for p in keep
                                 if Path(p).is_relative_to(scratch) and Path(p) != Path(scratch)})
                masks.append((scratch, "1777", inside))
        for folder, names in sorted(_blockers([*read, *write]).items(), key=lambda kv: len(kv[0])):
            masks.append((folder, "0711", sorted(names)))
    # The CUDA driver starts only where it may make a Unix socket and write its own /proc entry (else
    # error 304), so a GPU room may do both; the mount namespace leaves no host socket to reach.
    return {"rules": rules, "uid": uid, "room": True, "memlock": True, "masks": masks,
            "own_proc": "write" if gpu else "read", "unix_sockets": gpu, "cgroups": room.folders if room else [],
            "cgroup_expect": room.expected if room else [], "file_bytes": int(file_bytes),
            "home": str(workdir / "tmp") if uid is not None else None, "home_bytes": int(home_bytes),
            "require": [layer for layer in LAYERS if uid is not None or layer != "cgroup"]}


def verified(pid: int, status: dict | None, policy: dict | None) -> P.Confinement:
    """The confinement of the room whose outer process is `pid`, as the parent checks it on the command's
    process (the status line's host_pid, `pid`'s grandchild): uid, no_new_privs, seccomp, namespaces,
    cgroups and file-size limit from /proc; Landlock from the jail's status line. Nothing the child says."""
    if policy is None or not status or status.get("missing") or status.get("error"):
        return P.Confinement(set_by="parent", detail=f"jail: {status}" if status else "no jail")
    inner, init = status.get("host_pid"), status.get("init_pid")
    try:
        if not isinstance(init, int) or init not in children(pid) or not isinstance(inner, int) \
                or inner not in children(init):
            raise OSError(f"the room's processes {init!r}, {inner!r} are not the jail's")
        with open(f"/proc/{inner}/status") as f:
            fields = {key: value.strip() for key, _, value in (line.partition(":") for line in f)}
        ns = {name: os.readlink(f"/proc/{inner}/ns/{name}") != os.readlink(f"/proc/self/ns/{name}")
              for name in ("net", "ipc", "uts", "pid", "mnt")}
        with open(f"/proc/{inner}/limits") as f:
            fsize = next((line for line in f if line.startswith("Max file size")), "")
    except OSError as exc:
        return P.Confinement(set_by="parent", detail=f"the child could not be checked: {exc}")
    uid = int(fields.get("Uid", "-1").split()[0])
    seccomp = fields.get("Seccomp") == "2" and fields.get("NoNewPrivs") == "1"
    abi = int(status.get("landlock_abi", 0))
    filesystem = bool(status.get("filesystem"))
    cgroup = bool(policy.get("cgroups")) and Room(policy["cgroups"], [tuple(e) for e in policy["cgroup_expect"]]).holds(inner)
    limits = bool(policy.get("file_bytes")) and str(policy["file_bytes"]) in fsize.split()
    return P.Confinement(landlock_abi=abi if filesystem else 0, filesystem=filesystem,
                         network=ns["net"] or (filesystem and abi >= 4), signals=filesystem and abi >= 6,
                         seccomp=seccomp, private_tmp=filesystem, uid=uid, before_exec=filesystem and seccomp,
                         netns=ns["net"], pidns=ns["pid"], ipcns=ns["ipc"], utsns=ns["uts"], cgroup=cgroup,
                         limits=limits, masked=list(status.get("masked", [])), set_by="parent")
