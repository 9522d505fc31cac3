"""Starting a child process that may run hostile code: a fresh process group, an environment from an
allow-list (no API keys, tokens or database paths), its own temporary folder and, for a candidate's child
(`Jail`), confinement set before any of its code runs (confine.py, in a fork of the zygote: zygote.py).
The parent stages what the child reads into its job/ folder and never names a path of the project. What
it reads back is hostile: replies through protocol.Reader (a deadline, a line limit), the log through
the parent's own descriptor, never by path, and only its last POLICY.log_tail_bytes bytes.

May import: core, child.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic import BaseModel

from ..child import PACKAGE_ROOT, memfd, protocol
from ..policy import POLICY
from . import cgroup, confine, zygote
from .cores import cpu_cores, on_cores, pin, pin_all  # noqa: F401 - the package's API

# Variables a compiler, CUDA or torch needs; everything else (keys, tokens, KGEN_*, proxies) stays out.
ENV_ALLOW = (
    "PATH", "LANG", "LC_ALL", "TZ", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH",
    "LD_LIBRARY_PATH", "TORCH_CUDA_ARCH_LIST", "CC", "CXX", "NVCC_APPEND_FLAGS", "KGEN_LANDLOCK",
)


def child_env(extra: dict[str, str] | None = None, home: str = "/tmp", package_path: str = PACKAGE_ROOT) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    # Our package first, then where the parent found its own packages outside the interpreter
    # (a --target install, say): the child imports pydantic and torch from the same places.
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
             if p and os.path.abspath(p) != PACKAGE_ROOT]
    env.update(HOME=home, TMPDIR=home, PYTHONPATH=os.pathsep.join([package_path, *inherited]), PYTHONDONTWRITEBYTECODE="1",
               PYTHONUNBUFFERED="1", PYTHONNOUSERSITE="1", **POLICY.malloc_env)
    env.update(extra or {})
    return env


@dataclass
class Child:
    """A running sandboxed child with a command pipe (its stdin) and a result pipe."""

    proc: subprocess.Popen
    reader: protocol.Reader
    log_fd: int
    workdir: Path
    started: float
    deadline: float
    outbox_fd: int | None = None
    timed_out: bool = False
    policy: dict | None = None
    """The jail's policy (pipeline/sandbox/confine.py), None for a process of the parent's side."""
    status_fd: int | None = None
    _confinement: protocol.Confinement | None = None
    handover: Any = None
    """The reference process's: the parent's end of its socket for memfds (pipeline.judge.refproto)."""
    room: cgroup.Room | None = None
    """The jailed child's cgroups, removed by `finish`."""
    pidns: int | None = None
    """The inode of the jailed child's pid namespace, once read (`room_namespace`)."""
    pidns_fd: int | None = None
    """Held from `room_namespace` until `finish` has looked for leftovers, so its inode cannot be another room's."""
    status: dict | None = None
    """The jail's status line, once `confinement` read it: what held, as the jail saw it."""
    left: list[int] = field(default_factory=list)
    """Processes of the room the parent still saw after it ended (`finish`): none, by construction."""

    @property
    def pid(self) -> int:
        """The process that runs the command, as we number it: a jailed child's pid 2 of its room (the
        jail's status line names it, checked by `confinement`), else the process we started. Its
        threads' run-queue waits, cpu time and cores are what the judge reads."""
        if self.policy is None:
            return self.proc.pid
        self.confinement()
        inner = (self.status or {}).get("host_pid")
        return inner if isinstance(inner, int) and self._confinement.set_by == "parent" \
            and self._confinement.seccomp else self.proc.pid

    @property
    def job_dir(self) -> Path:
        """Where the parent stages what the child reads: read-only to the child."""
        return self.workdir / "job"

    def confinement(self, timeout: float = 30.0) -> protocol.Confinement:
        """What the parent set on this child and checked itself (confine.verified): the jail's
        status line, read until the room's outer process closed its descriptor, and /proc."""
        if self._confinement is None:
            status = None
            if self.status_fd is not None:
                try:
                    line = protocol.Reader(self.status_fd).line(time.monotonic() + timeout)
                    status = json.loads(line) if line else None
                except (TimeoutError, protocol.ProtocolError, ValueError):
                    status = None
            self.status = status
            self._confinement = confine.verified(self.proc.pid, status, self.policy)
        return self._confinement

    def stage(self, source: Path, name: str | None = None) -> str:
        """A copy of file `source` in the child's job folder, which it may read and not write."""
        target = self.job_dir / (name or Path(source).name)
        shutil.copyfile(source, target, follow_symlinks=True)
        os.chmod(target, 0o644)
        return str(target)

    def stage_tree(self, source: Path, name: str) -> str:
        """The regular files of `source` (a build folder, written by a candidate's build: no link
        is followed) in the job folder: hard links where the file system allows, else copies."""
        target = self.job_dir / name
        for root, dirs, files in os.walk(source, followlinks=False):
            rel = Path(root).relative_to(source)
            (target / rel).mkdir(parents=True, exist_ok=True)
            for file in files:
                src = Path(root) / file
                if not stat.S_ISREG(os.lstat(src).st_mode):
                    continue
                try:
                    os.link(src, target / rel / file, follow_symlinks=False)
                except OSError:
                    shutil.copyfile(src, target / rel / file, follow_symlinks=False)
        return str(target)

    def send(self, message: dict[str, Any] | BaseModel) -> None:
        try:
            text = message.model_dump_json() if isinstance(message, BaseModel) else json.dumps(message)
            protocol.write_line(self.proc.stdin.fileno(), text)
        except (BrokenPipeError, OSError):
            pass  # the child died; its exit status tells the story

    def receive(self, parse: Callable[[bytes], Any] = json.loads) -> Any:
        """The next line of a trusted child, `parse`d (the reference process's: pipeline.judge.refproto),
        or None when it closed the pipe or ran out of time. What `parse` raises goes to the caller."""
        try:
            line = self.reader.line(self.deadline)
        except (TimeoutError, protocol.ProtocolError):
            self.timed_out = True
            self.kill()
            return None
        return None if line is None else parse(line)

    def reply(self, deadline: float | None = None,
              later: Callable[[], float] | None = None) -> tuple[protocol.Message | None, float]:
        """The next typed reply of a candidate's child and when it arrived; (None, t) at end of stream.
        TimeoutError at `deadline` or the child's own, whichever is first (`later`, asked when `deadline`
        passes, may move it, never past the child's own). Anything but a valid reply: protocol.ProtocolError."""
        end = min(self.deadline, deadline) if deadline else self.deadline
        while True:
            try:
                reply = self.reader.reply(end)
                return reply, self.reader.arrived if reply is not None else time.monotonic()
            except TimeoutError:
                moved = min(self.deadline, later()) if later is not None and end < self.deadline else end
                if moved <= time.monotonic():
                    self.timed_out = True
                    self.kill()
                    raise
                end = moved

    def log(self) -> str:
        """The last POLICY.log_tail_bytes bytes the child wrote to its output, read through our own descriptor."""
        try:
            size = os.fstat(self.log_fd).st_size
            start = max(0, size - POLICY.log_tail_bytes)
            data = os.pread(self.log_fd, POLICY.log_tail_bytes, start)
        except OSError:
            return ""
        text = data.decode(errors="replace")
        return (f"[kgen] ... {start} bytes of output cut ...\n" if start else "") + text

    def kill(self) -> None:
        """End the child and everything it started. A jailed child: SIGKILL its outer process through its
        pidfd; the room's pid 1 dies with it, and the kernel then ends every process left in the room. Any
        other child: its process group, then what is left of its session (seccomp refuses setsid)."""
        if self.policy is not None:
            self.room_namespace()
            self.proc.kill()  # through its pidfd: that process and no other
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.returncode is not None:
            return
        # stragglers can fork until SIGKILL lands; a few sweeps catch up
        self._sweep(signal.SIGKILL, lambda: session_members(self.proc.pid), 200, 0.01)

    def room_namespace(self) -> int | None:
        """The inode of the room's pid namespace, read from the outer process (not yet reaped)
        as the namespace its children are born in; None before the jail made it or without a jail."""
        if self.pidns is None and self.policy is not None and self.proc.returncode is None:
            try:
                fd = os.open(f"/proc/{self.proc.pid}/ns/pid_for_children", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            if (inode := os.fstat(fd).st_ino) != os.stat("/proc/self/ns/pid").st_ino:
                self.pidns, self.pidns_fd = inode, fd
            else:
                os.close(fd)
        return self.pidns

    def leftovers(self, wait: float = 2.0) -> list[int]:
        """Live processes still in the room's pid namespace or cgroups, seen from outside, after up to
        `wait` seconds for the kernel to finish ending them; [] when nothing is left. Not zombies: the
        room's pid 1, orphaned when its zygote died, waits as one for a host pid 1 that may never reap it."""
        end = time.monotonic() + wait
        while True:
            found = {pid for pid in in_namespace(self.pidns) if _alive(pid)} if self.pidns else set()
            if self.room is not None:
                found.update(self.room.members())
            if not found or time.monotonic() >= end:
                return sorted(found)
            time.sleep(0.01)

    def _sweep(self, sig: int, left: Callable[[], list[int]], tries: int, wait: float) -> bool:
        """Send `sig` to every pid `left()` names, again until it names none (True), or until `tries`
        runs out (False)."""
        for _ in range(tries):
            pids = left()
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            time.sleep(wait)
        return not left()

    def pause(self) -> list[int] | None:
        """SIGSTOP every process in the child's session until `resume`, so nothing the candidate left running
        takes the cpu while the reference times eager; swept until all show stopped (a running one can fork).
        The members, all stopped, or None when one would not stop in time."""
        seen: list[tuple[int, str]] = []

        def running() -> list[int]:
            seen[:] = session_members(self.proc.pid, with_state=True)
            return [pid for pid, state in seen if state not in ("T", "t")]

        return [pid for pid, _ in seen] if self._sweep(signal.SIGSTOP, running, 50, 0.0005) else None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """pause for the block's length, then resume (the whole session), however the block ends."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def resume(self, members: list[int] | None = None) -> None:
        """SIGCONT what `pause` stopped: `members`, the list it returned (no scan of /proc, so that
        this costs the same few microseconds inside a timed window as in its calibration), or else
        the whole session (a stopped process cannot have left it)."""
        if members is None:
            members = session_members(self.proc.pid)
        for pid in members:
            try:
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass

    def finish(self, grace: float = 10.0, keep_out: Path | None = None) -> tuple[int, str]:
        """Wait for exit (killing the group at the deadline), then (returncode, log); stdin is closed first,
        so a waiting child exits. With `keep_out`, the jailed child's out/ folder becomes that folder, once
        nothing of the child is left, owned and writable by us alone."""
        if self.proc.stdin and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.room_namespace()
        wait = max(0.1, min(grace, self.deadline - time.monotonic()))
        if not (self.proc.exited(wait) if isinstance(self.proc, zygote.Forked) else _exited(self.proc.pid, wait)):
            self.timed_out = True
        self.kill()  # stragglers it forked or left behind, before reaping frees its pid
        code = self.proc.wait()
        if self.policy is not None:  # checked from outside: nothing of the room may be left
            self.left = self.leftovers()
            if self.room is not None and not self.left:
                self.room.remove()
        if self.pidns_fd is not None:
            os.close(self.pidns_fd)
            self.pidns_fd = None
        os.close(self.reader.fd)
        if self.status_fd is not None:
            os.close(self.status_fd)
            self.status_fd = None
        log = self.log()
        if keep_out is not None and (self.workdir / "out").is_dir():
            shutil.rmtree(keep_out, ignore_errors=True)
            keep_out.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.workdir / "out"), str(keep_out))
            _take_back(keep_out)
        for fd in (self.log_fd, self.outbox_fd):
            if fd is not None:
                os.close(fd)
        if self.handover is not None:
            self.handover.close()
        shutil.rmtree(self.workdir, ignore_errors=True)  # fd-based: it never follows the child's links
        return code, log


def _take_back(tree: Path) -> None:
    """Make a tree a child wrote ours: owner, and no write bit for group or others; no link followed."""
    uid, gid = os.geteuid(), os.getegid()
    for root, dirs, files in os.walk(tree, followlinks=False):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            with contextlib.suppress(OSError):
                os.chown(name, uid, gid, follow_symlinks=False)
                mode = os.lstat(name).st_mode
                if not stat.S_ISLNK(mode):
                    os.chmod(name, stat.S_IMODE(mode) & ~0o022)


def _exited(pid: int, timeout: float) -> bool:
    """Wait until the child has exited, without reaping it (its pid stays ours); False on timeout."""
    end = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True  # already reaped
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)


def in_namespace(inode: int) -> list[int]:
    """Pids (as we number them) of the processes in the pid namespace `inode`, zombies included."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry.name}/ns/pid").st_ino == inode:
                    found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """Not exited, nor a zombie."""
    return bool(session_members(-1, pid=pid))


