"""The jail: confinement the parent sets on a candidate's process before any candidate code runs.
`enter(policy, status_fd, run)`, in a one-thread fork of the zygote, makes the room in three processes:
the outer (held by the parent's pidfd) joins the cgroups and unshares the namespaces; pid 1 of the new
pid namespace mounts, and when it ends the kernel ends all left in the room; the third sets limits,
Landlock, uid and seccomp, then calls `run`. Each layer is set on a one-thread process, so every later
thread inherits it. The status line is written before any candidate code exists; a required layer that
cannot be set ends the process (status 126) instead of running unconfined.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import importlib.util
import json
import os
import resource
import signal
import sys
from typing import Callable

class Clone(enum.IntFlag):
    """Namespace flags of clone(2) and unshare(2)."""
    NEWNS = 0x00020000
    NEWUTS = 0x04000000
    NEWIPC = 0x08000000
    NEWUSER = 0x10000000
    NEWPID = 0x20000000
    NEWNET = 0x40000000
    ROOM = NEWNET | NEWIPC | NEWUTS | NEWPID  # the room's own namespaces (its mounts: pid 1's, as root)


class Mount(enum.IntFlag):
    """Flags of mount(2) (MS_*)."""
    NOSUID = 0x2
    NODEV = 0x4
    NOEXEC = 0x8
    REC = 0x4000
    PRIVATE = 1 << 18


class MountApi(enum.IntEnum):
    """open_tree(2) and move_mount(2): their numbers (the same on x86-64 and arm64) and the values passed."""
    SYS_OPEN_TREE = 428
    SYS_MOVE_MOUNT = 429
    OPEN_TREE_CLONE = 1
    AT_RECURSIVE = 0x8000
    MOVE_MOUNT_F_EMPTY_PATH = 0x4
    AT_FDCWD = -100


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"kgen_jail_{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unshare_room(libc) -> bool:
    """Network, IPC, UTS and pid namespaces of its own (the pid one for the next process forked):
    as root directly, else inside a user namespace that maps our own ids and nothing more."""
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        return libc.unshare(Clone.ROOM) == 0
    if libc.unshare(Clone.NEWUSER | Clone.ROOM) != 0:  # unprivileged user namespaces are off
        return False
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError:
        return False
    return True


def _mask(libc, folder: str, mode: str, keep: list[str]) -> None:
    """A fresh tmpfs on `folder` holding only `keep` (names beneath it), each the original tree
    mounted back at its own path: the originals are taken as detached mounts (open_tree) before the
    tmpfs covers them, then moved into it."""
    libc.syscall.restype = ctypes.c_long
    trees = []
    for name in keep:
        fd = libc.syscall(MountApi.SYS_OPEN_TREE, MountApi.AT_FDCWD, os.path.join(folder, name).encode(),
                          MountApi.OPEN_TREE_CLONE | MountApi.AT_RECURSIVE | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), f"open_tree {folder}/{name}")
        trees.append((name, fd))
    if libc.mount(b"tmpfs", folder.encode(), b"tmpfs", Mount.NOSUID | Mount.NODEV, f"mode={mode}".encode()) != 0:
        raise OSError(ctypes.get_errno(), f"tmpfs on {folder}")
    for name, fd in trees:
        target = os.path.join(folder, name)
        os.mkdir(target)
        if libc.syscall(MountApi.SYS_MOVE_MOUNT, fd, b"", MountApi.AT_FDCWD, target.encode(),
                        MountApi.MOVE_MOUNT_F_EMPTY_PATH) != 0:
            raise OSError(ctypes.get_errno(), f"move_mount onto {target}")
        os.close(fd)


def enter_room(policy: dict) -> dict:
    """In the outer process: the cgroups, then the namespaces. What held, for the status line."""
    libc = ctypes.CDLL(None, use_errno=True)
    held: dict = {"cgroup": False}
    cores = os.environ.get("KGEN_CORES", "")
    if cores:  # before the fork, so every process of the room starts on them (seccomp forbids moving)
        with contextlib.suppress(ValueError, OSError):  # cores this machine lacks
            os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    if policy.get("cgroups"):
        try:
            for folder in policy["cgroups"]:
                with open(os.path.join(folder, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
            held["cgroup"] = True
        except OSError as exc:
            held["cgroup_error"] = f"{exc}"
    room = bool(policy.get("room", True)) and _unshare_room(libc)
    for name in ("netns", "ipcns", "utsns", "pidns"):
        held[name] = room
    return held


def mount_room(policy: dict, held: dict) -> dict:
    """In pid 1 of the room, as root: its mount namespace (its own /proc, the masks, HOME a tmpfs)."""
    libc = ctypes.CDLL(None, use_errno=True)
    held["masked"] = []
    held["own_proc"] = False
    if policy.get("masks") and os.geteuid() == 0 and held.get("pidns"):
        if libc.unshare(Clone.NEWNS) != 0 or libc.mount(b"none", b"/", None, Mount.REC | Mount.PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "a mount namespace")
        if policy.get("own_proc_mount", True):  # /proc of this pid namespace: no host process is listed
            if libc.mount(b"proc", b"/proc", b"proc", Mount.NOSUID | Mount.NODEV | Mount.NOEXEC, None) != 0:
                raise OSError(ctypes.get_errno(), "a /proc of its own")
            held["own_proc"] = True
        for folder, mode, keep in policy["masks"]:
            _mask(libc, folder, mode, keep)
            held["masked"].append(folder)
        if policy.get("home") and policy.get("home_bytes"):
            opts = f"mode=0700,size={int(policy['home_bytes'])},uid={policy.get('uid') or 0},gid={policy.get('uid') or 0}"
            if libc.mount(b"tmpfs", policy["home"].encode(), b"tmpfs", Mount.NOSUID | Mount.NODEV, opts.encode()) != 0:
                raise OSError(ctypes.get_errno(), f"tmpfs on {policy['home']}")
            held["home_tmpfs"] = True
    return held


def confine(policy: dict, held: dict) -> dict:
    """In the room's command process, before `run`: limits, Landlock, the uid, the
    seccomp filter. What held, for the status line."""
    landlock, seccomp = _load("landlock"), _load("seccomp")  # before any rule or uid can refuse the files
    if held.get("home_tmpfs"):
        os.chdir(policy["home"])  # the cwd was the folder beneath the tmpfs
    if os.geteuid() == 0 and policy.get("memlock"):
        # The outbox is page-locked for fast copies (protocol.Outbox.pin); nobody's limit is 8 MiB.
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        except (ValueError, OSError):  # no CAP_SYS_RESOURCE here: as much as the hard limit allows
            hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if policy.get("file_bytes"):
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(policy["file_bytes"]), int(policy["file_bytes"])))
        held["limits"] = True
    rules = [(path, kind) for path, kind in policy.get("rules", [])]
    # Its own entry (and its threads'), no other process's; "write" where a driver names its threads
    # through /proc/self/task/TID/comm. /proc/self names it as the mounted /proc counts pids.
    rules.append((f"/proc/{os.readlink('/proc/self')}", policy.get("own_proc", "read")))
    held["landlock_abi"] = landlock.abi_version()
    held["filesystem"] = bool(policy.get("landlock", True)) and landlock.restrict_rules(rules)
    uid = policy.get("uid")
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    held["uid"], held["gid"] = os.getuid(), os.getgid()
    seccomp.die_with_parent()  # after setuid, which clears the parent-death signal
    held["seccomp"] = seccomp.install_filter(unix=bool(policy.get("unix_sockets")))
    return held


# How to allow a layer a host refused, for the one line that says the candidate does not run.
HOW = {
    "netns": "run as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; "
             "in a container: --security-opt seccomp=unconfined or a runtime that allows them)",
    "pidns": "as for netns", "ipcns": "as for netns", "utsns": "as for netns",
    "cgroup": "run as root on a host with cgroup v2 (or v1) pids and memory controllers mounted under /sys/fs/cgroup",
    "filesystem": "a kernel with Landlock (Linux 5.13+, lsm=landlock in the boot parameters)",
    "seccomp": "a kernel with seccomp filters (x86-64 or arm64)",
    "limits": "a policy with file_bytes set",
}


def enter(policy: dict, status_fd: int, run: Callable[[], int | None]) -> int:
    """Make the room, report on `status_fd`, call `run` confined in its last process; return its exit
    code (minus the signal that ended it)."""
    _load("seccomp").die_with_parent()
    try:
        held = enter_room(policy)
    except Exception as exc:  # noqa: BLE001 - any failure means no candidate runs
        held = {"error": f"{type(exc).__name__}: {exc}"}
    relay_r, relay_w = os.pipe()
    exit_r, exit_w = os.pipe()
    init = os.fork()
    if init == 0:  # pid 1 of the room
        os.close(relay_r)
        os.close(exit_r)
        _init(policy, held, relay_w, exit_w, status_fd, run)
    os.close(relay_w)
    os.close(exit_w)
    status = _read_status(relay_r)
    kids = children(init)
    status["init_pid"], status["host_pid"] = init, kids[0] if len(kids) == 1 else None
    with contextlib.suppress(OSError):
        status["pidns_inode"] = os.stat(f"/proc/{init}/ns/pid").st_ino
    os.write(status_fd, (json.dumps(status) + "\n").encode())
    os.close(status_fd)
    _, code = os.waitpid(init, 0)
    told = os.read(exit_r, 64).decode()
    code = int(told) if told.strip().lstrip("-").isdigit() else code  # the command's own wait status
    if os.WIFSIGNALED(code):  # exit the way it did, so the parent reads the same status
        signal.signal(os.WTERMSIG(code), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(code))
    return os.waitstatus_to_exitcode(code)


def _read_status(fd: int) -> dict:
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        line += chunk
    os.close(fd)
    try:
        return json.loads(line) if line else {"error": "the room's first process died before it reported"}
    except ValueError:
        return {"error": "the room's first process wrote no status"}


def children(pid: int) -> list[int]:
    """The pids `pid`'s main thread started (the room's checks from outside, pipeline/sandbox/confine.py, too)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _init(policy: dict, held: dict, relay_w: int, exit_w: int, status_fd: int, run: Callable[[], int | None]) -> None:
    """pid 1 of the room: its mounts, then the command's process, whose wait status it passes to the
    outer on `exit_w` before it ends (ending the room), reaping orphans meanwhile. No signal from inside
    the room reaches it (pid 1 of its namespace gets none it has no handler for, nor any of another uid)."""
    os.close(status_fd)
    if "error" not in held:
        try:
            held = mount_room(policy, held)
        except Exception as exc:  # noqa: BLE001 - any failure means no candidate runs
            held = {**held, "error": f"{type(exc).__name__}: {exc}"}
    _load("seccomp").die_with_parent()
    child = os.fork()
    if child == 0:
        os.close(exit_w)
        _run(policy, held, relay_w, run)
    os.close(relay_w)
    close_fds({exit_w})
    while True:
        try:
            pid, code = os.wait()
        except ChildProcessError:
            os._exit(0)
        if pid == child:
            os.write(exit_w, str(code).encode())
            os._exit(0)


