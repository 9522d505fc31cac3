"""`kgen serve`: one warm process that judges `kgen eval`'s candidates.

Alone, a `kgen eval` pays every time for what a batch pays once per task: importing torch, starting
the task's reference process and warming its compiler, measuring baselines, starting the candidate's
child (on a GPU: CUDA and the profiler): for a build already stored, over half a minute of wall on a
GPU (docs/decisions/spares-and-startup.md). `kgen serve` keeps all of it between evaluations
(pipeline.run.single.Warm), and `kgen eval` hands its candidate over when a server for its database is
listening.

    kgen serve &                                  # one per database; Ctrl-C or SIGTERM ends it
    kgen eval my_kernel.py --task mse             # judged by the server, stored in the same database

The server is the parent: it builds, judges and stores exactly as `kgen eval` would, and believes
nothing its clients or candidates say about results. Who may ask it:
- It listens on a Unix socket in a folder only the user can enter (KGEN_CACHE_DIR/serve, mode 0700),
  named after the database it serves.
- Before reading a byte it checks the peer (SO_PEERCRED): the same uid, and not a process the server
  started (a candidate's child, or anything that child spawned). Those are closed at once, so a
  candidate cannot make the server wait on it.
- The first line must carry the token the server wrote beside the socket (mode 0600) when it started.
  A candidate's child cannot read it: Landlock lets the child read the system, Python and its job's
  files, never the cache's serve folder (pipeline.child.harness.readable_paths). The line is read
  under a deadline and a size limit.
- A request carries the candidate's code, not a path, and names a task; the server reads nothing
  else of the client's choosing and writes only its own database.
"""

from __future__ import annotations

import hmac
import os
import queue
import secrets
import signal
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict

from ..config import Config, cache_root
from ..records import EvalResult, FileRequest

MAX_REQUEST = 16 << 20  # bytes of a request line: the candidate's code travels in it
READ_DEADLINE_S = 10.0  # for a client's request line, once its peer is checked
ADMITTING = 16  # connections read at once; more are closed unread (a flood costs threads, not the judge)


class EvalRequest(FileRequest):
    """What `kgen eval` asks the server: the request it would judge itself, with the code read and the
    server's token."""

    token: str
    """The token the server wrote beside its socket: the client can read the user's cache."""
    config: str | None
    """The client's config file, resolved (None: none in use); the server serves one config only."""
    code: str
    """The candidate's source, as the client read it."""


class ServeReply(BaseModel):
    """One line from the server: a notice while it works, then the verdict or a one-line error."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    kind: Literal["notice", "result", "error", "other_config"]
    """notice: a line to show; result: the verdict; error: the request cannot be judged (a bad
    size, task or backend), as `kgen eval` would say it; other_config: this server serves another
    config, and the client judges the candidate itself."""
    line: str | None = None
    """The notice's or error's text."""
    result: EvalResult | None = None
    attempt_id: str | None = None
    size: str | None = None
    """The size that ran (its stored name) and its dimensions."""
    size_dims: dict[str, int] | None = None
    server_pid: int | None = None


class ServerGone(RuntimeError):
    """The server closed the connection before its verdict (it was stopped, or it died)."""


def address(db_path: Path) -> tuple[Path, Path]:
    """The socket and the token file of the server for `db_path` (one server per database)."""
    import hashlib

    key = hashlib.sha256(str(Path(db_path).resolve()).encode()).hexdigest()[:16]
    folder = cache_root() / "serve"
    return folder / f"{key}.sock", folder / f"{key}.token"


def config_id(config: str | None) -> str | None:
    return str(Path(config).resolve()) if config else None


# ------------------------------------------------------------------------------------------ server


def serve(cfg: Config | None, config: str | None, db_path: Path, say: Callable[[str], None]) -> None:
    """Listen until SIGINT or SIGTERM. Connections are admitted (peer, token, config) each in a
    thread of its own, so a refused or slow one never holds up another, and a candidate reaching
    for the server is refused while its own evaluation runs; admitted requests are judged one at a
    time, in order, by one long-lived thread (the children it starts die with the thread that
    started them: pipeline.child.harness.die_with_parent)."""
    from .single import Warm

    # Signals first: a SIGTERM between the socket's listen and the handlers would kill the server
    # outright (-15), leaving its socket and token behind.
    stop = _stop_on_signals()
    sock_path, token_path = address(db_path)
    sock_path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(sock_path.parent, 0o700)
    if _listening(sock_path):
        raise ValueError(f"kgen serve is already running for {db_path} (socket {sock_path})")
    sock_path.unlink(missing_ok=True)  # a server that died left it behind
    token = secrets.token_hex(32)
    fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)  # the mode above applies only to a file it creates
    with os.fdopen(fd, "w") as out:
        out.write(token)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    os.chmod(sock_path, 0o600)
    listener.listen(16)
    listener.settimeout(0.5)
    warm, admitted, closing = Warm(), queue.Queue(), threading.Event()
    judge = threading.Thread(target=_judge_loop, args=(admitted, closing, cfg, db_path, warm, say), name="kgen-judge")
    judge.start()
    admitting = threading.BoundedSemaphore(ADMITTING)
    say(f"kgen serve: pid {os.getpid()}, database {db_path}, socket {sock_path}")
    try:
        while not stop and judge.is_alive():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            if not admitting.acquire(blocking=False):
                conn.close()
                say(f"refused a connection: {ADMITTING} others are being read")
                continue
            threading.Thread(target=_admit, args=(conn, token, config, admitted, say, admitting), daemon=True).start()
    finally:
        listener.close()
        sock_path.unlink(missing_ok=True)
        token_path.unlink(missing_ok=True)
        closing.set()  # requests still queued are closed unjudged; the one being judged ends first
        admitted.put(None)
        if judge.is_alive():
            say("kgen serve: finishing the evaluation in progress")
        judge.join()
        warm.close()


def _judge_loop(admitted: queue.Queue, closing: threading.Event, cfg: Config | None, db_path: Path, warm,
                say: Callable[[str], None]) -> None:
    while (item := admitted.get()) is not None:
        conn, request = item
        with conn:
            if not closing.is_set():
                _judge(conn, request, cfg, db_path, warm, say)


def _stop_on_signals() -> list[int]:
    stop: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda num, _frame: stop.append(num))
    return stop


def peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, as the kernel recorded it at connect time."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def refused_peer(conn: socket.socket) -> str | None:
    """Why this peer may not ask anything (read before any byte of it), or None."""
    from ..judge.health import descendants

    pid, uid = peer(conn)
    if uid != os.getuid():
        return f"uid {uid} is not this server's"
    if pid in descendants(os.getpid()):
        return f"pid {pid} is a process this server started (a candidate's)"
    return None


def _read_line(conn: socket.socket) -> bytes | None:
    """One request line under READ_DEADLINE_S and MAX_REQUEST, or None."""
    deadline = time.monotonic() + READ_DEADLINE_S
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or len(data) > MAX_REQUEST:
            return None
        conn.settimeout(left)
        try:
            chunk = conn.recv(1 << 20)
        except (socket.timeout, OSError):
            return None
        if not chunk:
            return None
        data += chunk
    return data.split(b"\n", 1)[0]


def _send(conn: socket.socket, reply: ServeReply) -> None:
    try:
        conn.sendall(reply.model_dump_json().encode() + b"\n")
    except OSError:  # the client went away (Ctrl-C): the verdict is still stored
        pass


def _admit(conn: socket.socket, token: str, config: str | None, admitted: queue.Queue,
           say: Callable[[str], None], admitting: threading.BoundedSemaphore) -> None:
    """Queue one client's request for the judge, or close it: a peer that may not ask, a line
    without this server's token, or a request for another config (answered, not judged)."""
    try:
        _admit_one(conn, token, config, admitted, say)
    finally:
        admitting.release()