def session_members(sid: int, with_state: bool = False, pid: int | None = None) -> list:
    """Live (not zombie) processes in session `sid` (any, where -1), read from /proc: pids, or (pid,
    state letter) pairs with `with_state`; only `pid`, where given."""
    members: list = []
    for name in [str(pid)] if pid is not None else (e.name for e in os.scandir("/proc")):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp session ...
        if fields[0] not in ("Z", "X") and sid in (-1, int(fields[3])):
            members.append((int(name), fields[0]) if with_state else int(name))
    return members


@dataclass(frozen=True)
class Jail:
    """Confine the child before any of its code runs (pipeline/sandbox/confine.py); its workdir is laid
    out as confine's docstring says."""

    read: tuple[str, ...] = ()
    """Folders it may read besides the system, Python, the package and its workdir."""
    out: bool = False
    """It gets an out/ folder it may write (a build's extensions), which the parent moves away after."""
    gpu: bool = True
    """The GPU's device nodes are open to it."""
    pids: int = 4096
    """Processes and threads the room may hold at once (its cgroup's pids.max)."""
    memory_bytes: int = 32 << 30
    """Memory the room may use, its HOME's tmpfs included (its cgroup's limit)."""
    file_bytes: int = 1 << 30
    """The largest file it may write (RLIMIT_FSIZE): a build's extension, a cache entry."""
    home_bytes: int = 2 << 30
    """The size of its HOME and TMPDIR, a tmpfs of the room's own: nothing it writes there reaches a disk."""


