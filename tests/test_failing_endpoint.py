"""A search against an endpoint that fails: the local OpenAI-compatible test server (tests/chat_server.py)
down, hung or refusing for the first requests, then answering as the scripted model
(tests/search_model.py). Each run is a real `kgen run` process over real SQLite and the real openai
client: a failed call is stored but is no turn, the run says so (exit 3, the command that redoes it),
a resume asks it again and finishes the search; Ctrl-C and SIGTERM end a run as interrupted."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import yaml
from click.testing import CliRunner

from chat_server import Drop, Failure, Hang, Reply, serve
from test_run import ROOT, run
from test_search import search_config

from pipeline.cli.main import main
from pipeline.generate import feedback
from pipeline.records import EvalResult, Verdict

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
NEVER_SAID = ("(no answer)", "model_error", "The model call failed")


def _config(tmp: Path, base_url: str, names: tuple[str, ...], search: dict, **model) -> Path:
    path = search_config(tmp, base_url, names=names, search=search)
    data = yaml.safe_load(path.read_text())
    data["models"][0].update(model)
    path.write_text(yaml.safe_dump(data))
    return path


def _kgen(tmp: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "-c", str(config), *args], cwd=tmp,
                          capture_output=True, text=True, timeout=600, env=ENV)


def _rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return [tuple(r) for r in con.execute(sql).fetchall()]


def _never_told_of_a_failed_call(server) -> None:
    for r in server.requests:
        for m in r.body["messages"]:
            assert not any(s in m["content"] for s in NEVER_SAID), m["content"][-300:]


def no_code(body: dict) -> Reply:
    """A model that never writes ModelNew: each answer is refused before any build (extract_failed),
    so a conversation runs all its turns in milliseconds, each with the judge's feedback."""
    return Reply(content=f"I would need more time ({len(body['messages'])} messages so far).")


def test_refine_over_an_endpoint_down_then_hung_for_the_first_turn_resumes_from_that_turn(tmp_path):
    """The first turn of both conversations fails (one connection dropped, one hung: noticed after
    the 2 s idle limit, not the 60 s timeout): stored as model_error with no feedback, nothing more
    asked, exit 3 naming the endpoint and the command that redoes them. Both failures are transient,
    so a plain resume asks those turns again and the conversations run their three turns, each
    after the feedback on the one before, as if nothing had failed."""
    search = {"strategy": "refine", "max_turns": 3}
    with serve([Hang(60), Drop(), no_code], max_requests=20) as server:
        config = _config(tmp_path, server.base_url, ("hinge", "huber"), search, idle_timeout_s=2, timeout_s=60)
        db = tmp_path / "db" / "kgen.db"
        start = time.monotonic()
        first = _kgen(tmp_path, config)
        assert time.monotonic() - start < 50  # the hung call was not waited out
        assert first.returncode == 3, first.stderr[-2000:]
        assert len(server.requests) == 2  # no second turn after a failed first one
        line = first.stderr.strip().splitlines()[-1]
        assert line.startswith("2 model calls failed (first: ") and server.base_url in line, line
        assert line.endswith(f"kgen run -c {config} --retry-errors redoes them"), line
        assert "2 model calls failed: not judged" in first.stdout
        failed = _rows(db, "SELECT task, turn, verdict, feedback, error FROM attempts ORDER BY task")
        assert [(t, turn, v, f) for t, turn, v, f, _ in failed] == [("hinge", 0, "model_error", None),
                                                                    ("huber", 0, "model_error", None)]
        errors = sorted(e for *_, e in failed)
        assert errors[0].startswith(f"APIConnectionError: {server.base_url}: ")
        assert errors[1].startswith(f"APITimeoutError: {server.base_url}: nothing received for 2 s (idle_timeout_s)")
        assert _rows(db, "SELECT status FROM runs") == [("model_errors",)]
        listed = CliRunner().invoke(main, ["attempts", "-c", str(config)])
        assert "APITimeoutError" in listed.stdout and "2 of these are failed model calls" in listed.stderr

        run(config)  # a plain resume (in this process: the exit status was seen above): they were transient
        assert len(server.requests) == 2 + 6
        _never_told_of_a_failed_call(server)
        turns = _rows(db, "SELECT task, turn, verdict, feedback IS NOT NULL FROM attempts ORDER BY task, turn")
        assert turns == [(t, n, "extract_failed", 1) for t in ("hinge", "huber") for n in range(3)]
        assert _rows(db, "SELECT count(*) FROM completions WHERE error IS NOT NULL") == [(2,)]  # kept
        sent = json.loads(_rows(db, "SELECT messages_json FROM attempts WHERE task = 'huber' AND turn = 2")[0][0])
        assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
        assert "(turn 2 of 3) was judged: extract_failed" in sent[4]["content"]
        assert _rows(db, "SELECT status FROM runs") == [("done",)]
        run(config)
        assert len(server.requests) == 8  # nothing left to ask


