"""What the parent confines a candidate's process to, set before any of its code runs, and what
the parent then checks for itself.

    policy = jail_policy(workdir, writable=[out_dir], extra_read=[headers])
    proc = zygote.fork(module, argv, env, cwd, policy, status_fd, ...)          # sandbox.start
    confinement = verified(pid, status_line, policy)                            # after the jail ran

The jail (pipeline/child/jail/jail.py) applies the policy in a fork of the zygote, before the
candidate's code is imported: a network namespace, a mount namespace where /tmp, /dev/shm and every folder that an
unprivileged uid could not cross are fresh and empty but for what the child needs, Landlock rules,
the uid `nobody`, the seccomp filter. Every thread torch or a driver starts afterwards inherits all
of it. The parent stores what it set, checked against /proc (uid, no new
privileges, seccomp, namespaces) and the jail's status line (written before any candidate code
existed); never the candidate's own report.

A child's workdir (sandbox.start) holds `tmp/` (its HOME, TMPDIR and cwd: the one place it writes,
owned by its uid), `job/` (what the parent stages for it: code, task file, built extension;
read-only) and `py/` (links to the packages it imports, so that the project folder, where the
database, generated code and builds live, is never a path it can read).
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
    # Never the working directory: `python -m` puts it first on sys.path, and a user's project folder,
    # its database included, is where kgen is run from (the red team read it through a build child).
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
        # What the child reads or writes under a scratch folder stays (its workdir; on the device
        # machine the carried packages in /tmp/site, or a checkout under /tmp); Landlock still
        # limits it to those paths.
        keep = [p for p in (*read, *write) if os.path.exists(p)]
        for scratch in SCRATCH_MASKS:
            if os.path.isdir(scratch) and not os.path.islink(scratch):
                inside = sorted({Path(p).relative_to(scratch).parts[0] for p in keep
                                 if Path(p).is_relative_to(scratch) and Path(p) != Path(scratch)})
                masks.append((scratch, "1777", inside))
        for folder, names in sorted(_blockers([*read, *write]).items(), key=lambda kv: len(kv[0])):
            masks.append((folder, "0711", sorted(names)))
    # On a GPU the CUDA driver opens a Unix socket as it starts (error 304 where socket(AF_UNIX) is
    # refused: bench/probe_room_cuda.py), so a GPU room may make one; what it can reach is what the
    # mount namespace leaves (/run, /tmp, /dev/shm empty) and a socket file nobody may write.
    # On a GPU its own /proc entry is writable: the CUDA driver writes there as it starts (and fails
    # with error 304 where it cannot); it is the process's own, and nothing there reaches another process.
    return {"rules": rules, "uid": uid, "room": True, "memlock": True, "masks": masks,
            "own_proc": "write" if gpu else "read", "unix_sockets": gpu, "cgroups": room.folders if room else [],
            "cgroup_expect": room.expected if room else [], "file_bytes": int(file_bytes),
            "home": str(workdir / "tmp") if uid is not None else None, "home_bytes": int(home_bytes),
            "require": [layer for layer in LAYERS if uid is not None or layer != "cgroup"]}


def verified(pid: int, status: dict | None, policy: dict | None) -> P.Confinement:
    """The confinement the parent set on the room whose outer process is `pid`, as far as it checks
    for itself, on the process that runs the command (the status line's host_pid, the child of the
    room's pid 1, itself the child of `pid`): the uid,
    no_new_privs and the seccomp filter from /proc/PID/status, each namespace by its inode against
    ours, the cgroups from /proc/PID/cgroup, the file-size limit from /proc/PID/limits; Landlock from
    the jail's status line (written before any candidate code ran). Nothing the child says."""
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
