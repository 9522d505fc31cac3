"""The parent's side of the zygote (pipeline.child.zygote): one trusted process per kgen process, with
torch and the harness imported, from which each jailed child is forked instead of paying a fresh `import torch`.

`Zygote.fork` returns a Popen-like `Forked`: the room's outer process, the zygote's child, not ours. We
hold its pidfd, so our signals reach it alone, and the zygote leaves it unreaped until `wait` has read
its status, so its pid names nothing else while we look at /proc.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO

from ..child import PACKAGE_ROOT

MODULE = "pipeline.child.zygote"


class Forked:
    """A room's outer process, forked by the zygote: what Child needs of a Popen."""

    def __init__(self, zygote: Zygote, pid: int, pidfd: int, stdin_fd: int):
        self.zygote, self.pid, self.pidfd = zygote, pid, pidfd
        self.stdin: IO[bytes] = open(stdin_fd, "wb", buffering=0)
        """Our end of its stdin, where requests go (as Popen's)."""
        self.returncode: int | None = None

    def exited(self, timeout: float = 0.0) -> bool:
        """Whether it has exited (its pidfd reads ready), waiting up to `timeout` seconds. poll, not
        select: a batch's parent holds over 1,024 descriptors."""
        if self.pidfd < 0:
            return True
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return bool(poller.poll(max(0.0, timeout) * 1000))

    def poll(self) -> int | None:
        if self.returncode is None and self.exited():
            self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code (Popen's convention), once the zygote has seen it exit; then it is reaped."""
        if self.returncode is None:
            code = self.zygote.exit_code(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            self.returncode = code
            self.zygote.reap(self.pid)
            os.close(self.pidfd)
            self.pidfd = -1
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # exited, not yet reaped
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)


class Zygote:
    """One zygote process and the socket we speak to it on."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = ()):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.home = tempfile.mkdtemp(prefix="kgen-zygote-")
        # NVML, not the CUDA runtime, answers torch.cuda.is_available in the zygote: a runtime call there
        # leaves every fork unable to start CUDA ("Cannot re-initialize CUDA in forked subprocess").
        env = {**env, "PYTORCH_NVML_BASED_CUDA_CHECK": "1", "HOME": self.home, "TMPDIR": self.home, "PYTHONPATH": os.pathsep.join(
            [PACKAGE_ROOT, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep)[1:] if p)])}
        self.proc = subprocess.Popen([sys.executable, "-s", "-m", MODULE, str(theirs.fileno()), *preload], cwd=self.home,
                                     env=env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     start_new_session=True, close_fds=True)
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()  # one request and its reply at a time
        self.codes: dict[int, int | None] = {}  # exits the zygote reported, by pid
        self.cond = threading.Condition()
        self.replies: list[tuple[dict, list[int]]] = []
        self.reader = threading.Thread(target=self._read, name="kgen-zygote", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 4)
            except OSError:
                data, fds = b"", []
            with self.cond:
                if not data:
                    self.replies.append(({"dead": True}, []))
                    self.cond.notify_all()
                    return
                message = json.loads(data)
                if "exited" in message:
                    self.codes[int(message["exited"])] = message["code"]
                else:
                    self.replies.append((message, fds))
                self.cond.notify_all()

    def alive(self) -> bool:
        return self.proc.poll() is None and self.reader.is_alive()

    def fork(self, module: str, argv: list[str], env: dict[str, str], cwd: str, policy: dict | None,
             status_fd: int | None, fds: dict[int, int], stdin_w: int, timeout: float) -> Forked:
        """A process for `python -m module argv...`, in a room made by `policy` (None: kgen's own, no
        room), with the descriptors `fds` (the number it sees: ours); OSError where the zygote has
        not answered within `timeout` (the child's own: a new zygote's start is part of it)."""
        request = {"module": module, "argv": argv, "env": env, "cwd": cwd, "policy": policy, "status_fd": status_fd,
                   "fds": list(fds)}
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds.values()))
            deadline = time.monotonic() + timeout
            with self.cond:
                while not self.replies:
                    if not self.cond.wait(max(0.0, deadline - time.monotonic())):
                        raise OSError("the zygote did not answer")
                reply, got = self.replies.pop(0)
        if "pid" not in reply or len(got) != 1:
            raise OSError(f"the zygote could not fork a child: {reply}")
        return Forked(self, int(reply["pid"]), got[0], stdin_w)

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        end = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while pid not in self.codes:
                if not self.reader.is_alive():
                    return -signal.SIGKILL  # the zygote died, and its forks with it (their parent-death signal)
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.cond.wait(left)
            return self.codes.pop(pid)

    def reap(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            self.sock.send(json.dumps({"reap": pid}).encode())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.home, ignore_errors=True)


_zygotes: dict[tuple[str, ...], Zygote] = {}
_lock = threading.Lock()


def zygote(env: dict[str, str], preload: tuple[str, ...] = ()) -> Zygote:
    """This process's zygote that has imported `preload` besides torch and the harness (the candidates':
    none), started on first use (and again if it died) with `env`, a child's allow-listed
    environment; each fork then takes its own."""
    with _lock:
        found = _zygotes.get(preload)
        if found is None or not found.alive():
            if not _zygotes:
                atexit.register(_close)
            if found is not None:
                found.close()
            found = _zygotes[preload] = Zygote(env, preload)
        return found


def _close() -> None:
    with _lock:
        for found in _zygotes.values():
            found.close()
        _zygotes.clear()