def _admit_one(conn: socket.socket, token: str, config: str | None, admitted: queue.Queue,
               say: Callable[[str], None]) -> None:
    why = refused_peer(conn)
    if why:
        conn.close()
        say(f"refused a connection: {why}")
        return
    line = _read_line(conn)
    try:
        request = EvalRequest.model_validate_json(line) if line else None
    except ValueError:
        request = None
    if request is None or not hmac.compare_digest(request.token.encode(), token.encode()):
        conn.close()
        say("refused a connection: no request with this server's token")
        return
    if request.config != config_id(config):
        _send(conn, ServeReply(kind="other_config", line=f"this server serves {config_id(config) or 'no config file'}",
                               server_pid=os.getpid()))
        conn.close()
        return
    conn.settimeout(None)
    admitted.put((conn, request))


def _judge(conn: socket.socket, request: EvalRequest, cfg: Config | None, db_path: Path, warm,
           say: Callable[[str], None]) -> None:
    from .single import evaluate_file

    sized: dict = {}
    started = time.monotonic()
    try:
        result, attempt_id = evaluate_file(
            request, cfg, db_path=db_path, warm=warm, on_size=lambda name, dims: sized.update(size=name, size_dims=dims),
            notice=lambda text: _send(conn, ServeReply(kind="notice", line=text)))
    except ValueError as exc:  # a size the task lacks, a task or backend this machine cannot run
        _send(conn, ServeReply(kind="error", line=str(exc), server_pid=os.getpid()))
        return
    except Exception as exc:  # noqa: BLE001 - a reference process that failed: this request's end, not the server's
        line = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        _send(conn, ServeReply(kind="error", line=line, server_pid=os.getpid()))
        say(f"{request.task}: failed: {line}")
        return
    _send(conn, ServeReply(kind="result", result=result, attempt_id=attempt_id, server_pid=os.getpid(), **sized))
    say(f"{request.task}: {result.verdict.value} in {time.monotonic() - started:.1f} s"
        + (f", attempt {attempt_id}" if attempt_id else ""))


def _listening(sock_path: Path) -> bool:
    if not sock_path.exists():
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(sock_path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


# ------------------------------------------------------------------------------------------ client


def ask(db_path: Path, config: str | None, fields: dict, notice: Callable[[str], None]) -> ServeReply | None:
    """Hand a `kgen eval` to the server for `db_path`: its last reply (result, error or
    other_config), or None where no server is listening (the client then judges it itself)."""
    sock_path, token_path = address(db_path)
    try:
        token = token_path.read_text().strip()
    except OSError:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(sock_path))
    except OSError:
        conn.close()
        return None
    request = EvalRequest(token=token, config=config_id(config), **fields)
    with conn, conn.makefile("rb") as replies:
        conn.sendall(request.model_dump_json().encode() + b"\n")
        for raw in replies:
            reply = ServeReply.model_validate_json(raw)
            if reply.kind != "notice":
                return reply
            notice(reply.line or "")
    raise ServerGone("kgen serve ended without a verdict (see its output); --local judges the file here")
