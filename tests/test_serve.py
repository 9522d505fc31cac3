"""`kgen serve`: a warm evaluator that `kgen eval` hands its file to, and who may ask it.

Real parts throughout: the server is `python -m pipeline.cli serve` in its own process, the client
is the `kgen eval` command, the candidates are judged on the cpu backend and stored in a SQLite file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml
from click.testing import CliRunner

from pipeline.run import serve
from pipeline.cli.main import main
from pipeline.store.store import Store

ROOT = Path(__file__).resolve().parent.parent

HONEST = """import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return ((predictions - targets) ** 2).mean()
"""

# A candidate that, at import, reaches for the server that judges it: it reads the token beside
# the socket (or the server's memory) and sends a request of its own (a forged "correct" file to store), then computes honestly.
# The socket's and token's paths are written in by the test, as a candidate could compute them.
REACHES_FOR_THE_SERVER = """import json, socket, sys
import torch
import torch.nn as nn

try:
    token = open({token!r}).read().strip()
    print("token: read", file=sys.stderr)
except Exception as exc:
    token = "0" * 64
    print("token:", type(exc).__name__, file=sys.stderr)
import os
try:  # or from the server's memory, where it keeps the token: the server is this process's parent
    open(f"/proc/{{os.getppid()}}/mem", "rb").read(1)
    print("server memory: read", file=sys.stderr)
except Exception as exc:
    print("server memory:", type(exc).__name__, file=sys.stderr)
try:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect({sock!r})
    conn.sendall(json.dumps({{"token": token, "config": {config!r}, "path": "forged.py", "task": "mse",
                             "backend": "cpu", "code": "raise SystemExit"}}).encode() + b"\\n")
    print("server said:", conn.recv(4096)[:200], file=sys.stderr)
except Exception as exc:
    print("connect:", type(exc).__name__, file=sys.stderr)

