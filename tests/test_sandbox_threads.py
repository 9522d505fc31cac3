"""No thread of the candidate's child is outside the sandbox.

tests/redteam/thread_escape.py signals every other thread of its process and, from a C++ handler,
tries to read secrets, reach the network and write the project; the main thread tries the same. It
is judged end to end through the real CLI (`python -m pipeline.cli eval`), in a project folder of
its own, with a canary key in kgen's environment and a TCP listener on 127.0.0.1. Every escape
that worked is collected, so a failure names them all at once.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CANDIDATE = ROOT / "tests" / "redteam" / "thread_escape.py"
TASK = ROOT / "reference_tasks" / "mse.py"


class Listener:
    """A TCP listener on 127.0.0.1 that keeps every byte any connection sends."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.received = b""
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(2)
                try:
                    while chunk := conn.recv(65536):
                        self.received += chunk
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def database_text(db: Path) -> str:
    """Every row of every table, as text: what kgen stored and shows (errors, logs, feedback)."""
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(repr(row) for t in tables for row in con.execute(f'SELECT * FROM "{t}"'))
    finally:
        con.close()


@pytest.mark.slow
def test_no_thread_of_the_child_escapes(tmp_path):
    key = f"canary-{uuid.uuid4().hex}"  # in kgen's environment, as an exported API key would be
    secret = tmp_path / "secret" / "canary.txt"  # a file of the user's the child must not read
    secret.parent.mkdir()
    file_canary = f"canary-file-{uuid.uuid4().hex}"
    secret.write_text(file_canary + "\n")
    # The project folder is world-readable, like a checkout (pytest's tmp_path is 0700), so a child
    # running as an unprivileged uid can read its task and code; the secret stays in tmp_path.
    project = Path(tempfile.mkdtemp(prefix="kgen-threads-"))
    os.chmod(project, 0o755)
    try:
        _judge_in(project, key, secret, file_canary)
    finally:
        shutil.rmtree(project, ignore_errors=True)


def _judge_in(project: Path, key: str, secret: Path, file_canary: str) -> None:
    """Judge the candidate through the CLI in `project`; one assert naming every escape that worked."""
    (project / "tasks").mkdir(parents=True)
    (project / "db").mkdir()
    task = project / "tasks" / "mse.py"
    shutil.copy(TASK, task)
    task_bytes = task.read_bytes()
    db = project / "db" / "kgen.db"
    (project / "replay.jsonl").write_text("")
    (project / "config.yaml").write_text(yaml.safe_dump({
        "models": [{"name": "none", "provider": "replay", "replay_file": "replay.jsonl"}],
        "backend": "cpu",
        "evaluation": {"trials": 3, "timed_calls": 5, "warmup_calls": 1, "compile_baseline": False,
                       "check_shapes": False, "timeout_s": 300},
    }))
    listener = Listener()
    candidate = project / "thread_escape.py"
    candidate.write_text(CANDIDATE.read_text().replace("__KGEN_CANARY_FILE__", str(secret))
                         .replace("__KGEN_DB_PATH__", str(db)).replace("__KGEN_TASK_PATH__", str(task))
                         .replace("__KGEN_PORT__", str(listener.port)))
    before = {folder: listing(folder) for folder in (project, project / "tasks", project / "db", secret.parent)}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "eval", candidate.name, "--task", str(task), "--backend", "cpu",
             "--size", "small", "-c", "config.yaml", "--db", str(db), "--json", "--local"],
            cwd=project, capture_output=True, text=True, timeout=1200,
            env={**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": key})
    finally:
        listener.close()
    # Exit status 1 is a verdict other than correct; anything else (no JSON) is kgen failing.
    assert proc.returncode in (0, 1) and proc.stdout.strip(), proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    con = sqlite3.connect(db)
    stored, detail, result_json = con.execute("SELECT confinement_json, detail, result_json FROM attempts").fetchone()
    con.close()
    output = f"{detail or ''}\n{json.loads(result_json or '{}').get('output') or ''}"  # the child's log tail
    said = list(dict.fromkeys(line for line in output.splitlines() if "[thread_escape]" in line))
    leaks = []
    # The candidate answers wrong (a mismatch) only when an escape worked. Refused for another
    # reason (a timing refusal of its honest kernel, a sandbox that kills it for signalling, say), it
    # must still have started probing and reported no leak.
    if result["verdict"] != "correct" and (result["verdict"] == "mismatch" or any("LEAK" in line for line in said)
                                           or not any(": probing" in line for line in said)):
        leaks.append(f"verdict {result['verdict']}: {result.get('error')}")
    if result["verdict"] == "correct" and not any(": main thread" in line for line in said):
        leaks.append("correct, but the candidate's probe never reported: the attack did not run")  # no vacuous pass
    for secret_text in (key, file_canary):
        where = [name for name, text in (("stdout", proc.stdout), ("stderr", proc.stderr),
                                         ("database rows", database_text(db))) if secret_text in text]
        where += [str(p.relative_to(project)) for p in project.rglob("*")
                  if p.is_file() and secret_text.encode() in p.read_bytes()]  # logs, the db file, its journal
        if where:
            leaks.append(f"{secret_text[:12]}... found in {where}")
    if listener.connections or listener.received:
        leaks.append(f"listener: {listener.connections} connections, received {listener.received!r}")
    kgen_writes = {project: {"generated", "builds"}, project / "db": {"kgen.db", "kgen.db-journal", "kgen.db-wal",
                                                                     "kgen.db-shm"}}
    for folder, names in before.items():
        new = listing(folder) - names - kgen_writes.get(folder, set())
        if new:
            leaks.append(f"new in {folder}: {sorted(new)}")
    if task.read_bytes() != task_bytes:
        leaks.append(f"task file changed: {task.read_bytes()[len(task_bytes):]!r} appended")
    confinement = json.loads(stored or "{}")
    uid = confinement.get("uid")
    if not (isinstance(uid, int) and uid > 0):  # 0 is root, -1 or none: not known
        leaks.append(f"stored confinement: uid {uid} (0 is root) in {confinement}")
    assert not leaks, "\n".join(leaks + ["the candidate's own report:", *said])