def test_evolve_stops_at_a_failed_call_and_retry_errors_finishes_it(tmp_path):
    """Evolve: a child of generation 0 whose call fails (a 400, not transient: a plain resume leaves
    it) stops the evolution after that generation, whose archive the next one needs; --retry-errors
    asks that child again, then the second generation runs."""
    search = {"strategy": "evolve", "generations": 2, "population": 2, "fix_turns": 1}
    with serve([Failure(400, message="no such adapter", retry_after_ms=None), no_code], max_requests=20) as server:
        config = _config(tmp_path, server.base_url, ("hinge",), search)
        db = tmp_path / "db" / "kgen.db"
        first = _kgen(tmp_path, config)
        assert first.returncode == 3, first.stderr[-2000:]
        assert "1 model call failed (first: BadRequestError: " in first.stderr, first.stderr[-2000:]
        assert "no such adapter" in first.stderr and "--retry-errors redoes it" in first.stderr
        assert len(server.requests) == 3  # the failed child, and the other's two turns
        gens = "SELECT generation, sample, turn, verdict FROM attempts ORDER BY generation, sample, turn"
        failed_child = next(s for g, s, t, v in _rows(db, gens) if v == "model_error")
        assert sorted(v for *_, v in _rows(db, gens)) == ["extract_failed"] * 2 + ["model_error"]
        run(config)  # a plain resume (in this process, as the next): a 400 is not transient, nothing is asked
        assert len(server.requests) == 3 and _rows(db, "SELECT status FROM runs") == [("model_errors",)]

        run(config, retry_errors=True)
        # The failed child's two turns. Generation 1 has no parent (nothing verified), so its prompts
        # are generation 0's, answered from this run's completions.
        assert len(server.requests) == 3 + 2
        _never_told_of_a_failed_call(server)
        assert _rows(db, gens) == [(g, s, t, "extract_failed") for g in (0, 1) for s in (0, 1) for t in (0, 1)]
        redone = _rows(db, f"SELECT count(*) FROM completions WHERE sample = {failed_child} AND error IS NULL")
        assert redone == [(2,)]
        assert _rows(db, "SELECT status FROM runs") == [("done",)]


def test_new_draws_new_answers_and_a_resume_reuses_them(tmp_path):
    with serve([no_code], max_requests=20) as server:
        config = search_config(tmp_path, server.base_url, names=("hinge",), search={"strategy": "refine",
                                                                                      "max_turns": 2})
        first, _ = run(config)
        again, _ = run(config)
        assert again == first and len(server.requests) == 2  # the same plan: resumed, nothing asked
        fresh, store = run(config, fresh=True)
        assert fresh != first and len(server.requests) == 4  # a new run asks afresh
        asked = [r["run_id"] for r in store.db.query("SELECT run_id FROM completions ORDER BY id")]
        assert asked == [first, first, fresh, fresh]


