"""Process-wide guards set before any candidate code: stdlib only, so the jail (pipeline.child.jail.jail)
can load this file before it execs the interpreter, and the harness and the reference can too.

- die_with_parent: SIGKILL when the kgen process that started us dies;
- forbid_setsid: a seccomp filter (setsid, prctl(PR_SET_PDEATHSIG), sched_setaffinity refused).
"""

from __future__ import annotations

import os
import signal


# seccomp, per machine: (audit arch, and the numbers of setsid, seccomp, prctl, sched_setaffinity).
_SECCOMP_ABI = {"x86_64": (0xC000003E, 112, 317, 157, 203), "aarch64": (0xC00000B7, 157, 277, 167, 122)}
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when the kgen process that started it dies, however it dies. Without it a
    killed `kgen` (a timeout, kill -9) left its reference processes and a running child behind on
    the H100, holding GPU memory and a context beside every later run (docs/decisions/measurement-notebook.md)."""
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent or parent == 1:  # the parent died before the line above
        os._exit(1)


def forbid_setsid() -> bool:
    """A seccomp filter, on every thread and inherited by everything started later: setsid() fails
    with EPERM, so no process of ours can leave the session that sandbox.Child.kill sweeps (a new
    process group is still allowed: ninja puts each compile in one), and prctl(PR_SET_PDEATHSIG)
    fails too, so the child cannot stop dying with its parent (die_with_parent), and
    sched_setaffinity fails, so a process of the candidate cannot leave the cores the parent pinned
    it to (sandbox.start, KGEN_CORES: a build off the timing lane's cores). Syscalls of a foreign ABI
    (x32, i386 through int 0x80), where the numbers differ, are refused outright. True when it holds."""
    import ctypes
    import errno
    import platform
    import struct

    abi = _SECCOMP_ABI.get(platform.machine())
    if abi is None:
        return False
    arch, setsid, seccomp, prctl, setaffinity = abi
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    program = [
        (load, 0, 0, 4),            # 0: A = seccomp_data.arch
        (jeq, 1, 0, arch),          # 1: native ABI -> 3
        (ret, 0, 0, deny),          # 2: foreign ABI
        (load, 0, 0, 0),            # 3: A = seccomp_data.nr
        (jge, 6, 0, 0x40000000),    # 4: x32 -> 11
        (jeq, 5, 0, setsid),        # 5: setsid -> 11
        (jeq, 4, 0, setaffinity),   # 6: sched_setaffinity -> 11
        (jeq, 0, 2, prctl),         # 7: prctl -> 8, else -> 10
        (load, 0, 0, 16),           # 8: A = low word of seccomp_data.args[0]
        (jeq, 1, 0, PR_SET_PDEATHSIG),  # 9: prctl(PR_SET_PDEATHSIG, ...) -> 11
        (ret, 0, 0, allow),         # 10
        (ret, 0, 0, deny),          # 11
    ]
    code = b"".join(struct.pack("=HBBI", *insn) for insn in program)
    buf = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(program), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS, required for an unprivileged filter
        return False
    # SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC: every thread torch already started too.
    return libc.syscall(ctypes.c_long(seccomp), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.byref(prog)) == 0
