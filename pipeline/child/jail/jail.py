"""The jail: confinement the parent sets on a candidate's process before its interpreter starts.

    python -I -S jail.py POLICY_JSON STATUS_FD -- python -s -m pipeline.child.harness ...

sandbox.start runs this file (the standard library and its two neighbours landlock.py and
seccomp.py, loaded by path: no package, no site, no thread) as the first program of the child's
process. It sets, in this order, and then execs the real command in the same process:

1. a network namespace of its own (as root; else a user namespace with one), so no socket reaches
   the host's loopback or any other address, and abstract Unix sockets are the namespace's alone;
   as root also a mount namespace, where each of the policy's `masks` (/tmp, /dev/shm, a 0700 home
   on the way to Python) is a fresh tmpfs holding only the names beneath it the child needs, each
   the original mounted back in place: no other attempt's scratch, and a uid that could not cross
   /root can still run the Python that lives there;
2. Landlock rules (reads below the policy's read paths, writes below its write paths, the device
   nodes it names, no TCP, no signals out of the domain);
3. an unprivileged uid and gid with no supplementary groups (as root, where the policy names one);
4. death with the parent, then the seccomp filter (no setsid, no PDEATHSIG change, no affinity change).

Everything is inherited across exec and by every thread and process started after it, so no thread
of the candidate's process, not even one torch or the CUDA driver starts before the candidate is
imported, runs outside it. Why not a call in the harness: Landlock confines only the thread that
calls it, and by then `import torch` had started threads (issue 27).

Before the exec it writes one JSON line on STATUS_FD saying what held, and the descriptor closes at
exec: whatever the parent reads on it was written here, before any candidate code existed. A layer
the policy requires that cannot be set ends the process (status 126) instead of running unconfined.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV = 0x4000, 1 << 18, 0x2, 0x4
SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429  # the same on x86-64 and arm64
OPEN_TREE_CLONE, AT_RECURSIVE, MOVE_MOUNT_F_EMPTY_PATH = 1, 0x8000, 0x4
AT_FDCWD = -100
HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"kgen_jail_{name}", os.path.join(HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unshare_network(libc) -> str:
    """'netns' where the process got a network namespace of its own, else ''."""
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        return "netns" if libc.unshare(CLONE_NEWNET) == 0 else ""
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:  # unprivileged user namespaces are off
        return ""
    try:  # the same ids inside as outside: nothing gained but the namespaces
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError:
        return ""
    return "netns"


def _mask(libc, folder: str, mode: str, keep: list[str]) -> None:
    """A fresh tmpfs on `folder` holding only `keep` (names beneath it), each the original tree
    mounted back at its own path: the originals are taken as detached mounts (open_tree) before the
    tmpfs covers them, then moved into it."""
    libc.syscall.restype = ctypes.c_long
    trees = []
    for name in keep:
        fd = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, os.path.join(folder, name).encode(),
                          OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), f"open_tree {folder}/{name}")
        trees.append((name, fd))
    if libc.mount(b"tmpfs", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode}".encode()) != 0:
        raise OSError(ctypes.get_errno(), f"tmpfs on {folder}")
    for name, fd in trees:
        target = os.path.join(folder, name)
        os.mkdir(target)
        if libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH) != 0:
            raise OSError(ctypes.get_errno(), f"move_mount onto {target}")
        os.close(fd)


def confine(policy: dict) -> dict:
    """Apply `policy` to this process; what held, for the status line."""
    libc = ctypes.CDLL(None, use_errno=True)
    landlock, seccomp = _load("landlock"), _load("seccomp")  # before any rule or uid can refuse the files
    held: dict = {"pid": os.getpid()}
    held["netns"] = bool(policy.get("netns")) and _unshare_network(libc) == "netns"
    held["masked"] = []
    if policy.get("masks") and os.geteuid() == 0:
        if libc.unshare(CLONE_NEWNS) != 0 or libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "a mount namespace")
        for folder, mode, keep in policy["masks"]:
            _mask(libc, folder, mode, keep)
            held["masked"].append(folder)
    if os.geteuid() == 0 and policy.get("memlock"):
        # The outbox is page-locked for fast copies (protocol.Outbox.pin); nobody's limit is 8 MiB.
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        except (ValueError, OSError):  # no CAP_SYS_RESOURCE here: as much as the hard limit allows
            hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
    rules = [(path, kind) for path, kind in policy.get("rules", [])]
    # Its own entry (and its threads'), no other process's; "write" where a driver names its threads
    # through /proc/self/task/TID/comm.
    rules.append((f"/proc/{os.getpid()}", policy.get("own_proc", "read")))
    held["landlock_abi"] = landlock.abi_version()
    held["filesystem"] = bool(policy.get("landlock", True)) and landlock.restrict_rules(rules)
    uid = policy.get("uid")
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    held["uid"], held["gid"] = os.getuid(), os.getgid()
    seccomp.die_with_parent()  # after setuid, which clears the parent-death signal
    held["seccomp"] = seccomp.forbid_setsid()
    return held


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("[kgen] jail: usage: jail.py POLICY_JSON -- COMMAND...", file=sys.stderr)
        return 2
    policy = json.loads(argv[0])
    status_fd = int(argv[1])
    try:
        held = confine(policy)
    except Exception as exc:  # noqa: BLE001 - any failure means no candidate runs
        held = {"error": f"{type(exc).__name__}: {exc}"}
    missing = [name for name in policy.get("require", []) if not _holds(name, held, policy)]
    if missing or "error" in held:
        held["missing"] = missing
    os.write(status_fd, (json.dumps(held) + "\n").encode())
    os.close(status_fd)
    if missing or "error" in held:
        print(f"[kgen] jail: could not set {', '.join(missing) or held['error']}; the candidate does not run",
              file=sys.stderr, flush=True)
        return 126
    command = argv[3:]
    os.execv(command[0], command)
    return 127


def _holds(name: str, held: dict, policy: dict) -> bool:
    if name == "not_root":
        return held.get("uid") not in (None, 0)
    return bool(held.get(name))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
