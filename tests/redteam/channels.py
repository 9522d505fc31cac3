"""Probe: the channels the jail leaves open (tests/test_room.py's hole 3), from the build child (at
import) and from the evaluation child (inside the first forward call).

Each probe prints one line, `KGEN-NOTE chan NAME ROLE STATUS DETAIL`: ROLE is `b` (build) or `e`
(evaluation); STATUS is `open` (the channel worked), `found` (it found what an earlier attempt or
child left: a channel across attempts) or `denied` (refused; DETAIL names the errno or the limit).
The channels:
- unix: connect() to each pathname Unix socket in SOCKETS (the test listens there, under the host's
  /run and under the project folder) and send the TAG;
- shm, msg, sem: a System V segment, message queue and semaphore set with keys KEY, KEY+1, KEY+2
  (`found` where one already exists; left behind on purpose for the next attempt to find);
- keyring: a `user` key named kgen-TAG in the user keyring (add_key, keyctl search) that the next
  attempt of the same uid could read;
- userns_unshare, userns_clone: a new user namespace, by unshare and by clone (in a forked child);
- io_uring: io_uring_setup;
- fsize: one byte written at 3 GiB into a sparse file in HOME (no real disk), then removed;
- nproc: up to NPROC blocked subshells of /bin/sh, then all ended (the pipe they read closes, their
  group is killed): open where every one started, denied with the count where a fork was refused
  (the shell's, or, once its count stalls for STALL_S, one of the probe's own), unfinished where the
  deadline came first with nothing refused.
The forward is torch's own mse, so a verdict exists (correct, flagged no_custom_kernel).

Why each should be closed: one room per attempt (its own IPC namespace and mount namespace with no
host socket or /run; seccomp refusing new user namespaces, io_uring and keyrings; limits on file
size and processes)."""
from torch.utils.cpp_extension import load_inline  # noqa: F401,E402 (names an extension: a build child imports it too)
import ctypes
import errno
import os
import signal
import socket
import sys
import time

import torch
import torch.nn as nn

TAG = "__KGEN_TAG__"
SOCKETS = "__KGEN_SOCKETS__"  # colon-separated paths
KEY = int("".join(c for c in TAG if c in "0123456789abcdef")[:7] or "4b67", 16) | 0x20000000
NPROC = 10000
NPROC_S = 25.0
# A stall only asks whether the probe may fork at all: where it may, the count goes on (and a
# fork refused is the only `denied` that a stall can give), so a short wait costs nothing but a fork.
STALL_S = 1.0
ROLE = "b" if "build" in sys.argv[1:] else "e"  # the harness runs as `... --result-fd N build|eval`

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
IPC_CREAT, IPC_EXCL = 0o1000, 0o2000
CLONE_NEWUSER = 0x10000000


def _note(name, status, detail=""):
    print(f"KGEN-NOTE chan {name} {ROLE} {status} {detail}".rstrip(), flush=True)


def _err(e=None):
    e = ctypes.get_errno() if e is None else e
    return errno.errorcode.get(e, str(e))


def _unix():
    for path in [p for p in SOCKETS.split(":") if p and not p.startswith("__")]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(path)
            s.sendall(f"{TAG} {ROLE}\n".encode())
            _note("unix", "open", path)
        except OSError as exc:
            _note("unix", "denied", f"{path} {_err(exc.errno or 0)}")
        finally:
            s.close()


def _sysv():
    for name, key, get in (("shm", KEY, lambda k, f: _libc.shmget(k, 4096, f | 0o666)),
                           ("msg", KEY + 1, lambda k, f: _libc.msgget(k, f | 0o666)),
                           ("sem", KEY + 2, lambda k, f: _libc.semget(k, 1, f | 0o666))):
        found = get(key, 0)
        if found >= 0:
            _note(name, "found", f"{key:#x} id {found}")
            continue
        made = get(key, IPC_CREAT | IPC_EXCL)
        _note(name, "open", f"{key:#x} id {made}") if made >= 0 else _note(name, "denied", f"{key:#x} {_err()}")


def _keyring():
    desc = f"kgen-{TAG}".encode()
    found = _libc.syscall(250, 10, ctypes.c_long(-4), b"user", desc, 0)  # keyctl(KEYCTL_SEARCH, user keyring)
    if found >= 0:
        _note("keyring", "found", str(found))
        return
    payload = f"{TAG} {ROLE}".encode()
    added = _libc.syscall(248, b"user", desc, payload, len(payload), ctypes.c_long(-4))  # add_key
    _note("keyring", "open", str(added)) if added >= 0 else _note("keyring", "denied", _err())


