"""The zygote (`python -s -m pipeline.child.zygote SOCKET_FD [MODULE ...]`): a trusted process with torch
and the harness imported and no device initialised, from which each child is forked (pipeline.sandbox.zygote
is the parent's side). It runs only kgen's code with a child's allow-listed environment; the candidates'
zygote imports nothing of the parent's side. A request (SOCK_SEQPACKET, JSON, descriptors attached) gets
{"pid": N} with the fork's pidfd, later {"exited": N, "code": C}; the pid stays unreaped until {"reap": N}.
End of file ends the zygote, and every room with it (parent-death signals).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib
import json
import os
import runpy
import select
import socket
import sys
import tempfile
import traceback

import torch  # noqa: F401 - the point of the zygote: imported once, shared by every fork

from . import harness  # noqa: F401 - and the harness's own imports
from . import protocol as P
from .jail import jail

def _code(pid: int) -> int | None:
    """The exit code of an exited child, Popen's way (minus the signal that killed it), leaving it unreaped."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _child(request: dict, fds: list[int], sock: socket.socket) -> None:
    """In the fork: the request's descriptors at the numbers it names, its session, folder and
    environment; then the jail, which calls the harness where it would have exec'd it. Never returns."""
    try:
        sock.close()
        targets = [int(t) for t in request["fds"]]
        floor = max([*targets, *fds, 2]) + 1  # above every target: no dup2 below overwrites one still needed
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in fds]
        jail.close_fds(set(high))
        for fd, target in zip(high, targets):
            os.dup2(fd, target, inheritable=target > 2)
        for fd in high:
            if fd not in targets:
                os.close(fd)
        os.setsid()
        os.chdir(request["cwd"])
        ours = set(os.environ.get("PYTHONPATH", "").split(os.pathsep))
        os.environ.clear()
        os.environ.update(request["env"])
        # The import roots an exec'd child would have had: its PYTHONPATH (the workdir's links) where ours was.
        sys.path[:] = [*request["env"].get("PYTHONPATH", "").split(os.pathsep), *(p for p in sys.path if p not in ours)]
        sys.path_importer_cache.clear()
        module, argv = request["module"], list(request["argv"])

        def run() -> None:  # as `python -m module argv...` would
            sys.argv = [module, *argv]
            # Preloaded for its imports; `-m` runs a fresh copy as __main__ (and runpy warned of the old one).
            sys.modules.pop(module, None)
            runpy.run_module(module, run_name="__main__", alter_sys=True)

        tempfile.tempdir = None  # found again from TMPDIR, the fork's own
        if request["policy"] is None:  # a trusted process of kgen's (the reference): no room
            code = jail.called(run)
        else:
            code = jail.enter(request["policy"], int(request["status_fd"]), run)
    except BaseException:  # noqa: BLE001 - whatever went wrong, the fork ends here and says why
        traceback.print_exc()
        code = 125
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


def _reap_orphans(ours: set[int]) -> None:
    """Reap every exited child not one of our forks: a room's first process, orphaned when the parent
    killed its outer process, comes to us (the child subreaper), not to the host's pid 1, which may reap
    it late or never."""
    for task in os.scandir("/proc/self/task"):
        try:
            with open(f"{task.path}/children") as f:
                children = [int(pid) for pid in f.read().split()]
        except OSError:
            continue
        for pid in children:
            if pid not in ours:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)


def serve(sock: socket.socket) -> int:
    """Fork a room per request until end of file or the parent's end of the socket closed (the parent
    ended: its Ctrl-C); report each fork's exit, reap it when told, and reap what the rooms orphan
    (_reap_orphans) at once."""
    try:
        return _serve(sock)
    except (BrokenPipeError, ConnectionResetError):
        return 0


def _serve(sock: socket.socket) -> int:
    pidfds: dict[int, int] = {}  # pidfd -> pid, of forks not yet reported exited
    ours: set[int] = set()  # forks not yet reaped
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    while True:
        _reap_orphans(ours)
        for fd, _ in poller.poll(100):  # ms: how soon an orphan is reaped when nothing else wakes us
            if fd != sock.fileno():
                poller.unregister(fd)
                pid = pidfds.pop(fd)
                os.close(fd)
                sock.send(json.dumps({"exited": pid, "code": _code(pid)}).encode())
                continue
            data, fds, _, _ = socket.recv_fds(sock, P.MAX_LINE, 16)  # a policy, an environment and argv: far below
            if not data:
                return 0
            request = json.loads(data)
            if "reap" in request:
                for fd in fds:
                    os.close(fd)
                ours.discard(int(request["reap"]))
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(request["reap"]), 0)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(request, fds, sock)
            for fd in fds:
                os.close(fd)
            ours.add(pid)
            pidfd = os.pidfd_open(pid)
            watched = os.dup(pidfd)
            pidfds[watched] = pid
            poller.register(watched, select.POLLIN)
            socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
            os.close(pidfd)


def _fork_poisoned() -> bool:
    """Whether a fork of this process would find CUDA unusable: torch marks a fork "bad" once the parent
    has called the CUDA runtime (as torch.cuda.is_available does without PYTORCH_NVML_BASED_CUDA_CHECK=1,
    and importing torch.utils.cpp_extension). Asked of a fork, as a child would."""
    pid = os.fork()
    if pid == 0:
        os._exit(3 if torch.cuda.is_initialized() or torch.cuda._is_in_bad_fork() else 0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0


def main(argv: list[str]) -> int:
    """argv: the socket's descriptor, then modules to import beside the harness (a zygote of kgen's
    trusted side names the reference's; the candidates' names none)."""
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)
    for name in argv[1:]:
        importlib.import_module(name)
    if _fork_poisoned():
        print("[kgen] zygote: an import asked the CUDA runtime about devices (torch.cuda.is_available without "
              "PYTORCH_NVML_BASED_CUDA_CHECK=1), and a fork of this process could not use CUDA; no child is "
              "forked from here", file=sys.stderr, flush=True)
        return 1
    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        print("[kgen] zygote: prctl(PR_SET_CHILD_SUBREAPER) refused", file=sys.stderr, flush=True)
        return 1
    sock = socket.socket(fileno=int(argv[0]))
    return serve(sock)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
