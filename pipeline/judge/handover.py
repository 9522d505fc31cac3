"""Descriptors from the reference process to the parent: an attempt's expected values (and, on the
cpu's inbox path, the Bound calls' packed inputs) as sealed memfds handed over a Unix socket
(SCM_RIGHTS), never as files: under /tmp a child that escaped its sandbox could read them and return
them as its answers, and a gigabyte output would fill the disk. No path names a memfd; the
reference closes its own as soon as it has sent them, and the parent holds its copies only for the
attempt and passes them to no child (sandbox.start gives a child only the descriptors it lists).

The reference sends a message's descriptors in one datagram just before the line that names them
(`"fds": [names]`), so the parent finds them queued when it reads that line.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from typing import Any


def pair() -> tuple[socket.socket, socket.socket]:
    """(the parent's end, the reference's end): datagrams, each a message's descriptors."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def sealed_memfd(name: str, *data) -> int:
    """A memfd holding the `data` one after another (bytes or contiguous arrays, each written without
    a copy, so a caller can hand over an output's parts without joining them), sealed: its size and
    contents can no longer change, and whoever holds it can only map it read-only."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        for item in data:
            view = memoryview(item).cast("B")
            at = 0
            while at < len(view):
                at += os.write(fd, view[at:at + (1 << 30)])
            del view
        _seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


SEAL_TRIES, SEAL_PAUSE_S = 40, 0.05


def _seal(fd: int) -> None:
    """Seal the memfd, again while the kernel answers EBUSY: F_SEAL_WRITE waits for every extra
    reference to its pages to go, and the kernel's own memory work (compaction, page monitoring)
    holds some for a moment. In the demo's first run on the 2-core box one `expect` failed so, with
    nothing else holding the memfd, and the attempt went unjudged."""
    seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
    for attempt in range(SEAL_TRIES):
        try:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == SEAL_TRIES - 1:
                raise
            time.sleep(SEAL_PAUSE_S)


def give(sock: socket.socket, fds: list[int]) -> None:
    """Reference side: send `fds` (then close them: the parent's copies are the only ones left)."""
    try:
        socket.send_fds(sock, [b"x"], fds)
    finally:
        for fd in fds:
            os.close(fd)


def take(sock: socket.socket, names: list[str]) -> dict[str, int]:
    """Parent side: the descriptors sent before the line naming them, by name, close-on-exec from the
    moment they arrive. OSError if they are not there (they never wait: the line came after them)."""
    _, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(4 * len(names)), socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
    fds = [fd for level, kind, data in ancillary if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
           for fd in memoryview(data).cast("i")]
    if len(fds) != len(names):
        for fd in fds:
            os.close(fd)
        raise OSError(f"{len(fds)} descriptors came for {len(names)} named")
    return dict(zip(names, fds))


def close_all(messages: list[dict[str, Any]]) -> None:
    """Close the descriptors that came with `messages` (TaskBench.request's)."""
    for msg in messages:
        for fd in msg.pop("_fds", {}).values():
            os.close(fd)
