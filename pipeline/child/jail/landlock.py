"""Landlock: the child confines itself before it imports candidate code.

After `restrict(read=[...], write=[...])` the process (and all it starts) reads only beneath the read
paths, writes only beneath the write paths, opens no TCP connection and signals nothing outside itself;
the database is under no allowed path. Needs Linux 5.13+: before, `restrict` returns False and the
other layers (environment allow-list, process group, uid drop) still hold.
"""

from __future__ import annotations

import ctypes
import enum
import os
import struct


class _Sys(enum.IntEnum):
    """Landlock's system calls (the same numbers on every architecture)."""
    CREATE_RULESET = 444
    ADD_RULE = 445
    RESTRICT_SELF = 446


class _Fs(enum.IntFlag):
    """Filesystem access rights (LANDLOCK_ACCESS_FS_*), by the ABI version that added them."""
    EXECUTE = 1 << 0
    WRITE_FILE = 1 << 1
    READ_FILE = 1 << 2
    READ_DIR = 1 << 3
    REMOVE_DIR = 1 << 4
    REMOVE_FILE = 1 << 5
    MAKE_CHAR = 1 << 6
    MAKE_DIR = 1 << 7
    MAKE_REG = 1 << 8
    MAKE_SOCK = 1 << 9
    MAKE_FIFO = 1 << 10
    MAKE_BLOCK = 1 << 11
    MAKE_SYM = 1 << 12
    ALL_V1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
    REFER = 1 << 13  # ABI 2
    TRUNCATE = 1 << 14  # ABI 3
    IOCTL_DEV = 1 << 15  # ABI 5


class _Net(enum.IntFlag):
    """Network access rights (LANDLOCK_ACCESS_NET_*, ABI 4)."""
    BIND_TCP = 1
    CONNECT_TCP = 2


class _Scope(enum.IntFlag):
    """What a domain keeps inside itself (LANDLOCK_SCOPE_*, ABI 6)."""
    ABSTRACT_UNIX_SOCKET = 1
    SIGNAL = 2


# What a confined child may read of the system: the jail's policy (pipeline/sandbox/confine.py) and the
# harness's own second layer (harness.readable_paths) both use these.
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys", "/opt")
# Of /proc, only system-wide files libraries read (cpu, memory, kernel, the NVIDIA driver's) and the process's
# own entry: Landlock does not stop reading another process's /proc/PID/environ (the parent's API keys).
PROC_READ = ("cpuinfo", "meminfo", "stat", "loadavg", "uptime", "version", "filesystems", "devices",
             "modules", "swaps", "sys", "driver")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def abi_version() -> int:
    version = _libc.syscall(_Sys.CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return int(version) if version > 0 else 0


def restrict(read: list[str], write: list[str], devices: list[str] = ("/dev",)) -> bool:
    return restrict_rules([(p, "read") for p in read] + [(p, "write") for p in write] +
                          [(p, "device") for p in devices])


def rights(kind: str, abi: int) -> int:
    """The access a rule grants: "read" (read, list, execute), "list" (list a directory alone),
    "device" (read, write and ioctl a device node) or "write" (everything)."""
    fs = _Fs.ALL_V1 | (_Fs.REFER if abi >= 2 else 0) | (_Fs.TRUNCATE if abi >= 3 else 0) | (_Fs.IOCTL_DEV if abi >= 5 else 0)
    reading = _Fs.EXECUTE | _Fs.READ_FILE | _Fs.READ_DIR
    return {"read": reading, "list": _Fs.READ_DIR, "write": fs,
            "device": reading | _Fs.WRITE_FILE | (_Fs.IOCTL_DEV if abi >= 5 else 0) | (_Fs.TRUNCATE if abi >= 3 else 0)}[kind] & fs


def restrict_rules(rules: list[tuple[str, str]]) -> bool:
    """Confine this thread (and every thread and process it starts from now on) to `rules`, pairs of
    (path, kind of access: see `rights`); also no TCP (ABI 4+) and no signals or abstract sockets
    outside the domain (ABI 6+). True when it holds."""
    abi = abi_version()
    if abi < 1:
        return False
    fs = rights("write", abi)
    net = (_Net.BIND_TCP | _Net.CONNECT_TCP) if abi >= 4 else 0
    scoped = (_Scope.ABSTRACT_UNIX_SOCKET | _Scope.SIGNAL) if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, net, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    buf = ctypes.create_string_buffer(attr[:size], size)
    ruleset = _libc.syscall(_Sys.CREATE_RULESET, buf, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return False
    try:
        for path, kind in rules:
            _add(ruleset, path, rights(kind, abi))
        if _libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS, required by restrict_self
            return False
        return _libc.syscall(_Sys.RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) == 0
    finally:
        os.close(ruleset)


def _add(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path that does not exist needs no rule
    try:
        if not os.path.isdir(path):
            # Rights that only make sense on directories are refused for a file.
            rights &= _Fs.EXECUTE | _Fs.WRITE_FILE | _Fs.READ_FILE | _Fs.TRUNCATE | _Fs.IOCTL_DEV
        if not rights:
            return  # e.g. "list" on a file: nothing to grant
        attr = struct.pack("=Qi", rights, fd)
        buf = ctypes.create_string_buffer(attr, len(attr))
        if _libc.syscall(_Sys.ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), buf,  # LANDLOCK_RULE_PATH_BENEATH
                         ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock: cannot add a rule for {path}")
    finally:
        os.close(fd)