class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return ((predictions - targets) ** 2).mean()
"""


def _config(tmp: Path) -> Path:
    cfg = {"models": [{"name": "recorded", "provider": "replay", "replay_file": str(tmp / "none.jsonl")}],
           "tasks": {"names": ["mse"], "size": "small", "directory": str(ROOT / "reference_tasks")},
           "prompts_dir": str(ROOT / "prompts"), "samples": 1, "backend": "cpu",
           "evaluation": {"trials": 3, "timed_calls": 5, "warmup_calls": 1, "compile_baseline": False,
                          "check_shapes": False, "timeout_s": 120}}
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@contextlib.contextmanager
def _server(config: Path, db: Path):
    """`kgen serve` in its own process; yields it once its socket answers, and ends it with SIGTERM."""
    sock, token = serve.address(db)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", "-c", str(config), "--db", str(db)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not serve._listening(sock):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "kgen serve did not start listening"
            time.sleep(0.1)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    proc.output = proc.stdout.read()
    assert proc.returncode == 0, proc.output
    assert not sock.exists() and not token.exists()  # nothing left for a later server to trip on


def _eval(code: Path, config: Path, db: Path, *extra: str):
    started = time.monotonic()
    result = CliRunner().invoke(main, ["eval", str(code), "--task", "mse", "--backend", "cpu", "-c", str(config),
                                       "--db", str(db), "--json", *extra])
    out = json.loads(result.stdout)
    verified = out["verdict"] == "correct" and not out["flags"] and out["trusted"] and not out["device_unfit"]
    assert result.exit_code == (0 if verified else 1), result.output  # exit 0 only if verified
    print(f"SERVE kgen eval {' '.join(extra)}: {time.monotonic() - started:.2f} s wall; {result.stderr.strip()}")
    return json.loads(result.stdout), result.stderr


def test_kgen_eval_is_judged_by_a_warm_server_that_keeps_the_task_s_reference(tmp_path):
    config, db = _config(tmp_path), tmp_path / "db" / "kgen.db"
    code = tmp_path / "mine.py"
    code.write_text(HONEST)
    with _server(config, db) as server:
        first, said = _eval(code, config, db)
        assert "judged by kgen serve (pid %d)" % server.pid in said
        second, _ = _eval(code, config, db)
    for out in (first, second):  # a box too loaded to time leaves no figure, and says so
        assert out["verdict"] == "correct" and out["size"] == "small"
        assert out["time_ms"] > 0 if not out["device_unfit"] else out["time_ms"] is None, out
    # The first evaluation started the task's reference process; the second used it as it was:
    # no start-up, no baselines, and the same baselines it measured.
    assert "reference_startup" in first["phases"] and "reference_baselines" in first["phases"]
    assert not any(key.startswith("reference_") for key in second["phases"]), second["phases"]
    stored = Store.open(db)
    baselines = [stored.attempt(o["id"])["result"].baselines for o in (first, second)]
    assert baselines[0] is not None and baselines[0] == baselines[1]
    assert sorted(stored.attempt(o["id"])["verdict"] for o in (first, second)) == ["correct", "correct"]
    assert server.output.count("mse: correct") == 2
    # With no server listening, `kgen eval` judges the file itself, as before.
    local, said = _eval(code, config, db)
    assert local["verdict"] == "correct" and "reference_startup" in local["phases"] and "kgen serve" not in said


def test_the_server_answers_only_its_token_and_never_a_candidate_it_started(tmp_path):
    config, db = _config(tmp_path), tmp_path / "db" / "kgen.db"
    sock, token = serve.address(db)
    with _server(config, db) as server:
        # A process of the user's without the token: closed without a word, nothing judged.
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(sock))
        conn.sendall(json.dumps({"token": "0" * 64, "config": str(config.resolve()), "path": "x.py",
                                 "task": "mse", "backend": "cpu", "code": HONEST}).encode() + b"\n")
        conn.settimeout(30)
        assert conn.recv(4096) == b""
        conn.close()
        # A candidate that reaches for the server from inside its child: the token is out of its
        # reach (Landlock), and its connection is refused before the server reads it.
        code = tmp_path / "reach.py"
        code.write_text(REACHES_FOR_THE_SERVER.format(token=str(token), sock=str(sock), config=str(config.resolve())))
        out, _ = _eval(code, config, db)
        # The user's own `kgen eval` with another config for the same database: the server says so,
        # and the file is judged by the command itself, under its own config.
        other = tmp_path / "other" / "config.yaml"
        other.parent.mkdir()
        other.write_text(config.read_text())
        (tmp_path / "mine.py").write_text(HONEST)
        mine, said = _eval(tmp_path / "mine.py", other, db)
        assert f"kgen serve (pid {server.pid}) is listening for {db}, but this server serves {config.resolve()}" in said
        assert mine["verdict"] == "correct" and "reference_startup" in mine["phases"]
    assert out["verdict"] == "correct"
    stored = Store.open(db)
    # the forged request stored nothing: the candidate's own attempt, and the one judged locally
    assert sorted(a["id"] for a in stored.attempts(evals=True)) == sorted([out["id"], mine["id"]])
    log = stored.attempt(out["id"])["result"].output or ""
    # Refused, or not there at all (the jail's mount namespace has a /tmp of its own).
    assert re.search(r"token: (PermissionError|FileNotFoundError)", log), log
    assert re.search(r"server memory: (PermissionError|FileNotFoundError)", log), log
    # Refused before a byte was read: the server closed the connection (b'' or a reset), never answered;
    # or not reachable at all (the jail's mount namespace masks the folder that holds the socket).
    assert ("server said: b''" in log or "connect: ConnectionResetError" in log or "connect: BrokenPipeError" in log
            or "connect: FileNotFoundError" in log or "connect: PermissionError" in log), log
    assert "no request with this server's token" in server.output
    if not re.search(r"connect: (FileNotFoundError|PermissionError)", log):  # it reached the socket at all
        assert "is a process this server started" in server.output, server.output
    assert os.stat(sock.parent).st_mode & 0o077 == 0  # the folder is the user's alone


def test_a_kept_bench_is_retired_when_old_and_when_others_crowd_it_out(tmp_path):
    """Warm keeps a task's bench between evaluations, but not for ever: past max_age_s it is closed
    and a new one is opened (its held-out shapes drawn again, as for a new run), and past
    max_benches the oldest is closed. Each closed bench's reference process has ended."""
    from pipeline.config import load_config
    from pipeline.records import FileRequest
    from pipeline.run.single import Warm, evaluate_file

    config = _config(tmp_path)
    cfg = load_config(config)
    code = tmp_path / "mine.py"
    code.write_text(HONEST)
    warm = Warm(max_benches=1)
    try:
        def judged(size: str):
            result, _ = evaluate_file(FileRequest(path=str(code), task="mse", backend="cpu", size=size, store=False),
                                      cfg, warm=warm)
            assert result.verdict.value == "correct", result.error
            (bench, _), = warm.benches.values()
            return result, bench, [r.proc for r in bench.references.values()]

        _, bench, procs = judged("small")
        again, same, _ = judged("small")
        assert same is bench and not any(k.startswith("reference") for k in again.phases)
        warm.max_age_s = 0.0  # every kept bench is now too old
        aged, renewed, _ = judged("small")
        assert renewed is not bench and "reference_startup" in aged.phases
        assert all(p.poll() is not None for p in procs)  # the retired bench's reference ended
        warm.max_age_s = 1800.0
        crowded = [r.proc for r in renewed.references.values()]
        _, other, _ = judged("odd")  # a second task bench: the first is closed (max_benches=1)
        assert other is not renewed and len(warm.benches) == 1
        assert all(p.poll() is not None for p in crowded)
    finally:
        warm.close()
    assert not warm.benches