def test_ctrl_c_under_a_closed_pipe_exits_130_with_the_resume_line_and_sigterm_143(tmp_path):
    """`kgen run` waiting on a hung model call, the reader of its stdout's pipe gone (`kgen run | tee
    log`, then Ctrl-C, which ends tee too): SIGINT ends it with 130, SIGTERM with 143, each with the
    resume line and the run marked interrupted. Both at once, to share the wait for torch's import."""
    signals = {signal.SIGINT: 130, signal.SIGTERM: 143}
    with serve([Hang(120)], max_requests=5) as a, serve([Hang(120)], max_requests=5) as b:
        started = {}
        for sig, server in zip(signals, (a, b)):
            folder = tmp_path / sig.name
            folder.mkdir()
            config = _config(folder, server.base_url, ("hinge",), {"strategy": "refine", "max_turns": 2})
            started[sig] = (server, config, subprocess.Popen(
                [sys.executable, "-m", "pipeline.cli", "run", "-c", str(config)], cwd=folder, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(server.requests for server, *_ in started.values()):
            time.sleep(0.05)
        for sig, (server, config, proc) in started.items():
            assert server.requests, proc.stderr.read() if proc.poll() is not None else "no request"
            proc.stdout.close()
            os.killpg(proc.pid, sig)
        for sig, (server, config, proc) in started.items():
            code, err = proc.wait(timeout=60), proc.stderr.read()
            assert code == signals[sig], err[-2000:]
            assert err.strip().splitlines()[-1] == (f"Interrupted: the attempts so far are stored; resume with: "
                                                    f"kgen run -c {config}"), err[-2000:]
            assert _rows(config.parent / "db" / "kgen.db", "SELECT status FROM runs") == [("interrupted",)]


# ---- what the model and the error column are told of a failure ------------------------------------

def _traceback() -> str:
    import traceback

    def fma_cpu(*args):
        raise TypeError("fma_cpu(): incompatible function arguments. The following argument types are supported:\n"
                        "    1. (arg0: at::Tensor, arg1: at::Tensor, arg2: float) -> at::Tensor\n\n"
                        "Invoked with: tensor([[0.1652, 0.3081],\n        [0.1379, 0.5230]]), tensor([2.]), 'x'")

    try:
        fma_cpu(1)
    except TypeError:
        return traceback.format_exc()
    raise AssertionError


def test_a_runtime_error_carries_the_lines_that_explain_it_bounded():
    error = ("forward: TypeError: fma_cpu(): incompatible function arguments. The following argument types "
             "are supported:")
    explained = feedback.explained(EvalResult(verdict=Verdict.runtime_error, error=error, detail=_traceback()))
    lines = explained.error.splitlines()
    assert lines[0] == error and lines[1].startswith("at File ") and "in fma_cpu" in lines[1]
    assert "1. (arg0: at::Tensor, arg1: at::Tensor, arg2: float) -> at::Tensor" in explained.error
    # the argument types stay, the judge's input values do not (a tensor's values print as tensor(...))
    assert lines[-1] == "Invoked with: tensor(...), tensor(...), 'x'" and "0.1652" not in explained.error
    text = feedback.render("feedback.j2", ROOT / "prompts", explained, turn=0, max_turns=2)
    assert "Invoked with: tensor(...)" in text and "arg2: float" in text and "0.5230" not in text
    from pipeline.cli.tables import ERROR_CELL, short_error

    assert "Invoked with" in short_error(explained.error, *ERROR_CELL)
    long = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n" + "E: " + "\n".join(
        f"line {i} " + "y" * 300 for i in range(100))
    bounded = feedback.explain_error("forward: E: something", long)
    assert len(bounded) <= feedback.ERROR_CHARS and len(bounded.splitlines()) <= feedback.ERROR_LINES + 1
    assert feedback.explain_error("forward: E", "child output, no traceback") == "forward: E"