def close_fds(keep: set[int]) -> None:
    """Close every descriptor of this process above stderr but those in `keep` (the zygote's forks too)."""
    for fd in [int(fd) for fd in os.listdir("/proc/self/fd") if fd.isdigit()]:
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
                os.close(fd)


def _run(policy: dict, held: dict, relay_w: int, run: Callable[[], int | None]) -> None:
    """The room's command process: confined, it reports what held and calls `run`."""
    if "error" not in held:
        try:
            held = confine(policy, held)
        except Exception as exc:  # noqa: BLE001 - any failure means no candidate runs
            held = {**held, "error": f"{type(exc).__name__}: {exc}"}
    missing = [name for name in policy.get("require", []) if not _holds(name, held, policy)]
    if missing or "error" in held:
        held["missing"] = missing
    os.write(relay_w, (json.dumps(held) + "\n").encode())
    os.close(relay_w)
    if missing or "error" in held:
        why = "; ".join(f"no {name}: {HOW.get(name, 'see kgen doctor')}" for name in missing) or held["error"]
        print(f"[kgen] jail: {why}; the candidate does not run", file=sys.stderr, flush=True)
        os._exit(126)
    os._exit(called(run))


def called(run: Callable[[], int | None]) -> int:
    """`run`'s exit code, as an interpreter would end on it: its return value, its SystemExit, or 1 and
    the traceback on stderr for any other exception; output flushed."""
    try:
        code = run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - as an interpreter ends on an uncaught exception
        import traceback
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code or 0


def _holds(name: str, held: dict, policy: dict) -> bool:
    if name == "not_root":
        return held.get("uid") not in (None, 0)
    return bool(held.get(name))