def test_a_server_that_dies_mid_request_is_one_line_and_a_new_one_starts(tmp_path):
    """kill -9 of the server while it judges: `kgen eval` says so in one line (no traceback), and a
    new `kgen serve` for the database takes over the socket the dead one left behind."""
    config, db = _config(tmp_path), tmp_path / "db" / "kgen.db"
    sock, token = serve.address(db)
    code = tmp_path / "slow.py"
    code.write_text(HONEST.replace("    def forward(self, predictions, targets):\n",
                                   "    def forward(self, predictions, targets):\n        import time; time.sleep(60)\n"))
    server = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", "-c", str(config), "--db", str(db)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not serve._listening(sock):
            assert server.poll() is None and time.monotonic() < deadline, "kgen serve did not start listening"
            time.sleep(0.1)
        client = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "eval", str(code), "--task", "mse",
                                   "--backend", "cpu", "-c", str(config), "--db", str(db)],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(5)  # the request is in: the server is judging it (its candidate sleeps in every call)
        server.kill()
        _, err = client.communicate(timeout=60)
    finally:
        server.kill()
        server.wait()
    assert client.returncode != 0
    assert "Error: kgen serve ended without a verdict" in err and "Traceback" not in err, err
    assert sock.exists()  # left behind by the killed server
    with _server(config, db):  # a new one starts on the stale socket
        pass


def test_a_sigterm_the_moment_the_token_is_written_ends_the_server_cleanly(tmp_path):
    """The server takes SIGTERM and SIGINT before it writes its token or binds its socket: a signal
    the moment the token exists ends it with status 0 and nothing left behind. Its handlers were
    installed after `listen` (and the judge's import), and a SIGTERM in between killed it outright
    (-15), its socket and token left for the next server (a fresh-clone CI run on a busy box)."""
    config, db = _config(tmp_path), tmp_path / "db" / "kgen.db"
    sock, token = serve.address(db)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", "-c", str(config), "--db", str(db)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not token.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "kgen serve wrote no token"
            time.sleep(0.001)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert not sock.exists() and not token.exists(), out


def test_eval_and_serve_judge_a_task_file_at_the_same_size(tmp_path):
    """With no config file, the same task file (1024 x 4096, no KGEN_SIZES) is judged at the size it
    states, by `kgen eval` alone and through `kgen serve`: both resolve it by one rule
    (pipeline.run.single.eval_size). The candidate fails as it loads: the size is chosen, and the
    reference's baselines timed at it, before any candidate runs, so a full judgement (a minute each
    at the default settings) would add nothing here."""
    from tests.test_eval_size import WIDE

    task = tmp_path / "wide.py"
    task.write_text(WIDE.format(sizes=""))
    code = tmp_path / "mine.py"
    code.write_text("import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def __init__(self, *args):\n"
                    "        super().__init__()\n        raise RuntimeError('fails as it loads')\n")
    db = tmp_path / "db" / "kgen.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sock, _ = serve.address(db)

    def judged(*extra: str) -> tuple[dict, str]:
        done = subprocess.run([sys.executable, "-m", "pipeline.cli", "eval", str(code), "--task", str(task),
                               "--backend", "cpu", "--db", str(db), "--json", *extra], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode in (0, 1) and done.stdout, done.stderr
        return json.loads(done.stdout), done.stderr

    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", "--db", str(db)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not serve._listening(sock):
            assert proc.poll() is None and time.monotonic() < deadline, "kgen serve did not start listening"
            time.sleep(0.1)
        served, said = judged()
        assert "judged by kgen serve" in said
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    local, said = judged("--local")
    assert "kgen serve" not in said
    assert served["verdict"] == local["verdict"] == "runtime_error", (served, local)
    assert (served["size"], served["size_dims"]) == (local["size"], local["size_dims"]) == (
        "default", {"batch_size": 1024, "dim": 4096})
