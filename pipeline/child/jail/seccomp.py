"""Process-wide guards set before any candidate code: stdlib only, so the jail (pipeline.child.jail.jail)
can load this file before it execs the interpreter, and the harness and the reference can too.

- die_with_parent: SIGKILL when the kgen process that started us dies;
- install_filter: the seccomp filter every candidate process runs under (REFUSED says what and why).
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
import platform
import signal
import socket
import struct  # all imported here: the jail loads this file before its rules can refuse the standard library

class _Arg(enum.IntEnum):
    """Arguments this file passes or the filter checks, by their Linux ABI values."""
    PR_SET_PDEATHSIG = 1  # prctl's option
    # Namespace flags of clone(2): a process of the candidate's may not make namespaces of its own.
    CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# What the filter refuses (EPERM unless said), each with why a kernel's child needs none of it:
REFUSED = {
    "setsid": "leaving the session the parent pauses as one",
    "sched_setaffinity": "leaving the cores the parent pinned it to (a lane's timing cores)",
    "unshare": "new namespaces: a user namespace gives capabilities over its own mounts",
    "setns": "joining another namespace",
    "io_uring_setup": "io_uring: a second syscall interface this filter would not see",
    "io_uring_enter": "io_uring",
    "io_uring_register": "io_uring",
    "add_key": "keyrings outlive the attempt and are shared by every process of the uid",
    "request_key": "keyrings",
    "keyctl": "keyrings",
    "mount": "mounts", "umount2": "mounts", "pivot_root": "mounts",
    "open_tree": "mounts", "move_mount": "mounts", "fsopen": "mounts", "fsmount": "mounts",
    "bpf": "kernel programs", "userfaultfd": "stalling the kernel on a page fault",
    "kexec_load": "the kernel", "init_module": "the kernel", "finit_module": "the kernel",
}
# Refused with arguments looked at: prctl(PR_SET_PDEATHSIG) (it must keep dying with its parent),
# clone with a namespace flag, socket(AF_UNIX) (a host service's socket on any path it can reach;
# socketpair stays), and clone3 with ENOSYS (its flags sit in memory the filter cannot read; glibc
# then falls back to clone).
_NUMBERS = {
    "x86_64": dict(arch=0xC000003E, setsid=112, sched_setaffinity=203, unshare=272, setns=308,
                   io_uring_setup=425, io_uring_enter=426, io_uring_register=427, add_key=248,
                   request_key=249, keyctl=250, mount=165, umount2=166, pivot_root=155, open_tree=428,
                   move_mount=429, fsopen=430, fsmount=432, bpf=321, userfaultfd=323, kexec_load=246,
                   init_module=175, finit_module=313, prctl=157, clone=56, clone3=435, socket=41),
    "aarch64": dict(arch=0xC00000B7, setsid=157, sched_setaffinity=122, unshare=97, setns=268,
                    io_uring_setup=425, io_uring_enter=426, io_uring_register=427, add_key=217,
                    request_key=218, keyctl=219, mount=40, umount2=39, pivot_root=41, open_tree=428,
                    move_mount=429, fsopen=430, fsmount=432, bpf=280, userfaultfd=282, kexec_load=104,
                    init_module=105, finit_module=273, prctl=167, clone=220, clone3=435, socket=198),
}


def die_with_parent() -> None:
    """SIGKILL this process when the process that started it dies, however it dies: a killed `kgen`
    must leave no reference process or child behind holding a GPU. A parent of pid 1 means it was
    orphaned already, but for pid 2 of a room, whose parent is the room's pid 1 (jail.py)."""
    parent = os.getppid()
    ctypes.CDLL(None).prctl(_Arg.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent or (parent == 1 and os.getpid() != 2):  # the parent died before the line above
        os._exit(1)


def program(machine: str, unix: bool = False) -> list[tuple[int, int, int, int]] | None:
    """The filter as classic BPF instructions (code, jt, jf, k) for `machine`; None where unknown."""
    nr = _NUMBERS.get(machine)
    if nr is None:
        return None
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, JEQ, JGE, JSET (|K), RET|K
    ARCH, NR, ARG0 = 4, 0, 16  # offsets in seccomp_data (ARG0: the low word of args[0])
    # Jump targets are labels until the end: (op, true label, false label, k); None falls through.
    code: list[tuple[int, str | None, str | None, int]] = [
        (load, None, None, ARCH), (jeq, None, "deny", nr["arch"]),
        (load, None, None, NR), (jge, "deny", None, 0x40000000),  # x32
        (jeq, "nosys", None, nr["clone3"]),
        *((jeq, "deny", None, nr[name]) for name in REFUSED),
    ]
    checked = [("prctl", jeq, _Arg.PR_SET_PDEATHSIG), ("clone", jset, _Arg.CLONE_NEW_ANY)]
    checked += [] if unix else [("socket", jeq, socket.AF_UNIX)]
    for name, op, value in checked:
        code += [(jeq, None, f"after_{name}", nr[name]), (load, None, None, ARG0), (op, "deny", "allow", value)]
    code += [(ret, None, None, 0x7FFF0000),                         # allow: SECCOMP_RET_ALLOW
             (ret, None, None, 0x00050000 | errno.EPERM),           # deny: SECCOMP_RET_ERRNO | EPERM
             (ret, None, None, 0x00050000 | errno.ENOSYS)]          # nosys
    labels = {"allow": len(code) - 3, "deny": len(code) - 2, "nosys": len(code) - 1}
    for i, (op, _, false, _) in enumerate(code):  # after_NAME: the first instruction after NAME's block
        if false and false.startswith("after_"):
            labels[false] = i + 3
    out = []
    for i, (op, true, false, k) in enumerate(code):
        if op == load:
            out.append((op, 0, 0, k))
            continue
        jt = labels[true] - i - 1 if true else 0
        jf = labels[false] - i - 1 if false else 0
        out.append((op, jt, jf, k))
    return out


def install_filter(unix: bool = False) -> bool:
    """The seccomp filter (REFUSED and the argument checks above), on every thread of this process
    and inherited by everything it starts; syscalls of a foreign ABI (x32, i386 through int 0x80)
    are refused outright. `unix`: socket(AF_UNIX) allowed. True when it holds."""
    insns = program(platform.machine(), unix)
    if insns is None:
        return False
    code = b"".join(struct.pack("=HBBI", *insn) for insn in insns)
    buf = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(insns), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS, required for an unprivileged filter
        return False
    seccomp = 317 if platform.machine() == "x86_64" else 277
    # SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC: every thread torch already started too.
    return libc.syscall(ctypes.c_long(seccomp), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.byref(prog)) == 0