def _lay_out(workdir: Path, module: str, jail: Jail) -> tuple[Path, dict, cgroup.Room | None]:
    """The jailed child's folders (tmp/ its own, job/ and py/ the parent's) and its policy."""
    os.chmod(workdir, 0o711)
    tops = sorted({"pipeline", module.split(".")[0]})
    for sub in ("tmp", "job", "py", *(("out",) if jail.out else ())):
        (workdir / sub).mkdir(mode=0o755)
    for top in tops:
        (workdir / "py" / top).symlink_to(Path(PACKAGE_ROOT) / top)
    uid = confine.drop_to()
    for sub in ("tmp", *(("out",) if jail.out else ())):
        if uid is not None:
            os.chown(workdir / sub, uid, uid)
        os.chmod(workdir / sub, 0o700)
    room = cgroup.make(workdir.name, jail.pids, jail.memory_bytes, workdir.parent) if uid is not None else None
    policy = confine.jail_policy(workdir, tops, [str(workdir / "out")] if jail.out else [], list(jail.read), jail.gpu,
                                 room=room, file_bytes=jail.file_bytes, home_bytes=jail.home_bytes)
    return workdir / "tmp", policy, room


def _forked(module: str, argv: list[str], env: dict[str, str], cwd: str, policy: dict | None, status_w: int | None,
            fds: dict[int, int], timeout: float) -> zygote.Forked:
    """A child forked from one of this process's zygotes (started again once if it had died): a
    jailed child from the candidates', which imports nothing of ours; a trusted one from a zygote
    that has imported its module."""
    stdin_r, stdin_w = os.pipe()
    fds = {0: stdin_r, **fds, **({status_w: status_w} if status_w is not None else {})}
    preload = () if policy is not None else (module,)
    try:
        try:
            return zygote.zygote(child_env(), preload).fork(module, argv, env, cwd, policy, status_w, fds, stdin_w, timeout)
        except OSError:  # it died since the last child (killed, out of memory): a new one, once
            return zygote.zygote(child_env(), preload).fork(module, argv, env, cwd, policy, status_w, fds, stdin_w, timeout)
    finally:
        os.close(stdin_r)


