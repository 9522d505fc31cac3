"""A stand-in for the harness in tests/test_sandbox.py: started through pipeline.sandbox.start, it
reports what a child sees, and, in `confined` mode, confines itself the way the harness does and
reports what it could still reach.

    python -m tests.sandbox_probe --result-fd N plain
    python -m tests.sandbox_probe --result-fd N confined OUTSIDE_FILE PROJECT_FILE PORT
    python -m tests.sandbox_probe --result-fd N spin      # forks two spinners, reports, waits on stdin
    python -m tests.sandbox_probe --result-fd N jailed OUTSIDE SECRET PROJECT_FILE PORT
        (under sandbox.Jail: the same probes from the main thread and from a thread started first)
    python -m tests.sandbox_probe --result-fd N memscan HEAD TAIL ...  # its own memory, for each HEAD+TAIL
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading



def _try(fn) -> str:
    try:
        fn()
        return "ok"
    except OSError as exc:
        return f"denied: {type(exc).__name__} {exc.errno}"


def _write(path: str) -> None:
    with open(path, "w") as f:
        f.write("probe")


def _read(path: str) -> None:
    with open(path, "rb") as f:
        f.read(1)


def _setsid_in_fork() -> str:
    """setsid() from a forked process (the probe itself already leads its session)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os._exit(0)
        except OSError:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return "ok" if os.waitstatus_to_exitcode(status) == 0 else "denied"


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _call(fn) -> str:
    """A libc call that returns -1 on failure: 'ok', or 'denied: errno'."""
    import ctypes

    result = fn()
    return "ok" if result >= 0 else f"denied: {ctypes.get_errno()}"