def _in_child(action):
    """Run `action` (returns 0 or an errno) in a forked child; its status back."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(action() & 0xFF)
        finally:
            os._exit(255)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _userns():
    def by_unshare():
        return 0 if _libc.unshare(CLONE_NEWUSER) == 0 else ctypes.get_errno()

    code = _in_child(by_unshare)
    _note("userns_unshare", "open" if code == 0 else "denied", _err(code) if code else "")
    # clone(CLONE_NEWUSER | SIGCHLD) with no new stack: the child returns like fork's and exits at once.
    pid = _libc.syscall(56, ctypes.c_long(CLONE_NEWUSER | signal.SIGCHLD), None, None, None, None)
    if pid == 0:
        os._exit(0)
    if pid < 0:
        _note("userns_clone", "denied", _err())
        return
    os.waitpid(pid, 0)
    _note("userns_clone", "open", str(pid))


def _io_uring():
    params = ctypes.create_string_buffer(120)
    fd = _libc.syscall(425, 4, params)
    if fd >= 0:
        os.close(fd)
        _note("io_uring", "open", f"fd {fd}")
    else:
        _note("io_uring", "denied", _err())


def _fsize():
    path = os.path.join(os.environ.get("HOME", "/tmp"), f"kgen-big-{TAG}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        _note("fsize", "denied", f"open {_err(exc.errno)}")
        return
    try:
        os.lseek(fd, 3 << 30, os.SEEK_SET)
        os.write(fd, b"x")
        _note("fsize", "open", str(os.fstat(fd).st_size))
    except OSError as exc:
        _note("fsize", "denied", _err(exc.errno))
    finally:
        os.close(fd)
        os.unlink(path)


def _nproc():
    # /bin/sh starts NPROC subshells, each blocked reading a pipe the probe holds (no exec, no busy
    # loop: a few hundred microseconds a fork), and prints its count every hundred. A refused fork
    # ends the shell early (dash's "Cannot fork"): denied. When the probe closes the pipe every
    # reader exits; the group is killed besides.
    # Each subshell's stdout is /dev/null: only the counting shell holds the pipe, so its end (a
    # fork refused) is the pipe's end.
    script = ("n=0; while [ $n -lt %d ]; do read x <&3 >/dev/null 2>&1 & n=$((n+1)); "
              "[ $((n %% 100)) -eq 0 ] && echo $n; done; echo $n; echo done" % NPROC)
    r, w = os.pipe()
    hold_r, hold_w = os.pipe()
    try:
        pid = os.posix_spawn("/bin/sh", ["sh", "-c", script], {"PATH": "/usr/bin:/bin"},
                             file_actions=[(os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_CLOSE, r),
                                           (os.POSIX_SPAWN_DUP2, hold_r, 3), (os.POSIX_SPAWN_CLOSE, hold_w)],
                             setpgroup=0)
    except OSError as exc:
        for fd in (r, w, hold_r, hold_w):
            os.close(fd)
        _note("nproc", "denied", f"spawn {_err(exc.errno)}")
        return
    os.close(w)
    os.close(hold_r)
    count, ended, done, buf, end = 0, False, False, b"", time.monotonic() + NPROC_S
    refused, moved = None, time.monotonic()
    os.set_blocking(r, False)
    while time.monotonic() < end and not done:
        try:
            chunk = os.read(r, 4096)
        except BlockingIOError:
            if time.monotonic() - moved > STALL_S and refused is None:  # the count stalled: may we fork at all?
                try:
                    child = os.fork()
                except OSError as exc:
                    refused = _err(exc.errno)
                    break
                if child == 0:
                    os._exit(0)
                os.waitpid(child, 0)
                moved = time.monotonic()
            time.sleep(0.02)
            continue
        if not chunk:
            ended = True  # the shell is gone: a fork it could not make ended it
            break
        buf += chunk
        for line in buf.split(b"\n")[:-1]:
            if line == b"done":
                done = True
            elif line.isdigit():
                count, moved = int(line), time.monotonic()
        buf = buf.rsplit(b"\n", 1)[-1]
    os.close(hold_w)  # every reader reads end of file and exits
    try:
        os.killpg(pid, signal.SIGKILL)  # and the group goes, whatever is left of it
    except OSError:
        pass
    os.waitpid(pid, 0)
    os.close(r)
    if count >= NPROC:
        _note("nproc", "open", f"{count} of {NPROC}")
    elif ended or refused:
        _note("nproc", "denied", f"{count} of {NPROC}" + (f", then a fork of ours: {refused}" if refused else ""))
    else:  # still forking at the deadline: nothing refused it
        _note("nproc", "unfinished", f"{count} of {NPROC} in {NPROC_S:g} s")


def probe():
    for check in (_unix, _sysv, _keyring, _userns, _io_uring, _fsize, _nproc):
        try:
            check()
        except Exception as exc:  # noqa: BLE001 - a probe that breaks is a finding, not the end
            _note(check.__name__.lstrip("_"), "denied", f"raised {type(exc).__name__}: {exc}"[:120])


if ROLE == "b":
    probe()
_probed = [ROLE == "b"]


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        if not _probed[0]:
            _probed[0] = True
            probe()
        return torch.mean((predictions - targets) ** 2)
