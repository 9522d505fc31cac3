"""Exploit: a process that outlives its attempt by changing its pid (tests/test_room.py's hole 2).

At import (so in the build child, while the candidate is imported for its build, and again in the
evaluation child) the module forks a helper (a small interpreter of its own, `python -S`) that leaves the child's process group (setpgid, as
hang.py's escaper does; setsid is refused) and then hops: every HOP_S (3 ms) it forks and the parent exits,
and from the moment the child it came from exits (a pidfd of it turns readable) it hops as fast as
it can for BURST_S, while the parent sweeps the child's session: a pid listed a moment ago is gone
by the time it is killed, and the killpg of the child's group misses it. It names itself (comm, via prctl PR_SET_NAME)
`kb` or `ke` (build or evaluation)
plus the first 12 characters of TAG, so the test can look for it from outside (/proc, `ps`), and
stops on its own after LIFE_S so a run where it escapes cleans up after itself. It prints
`KGEN-NOTE hopper ROLE PID PGID` as it starts. The forward is torch's own mse: right, so a verdict
exists (correct, flagged no_custom_kernel).

Why it should fail: each attempt is a pid namespace of its own; when the attempt ends its init
exits and the kernel kills everything in it, whatever its pid or group, and the parent checks from
outside that nothing is left."""
from torch.utils.cpp_extension import load_inline  # noqa: F401,E402 (names an extension: a build child imports it too)
import ctypes
import os
import sys
import time

import torch
import torch.nn as nn

TAG = "__KGEN_TAG__"
HOP_S = 0.003
LIFE_S = 150.0
BURST_S = 3.0
ROLE = "b" if "build" in sys.argv[1:] else "e"  # the harness runs as `... --result-fd N build|eval`


# The hopper itself: a small interpreter of its own (python -S, no torch), so each fork copies a few
# megabytes, not the candidate's whole process, and a hop takes well under a millisecond.
_HOPPER = r"""
import ctypes, os, select, sys, time
name, hop_s, life_s, burst_s, watch = sys.argv[1].encode(), *map(float, sys.argv[2:5]), int(sys.argv[5])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
try:
    os.setpgid(0, 0)  # out of the child's process group (setsid is refused)
except OSError:
    pass
pidfd = libc.syscall(434, watch, 0)  # pidfd_open(the child): readable once it has exited
end = time.monotonic() + life_s
burst_until = None
while time.monotonic() < end:
    if burst_until is None:
        if pidfd >= 0:
            if select.select([pidfd], [], [], hop_s)[0]:
                burst_until = time.monotonic() + burst_s  # the child is gone: its sweep starts now
        else:
            time.sleep(hop_s)
    elif time.monotonic() > burst_until:
        time.sleep(hop_s)
    try:
        if os.fork() > 0:
            os._exit(0)  # the parent exits: the pid just listed is gone
    except OSError:
        pass
os._exit(0)
"""


def _start(name: str) -> int:
    child = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in range(3, 1024):  # hold none of the child's pipes open
                try:
                    os.close(fd)
                except OSError:
                    pass
            os.execv(sys.executable, [sys.executable, "-S", "-c", _HOPPER, name, str(HOP_S), str(LIFE_S), str(BURST_S),
                                       str(child)])
        finally:
            os._exit(0)
    return pid


_pid = _start(f"k{ROLE}{TAG[:12]}")
print(f"KGEN-NOTE hopper {ROLE} {_pid} {os.getpgid(0)}", flush=True)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