def _unix_connect(path: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(b"probe")


def _room_probes(sock_path: str, key: int) -> dict:
    """The room's channels: each must be closed, or (System V) private to the room."""
    import ctypes

    libc = _libc()
    big = os.path.join(os.environ["HOME"], f"big-{key}")

    def big_file() -> None:
        with open(big, "wb") as f:  # sparse: costs no disk where the limit does not hold
            f.seek(5 << 30)
            f.write(b"x")

    found = libc.shmget(key, 4096, 0)
    return {"unix_connect": _try(lambda: _unix_connect(sock_path)),
            "sysv_found": "found" if found >= 0 else "absent",
            "sysv_create": _call(lambda: libc.shmget(key, 4096, 0o1666)),  # IPC_CREAT | 0666
            "keyring": _call(lambda: libc.syscall(248, b"user", f"kgen-{key}".encode(), b"v", 1, -4)),
            "userns": _call(lambda: libc.unshare(0x10000000)),
            "io_uring": _call(lambda: libc.syscall(425, 8, ctypes.create_string_buffer(120))),
            "big_file": _try(big_file),
            "pid": os.getpid(), "own_tasks": sorted(int(t) for t in os.listdir("/proc/self/task")),
            "ns_pids": [pid for pid in range(1, 64) if _alive(pid)]}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _jailed_probes(outside: str, secret: str, project_file: str, port: str, sock_path: str = "", key: str = "0",
                   which: int = 0) -> dict:
    """What one thread can reach; every probe but write_home must be denied in a jailed child."""
    job = os.path.join(os.path.dirname(os.environ["HOME"]), "job")
    parent = os.getppid()  # 0 in a pid namespace of its own: the parent is not even nameable
    room = _room_probes(sock_path, int(key) + which) if sock_path else {}  # a key per thread: neither finds the other's
    return {"uid": os.getuid(),
            "write_home": _try(lambda: _write(os.path.join(os.environ["HOME"], f"in-{threading.get_ident()}.txt"))),
            "write_outside": _try(lambda: _write(outside)),
            "read_secret": _try(lambda: _read(secret)),
            "read_project": _try(lambda: _read(project_file)),
            "read_parent_environ": _try(lambda: _read(f"/proc/{os.getppid()}/environ")),
            "write_job": _try(lambda: _write(os.path.join(job, "pwned"))),
            "signal_parent": _try(lambda: os.kill(parent, 0)) if parent else "denied: outside its pid namespace",
            "tcp_connect": _try(lambda: socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()),
            **room}


def _memscan(secrets: list[str]) -> dict:
    """Every readable private mapping of this process that no file backs (the heap, anonymous memory,
    the stack: what a fork copies), read in place, searched for each secret's bytes. A secret comes
    as its two halves, never joined here, so that only a copy from elsewhere can be found."""
    import ctypes

    halves = [(secrets[i].encode(), secrets[i + 1].encode()) for i in range(0, len(secrets), 2)]
    found, scanned = [], 0
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    for fields in regions:
        span, perms, path = fields[0], fields[1], fields[5] if len(fields) > 5 else ""
        if not perms.startswith("r") or perms[3] != "p" or path not in ("", "[heap]", "[stack]"):
            continue
        start, end = (int(x, 16) for x in span.split("-"))
        data = ctypes.string_at(start, end - start)
        scanned += len(data)
        for n, (head, tail) in enumerate(halves):
            at = data.find(head)
            while at >= 0 and n not in found:
                if data[at + len(head):at + len(head) + len(tail)] == tail:
                    found.append(n)
                at = data.find(head, at + 1)
    return {"found": found, "scanned_bytes": scanned}


def main() -> int:
    early: dict = {}
    go = threading.Event()

    def first_thread() -> None:  # started before anything else the probe does
        go.wait()
        early.update(_jailed_probes(*early.pop("args"), which=1))

    thread = threading.Thread(target=first_thread, daemon=True)
    thread.start()
    parser = argparse.ArgumentParser()
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("mode", choices=["plain", "confined", "spin", "jailed", "memscan"])
    parser.add_argument("rest", nargs="*")
    args = parser.parse_args()
    report = {"env": dict(os.environ), "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
              "ppid": os.getppid(), "cwd": os.getcwd(), "cwd_listing": sorted(os.listdir("."))}
    if args.mode == "confined":
        from pipeline.child.harness import apply_limits

        outside, project_file, port = args.rest
        report["confinement"] = apply_limits(None, False, [], []).model_dump()
        home = os.environ["HOME"]
        report["write_home"] = _try(lambda: _write(os.path.join(home, "inside.txt")))
        report["write_outside"] = _try(lambda: _write(outside))
        # /dev/shm outlives the attempt: a place to leave seeds or answers for the next one.
        report["write_dev_shm"] = _try(lambda: _write(f"/dev/shm/kgen-probe-{os.getpid()}"))
        report["read_project"] = _try(lambda: _read(project_file))
        report["read_parent_environ"] = _try(lambda: _read(f"/proc/{os.getppid()}/environ"))
        report["read_own_status"] = _try(lambda: _read("/proc/self/status"))
        report["read_cpuinfo"] = _try(lambda: _read("/proc/cpuinfo"))
        report["signal_parent"] = _try(lambda: os.kill(os.getppid(), 0))
        report["setsid_in_fork"] = _setsid_in_fork()
        report["tcp_connect"] = _try(lambda: socket.create_connection(("127.0.0.1", int(port)), timeout=2).close())
    if args.mode == "memscan":
        report.update(_memscan(args.rest))
    if args.mode == "jailed":
        early["args"] = args.rest
        go.set()
        thread.join(30)
        report["thread"] = dict(early)
        report["main"] = _jailed_probes(*args.rest)
    if args.mode == "spin":  # helpers that take the cpu whenever they may (sandbox.Child.pause must stop them)
        spinners = []
        for _ in range(2):
            pid = os.fork()
            if pid == 0:
                while True:
                    pass
            spinners.append(pid)
        report["spinners"] = spinners
    os.write(args.result_fd, (json.dumps(report) + "\n").encode())
    if args.mode in ("spin", "jailed"):  # alive while the parent checks it from outside
        import sys

        sys.stdin.readline()  # until the parent closes our stdin (finish)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