def start(module: str, args: list[str], timeout: float, extra_env: dict[str, str] | None = None,
          outbox: int | None = None, jail: Jail | None = None, keep: tuple[int, ...] = (), fork: bool = False) -> Child:
    """Start `python -m module args...` sandboxed; messages come back on a pipe named by fd number. `outbox`
    (bytes): also a sealed memfd of that size (--outbox-fd). `jail`: a fork of the candidates' zygote, confined
    before any of its code runs; without, kgen's own code with the parent's rights, forked from a zygote that
    imported `module` where `fork`, else started afresh. It inherits only these descriptors and `keep`."""
    workdir = Path(tempfile.mkdtemp(prefix="kgen-child-"))
    log_path = workdir / "output.log"
    log = open(log_path, "wb")
    log_fd = os.open(log_path, os.O_RDONLY | os.O_CLOEXEC)  # ours: the child may swap the path, not this
    read_fd, write_fd = os.pipe()
    os.set_inheritable(read_fd, False)
    outbox_fd = memfd.Outbox.create(outbox) if outbox is not None else None
    pass_fds = (write_fd,) if outbox_fd is None else (write_fd, outbox_fd)
    extra_args = [] if outbox_fd is None else ["--outbox-fd", str(outbox_fd)]
    pass_fds += tuple(keep)
    command = [sys.executable, "-s", "-m", module, "--result-fd", str(write_fd), *extra_args, *args]
    home, policy, status_r, status_w, room = workdir, None, None, None, None
    if jail is not None and confine.enabled():
        home, policy, room = _lay_out(workdir, module, jail)
        status_r, status_w = os.pipe()
        os.set_inheritable(status_r, False)
    env = child_env(extra_env, home=str(home), package_path=str(workdir / "py") if policy else PACKAGE_ROOT)
    if policy and jail.out:
        env["TORCH_EXTENSIONS_DIR"] = str(workdir / "out")
    try:
        if policy is None and not fork:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, cwd=home,
                                    env=env, pass_fds=pass_fds, start_new_session=True, close_fds=True)
        else:  # forked from a zygote (a candidate's then jailed), run as `python -m` would run it
            proc = _forked(module, command[4:], env, str(home), policy, status_w,
                           {**{fd: fd for fd in pass_fds}, 1: log.fileno(), 2: log.fileno()}, timeout)
    finally:
        os.close(write_fd)
        if status_w is not None:
            os.close(status_w)
        log.close()
    pin(proc.pid, env.get("KGEN_CORES"))
    now = time.monotonic()
    return Child(proc, protocol.Reader(read_fd), log_fd, workdir, now, now + timeout, outbox_fd,
                 policy=policy, status_fd=status_r, room=room)
