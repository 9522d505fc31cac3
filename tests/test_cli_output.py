"""What the CLI prints: one way to find the database (-c/--config, --db) on every command, untrusted
text shown literally, compiler errors first, tables that fit 80 columns, progress that says what is
happening piped or in a terminal, and `kgen eval` results kept apart from batch runs.

Attempts are written straight into temp SQLite databases through pipeline.store: nothing is built.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from rich.console import Console

from pipeline.cli.main import main
from pipeline.cli.progress import Progress
from pipeline.run.events import Answered, Building, Built, Planned, RunStart, Stored
from pipeline.build.build import NOTHING_TO_BUILD
from pipeline.records import Baselines, BuildResult, Completion, EvalResult, Flag, Provenance, Timing, Usage, Verdict
from pipeline.cli.show import render_attempt
from pipeline.store.store import Store
from pipeline.cli.tables import attempts_table, best_table, run_summary, short_error

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ["run", "attempts", "show", "eval", "best", "export", "report"]
# Markup-like text and terminal control sequences, as a model or a compiler might write them.
HOSTILE = "pp[i] += x[/x] [bold red]loud[/bold red] [link=file:///etc/passwd]y[/link] \x1b[2J\x1b]0;pwned\x07 \r\u202e"
COMPILER = "/tmp/kgen/builds/3f2a9c0d1e2b3a4f/main.cpp:37:18: error: 'foo' was not declared in this scope"
BUILD_LOG = (f"[1/2] c++ -MMD -MF main.o.d -c /tmp/kgen/builds/3f2a9c0d1e2b3a4f/main.cpp -o main.o\n"
             f"{COMPILER}\n   37 |     return foo(x);\n      |            ^~~\n"
             "ninja: build stopped: subcommand failed.\n"
             "Traceback (most recent call last):\n  File \"/usr/lib/torch/utils/cpp_extension.py\", line 2100\n"
             f"RuntimeError: Error building extension 'cand': {HOSTILE}\n")
CODE = f'import torch\n# {HOSTILE.replace(chr(13), "")}\nsrc = """\ntorch::Tensor f(torch::Tensor x) {{\n    return foo(x);\n}}\n"""\n'


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, n=20)


def _correct(ms: float, flags=()) -> EvalResult:
    return EvalResult(verdict=Verdict.correct, flags=list(flags), timing=_timing(ms), trusted=True,
                      baselines=Baselines(eager=_timing(1.0), compiled=_timing(0.8), floor_ms=0.1),
                      device="cpu: Test CPU", torch_version="2.13.0")


def _config(tmp: Path, database: str = "db/other.db") -> Path:
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "m", "provider": "replay", "replay_file": "none.jsonl"}],
                                    "database": database, "generated_dir": "gen"}))
    return path


def _env() -> dict[str, str]:
    """This checkout's kgen for a subprocess, wherever it runs."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _invoke(*args, **kwargs):
    return CliRunner().invoke(main, [str(a) for a in args], **kwargs)


@pytest.fixture
def filled(tmp_path):
    """A config whose database (db/other.db, not the default) holds one batch run: a build failure whose
    completion, reasoning, log and error are hostile text, two correct attempts (one flagged), and an
    impossible_timing; plus one `kgen eval` run with a correct attempt faster than all of them."""
    config = _config(tmp_path)
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "3f2a9c0d1e2b3a4f.py").write_text(CODE)
    ids = {}
    with Store.open(tmp_path / "db" / "other.db") as store:
        run = store.start_run("{}", "[]", "cpu", "cpu: Test CPU", "2.13.0", None)
        task_id = store.upsert_task("cross_entropy", "cross_entropy.py", "# task\n")
        prompt_id = store.save_prompt(task_id, "t", "cpu", f"Write a kernel. {HOSTILE}")
        completion = Completion(text=f"Here it is: {HOSTILE}\n```python\n{CODE}```", reasoning=f"think {HOSTILE}",
                                usage=Usage(prompt_tokens=10, completion_tokens=20))
        completion_id = store.save_completion(run, task_id, prompt_id, "qwen2.5-coder-32b-instruct", "replay", None,
                                              0, "k", completion, 0.0)
        store.save_build(BuildResult(code_hash="3f2a9c0d1e2b3a4f", ok=False, log=BUILD_LOG), "cpu", "2.13.0")
        plan = [("failed", "qwen2.5-coder-32b-instruct", completion_id, "3f2a9c0d1e2b3a4f",
                 EvalResult(verdict=Verdict.build_failed, error=COMPILER, detail=HOSTILE)),
                ("fast", "replay-demo", None, "a" * 16, _correct(0.5)),
                ("flagged", "replay-demo", None, "b" * 16, _correct(0.3, [Flag.no_custom_kernel])),
                ("impossible", "replay-demo", None, "c" * 16,
                 EvalResult(verdict=Verdict.impossible_timing, error=f"ran faster than memory allows {HOSTILE}"))]
        for sample, (key, model, comp, code_hash, result) in enumerate(plan):
            ids[key] = store.save_attempt(Provenance(run_id=run, task_id=task_id, task="cross_entropy", model=model,
                                                     sample=sample, backend="cpu", template="t", completion_id=comp,
                                                     code_hash=code_hash, size="small"), result)
        store.finish_run(run, "done")
        evalrun = store.start_run("{}", "[]", "cpu", "cpu: Test CPU", "2.13.0", None, note="kgen eval x.py",
                                  kind="eval")
        ids["eval"] = store.save_attempt(Provenance(run_id=evalrun, task_id=task_id, task="cross_entropy",
                                                    model="(file)", sample=0, backend="cpu", template="-",
                                                    completion_id=None, code_hash="d" * 16,
                                                    size="small"), _correct(0.1))
    return {"config": config, "dir": tmp_path, "db": tmp_path / "db" / "other.db", "run": run, "evalrun": evalrun,
            "ids": ids}


# One CLI


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_config_and_db_and_a_missing_config_is_one_line(command, tmp_path):
    usage = _invoke(command, "--help")
    assert "-c, --config FILE" in usage.output and "--db FILE" in usage.output
    args = {"show": ["01ABC"], "eval": [__file__, "--task", "mse"]}.get(command, [])
    result = _invoke(command, *args, "-c", tmp_path / "missing.yaml")
    assert result.exit_code == 1
    assert result.output == f"Error: -c {tmp_path / 'missing.yaml'}: no such config file\n"
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_readers_find_the_database_the_same_way(filled, monkeypatch):
    cfg, ids = filled["config"], filled["ids"]
    by_config = {
        "attempts": _invoke("attempts", "-c", cfg, "--json"),
        "best": _invoke("best", "-c", cfg, "--json"),
        "export": _invoke("export", "-c", cfg),
        "show": _invoke("show", ids["fast"], "-c", cfg),
    }
    for name, result in by_config.items():
        assert result.exit_code == 0, (name, result.output)
    assert ids["fast"] in by_config["attempts"].output and ids["fast"] in by_config["export"].output
    assert json.loads(by_config["best"].output.splitlines()[0])["attempt"] == ids["fast"]
    report = _invoke("report", "-c", cfg, "-o", filled["dir"] / "r.html")
    assert report.exit_code == 0 and (filled["dir"] / "r.html").exists(), report.output
    # With no -c, ./config.yaml is the config: its database, not db/kgen.db.
    monkeypatch.chdir(filled["dir"])
    assert ids["fast"] in _invoke("attempts", "--json").output
    # --db wins over the config; a database that is not there is one line, and is not created.
    missing = filled["dir"] / "nope.db"
    for command, args in (("attempts", []), ("best", []), ("export", []), ("report", []), ("show", ["01ABC"])):
        result = _invoke(command, *args, "-c", cfg, "--db", missing)
        assert result.exit_code == 1 and result.output == (
            f"Error: {missing}: no database (run `kgen run` first, or pass --db)\n"), command
    assert not missing.exists()


def test_an_empty_result_says_nothing_matched(filled):
    cfg = filled["config"]
    # Values the database knows, that no attempt has together: nothing matched (an unknown value is an
    # error: test_an_unknown_filter_value_is_one_line_listing_the_valid_ones).
    table = _invoke("attempts", "-c", cfg, "--task", "cross_entropy", "--verdict", "mismatch")
    assert table.exit_code == 0 and table.output == "No attempts match task cross_entropy, verdict mismatch.\n"
    as_json = _invoke("attempts", "-c", cfg, "--model", "qwen2.5-coder-32b-instruct", "--verdict", "correct", "--json")
    assert as_json.stdout == "" and as_json.stderr == (
        "No attempts match model qwen2.5-coder-32b-instruct, verdict correct.\n")
    report = _invoke("report", "-c", cfg, "--run", filled["run"], "-o", filled["dir"] / "r.html")
    assert report.exit_code == 0 and report.output.startswith("wrote ")
    with Store.open(filled["db"]) as store:
        empty_run = store.start_run("{}", "[]", "cpu", "cpu", "2.13.0", None)
    empty = _invoke("report", "-c", cfg, "--run", empty_run, "-o", filled["dir"] / "e.html")
    assert empty.output == f"No attempts match run {empty_run}; no report written.\n"
    assert not (filled["dir"] / "e.html").exists()
    assert _invoke("best", "-c", cfg, "--task", "cross_entropy", "--backend", "cuda").output == (
        "No verified attempt for task cross_entropy.\n")


@pytest.mark.parametrize("args, valid", [
    (["attempts", "--verdict", "nosuch"], "'extract_failed', 'build_failed',"),
    (["attempts", "--flag", "no_kernel"], "'no_custom_kernel', 'shape_specialized'"),
    (["attempts", "--task", "cross_entropi"], "'cross_entropy'"),
    (["attempts", "--model", "qwen"], "'(file)', 'qwen2.5-coder-32b-instruct', 'replay-demo'"),
    (["best", "--task", "cross_entropi"], "'cross_entropy'"),
    (["export", "--verdict", "nosuch"], "'correct'"),
])
def test_an_unknown_filter_value_is_one_line_listing_the_valid_ones(filled, args, valid):
    # The installed command, as a user types it: exit status 2 (a usage error), one line on stderr.
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", *args, "-c", str(filled["config"])],
                            capture_output=True, text=True, cwd=filled["dir"], env=_env())
    option, value = args[1], args[2]
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"Error: Invalid value for '{option}': '{value}' is not a {option[2:]}")
    assert valid in result.stderr


def test_eval_results_stay_out_of_best_export_and_report_unless_asked(filled):
    cfg, ids = filled["config"], filled["ids"]
    best = [json.loads(line) for line in _invoke("best", "-c", cfg, "--json").output.splitlines()]
    assert [b["attempt"] for b in best] == [ids["fast"]]  # the eval's 0.1 ms kernel is not the leaderboard's
    exported = {json.loads(line)["id"] for line in _invoke("export", "-c", cfg).output.splitlines()}
    assert ids["eval"] not in exported and ids["fast"] in exported
    assert ids["eval"] in {json.loads(line)["id"] for line in _invoke("export", "-c", cfg, "--evals").output.splitlines()}
    only = _invoke("export", "-c", cfg, "--run", filled["evalrun"])
    assert [json.loads(line)["id"] for line in only.output.splitlines()] == [ids["eval"]]
    listed = _invoke("attempts", "-c", cfg, "--run", "latest", "--json")  # latest: the newest batch run
    assert {json.loads(line)["run"] for line in listed.output.splitlines()} == {filled["run"]}
    report = _invoke("report", "-c", cfg, "-o", filled["dir"] / "r.html")
    assert report.output.startswith("wrote ") and " 4 attempts" in report.output
    assert " 5 attempts" in _invoke("report", "-c", cfg, "--evals", "-o", filled["dir"] / "r.html").output


def test_eval_runs_from_before_the_run_kind_are_recognised(tmp_path):
    path = tmp_path / "old.db"
    with Store.open(path) as store:
        batch = store.start_run("{}", "[]", "cpu", "cpu", "2.13.0", None)
        old = store.start_run("{}", "[]", "cpu", "cpu", "2.13.0", None, note="kgen eval mine.py")
    with sqlite3.connect(path) as con:  # the database as it was before migration m008
        con.execute("ALTER TABLE runs DROP COLUMN kind")
        con.execute("DELETE FROM _kgen_migrations WHERE name = 'm008_run_kind'")
    with Store.open(path) as store:
        assert (store.get_run(old)["kind"], store.get_run(batch)["kind"]) == ("eval", "batch")
        assert store.latest_run_id() == batch and store.latest_run_id(evals=True) == old


# Untrusted text is text


def _assert_literal(output: str) -> None:
    for part in ("pp[i] += x[/x] [bold red]loud[/bold red] [link=file:///etc/passwd]y[/link]",
                 "\\x1b[2J\\x1b]0;pwned\\x07 \\r\\u202e"):
        assert part in output, part
    assert "\x1b" not in output and "\x07" not in output and "\r" not in output and "\u202e" not in output


def test_show_prints_hostile_text_exactly_and_compiler_errors_first(filled):
    result = _invoke("show", filled["ids"]["failed"], "-c", filled["config"], "--full")
    assert result.exit_code == 0, result.output
    out = result.output
    _assert_literal(out)
    assert "Write a kernel. pp[i]" in out and "think pp[i]" in out and "Here it is: pp[i]" in out
    # The compiler's error, located in the candidate's file, comes before the log and its traceback.
    first = out.index("main.cpp:37:18: error: 'foo' was not declared in this scope")
    assert first < out.index("prompt") < out.index("Traceback (most recent call last)")
    assert "line 5 of the candidate: return foo(x);" in out
    # A terminal gets colours, never the candidate's control sequences.
    with Store.open(filled["db"]) as store:
        attempt = store.attempt(filled["ids"]["failed"])
    term = io.StringIO()
    render_attempt(Console(file=term, force_terminal=True, width=100), attempt, CODE, True, [])
    assert "\x1b[2J" not in term.getvalue() and "\x07" not in term.getvalue() and "\\x1b[2J" in term.getvalue()


def test_tables_and_errors_print_hostile_text_literally(filled):
    out = _invoke("attempts", "-c", filled["config"], "--wide", env={"COLUMNS": "400"}).output
    assert "ran faster than memory allows pp[i] += x[/x] [bold red]loud[/bold red]" in out
    assert "\x1b" not in out and "\x07" not in out
    assert short_error(COMPILER) == "main.cpp:37:18: error: 'foo' was not declared in this scope"
    assert short_error("x\x1b[2Jy\nsecond line") == "x\\x1b[2Jy"


# Readable everywhere


def _render(renderable, width: int = 80) -> str:
    out = io.StringIO()
    Console(file=out, width=width).print(renderable)
    return out.getvalue()


def test_tables_fit_80_columns_with_ids_and_verdicts_whole(filled):
    with Store.open(filled["db"]) as store:
        rows = store.attempts(run=filled["run"])
        summary = "".join(_render(part) for part in run_summary(store, filled["run"], "cpu"))
        from pipeline.leaderboard import best_rows

        board = best_rows(store.attempts(verdict="correct"))
    listed = _render(attempts_table(rows))
    best = _render(best_table(board, {r["id"]: (True, False) for r in board}))
    for name, text in (("attempts", listed), ("summary", summary), ("best", best)):
        assert max(len(line) for line in text.splitlines()) <= 80, (name, text)
    for r in rows:
        assert r["id"] in listed
    for verdict in ("build_failed", "correct*", "impossible_timing"):
        assert verdict in listed, verdict
    # The compiler's message is whole, on its own line under its row, not cut to the path.
    assert "main.cpp:37:18: error: 'foo' was not declared in this scope" in listed
    assert "/tmp/kgen/builds" not in listed
    assert "cross_entropy" in summary and "qwen2.5-cod" in summary and "replay-demo" in summary
    assert board[0]["id"] in best and "eager" in best
    # --wide, piped, gets the room to show every column rather than folding them.
    wide = _invoke("attempts", "-c", filled["config"], "--wide").output
    assert "x compile" in wide and "no_custom_kernel" in wide and "qwen2.5-coder-32b-instruct" in wide
    default = _invoke("attempts", "-c", filled["config"], env={"COLUMNS": "80"}).output
    assert max(len(line) for line in default.splitlines()) <= 80 and filled["ids"]["failed"] in default


def _slot(task="mse", model="m", sample=0):
    from types import SimpleNamespace

    return SimpleNamespace(task=SimpleNamespace(name=task), model=SimpleNamespace(name=model), sample=sample,
                           turn=0, generation=0)


def test_piped_progress_prints_a_line_per_stage_and_a_periodic_summary(capsys):
    progress = Progress(Console(file=io.StringIO(), force_terminal=False), interval=0.05)
    with progress:
        progress.event(RunStart(run_id="01RUN", resumed=False, tasks=7, models=1, samples=2, backend="cpu",
                                strategy="single", stored=0, todo=14, build_workers=1))
        slot = _slot()
        progress.event(Planned(slot))
        progress.event(Answered(slot, Completion(text="x", seconds=2.0, usage=Usage(completion_tokens=99))))
        progress.event(Building(slot))
        time.sleep(0.2)  # a long build: the log still moves
        progress.event(Built(slot, BuildResult(code_hash="h", ok=False, seconds=31, log=f"{COMPILER}\x1b[2J")))
        progress.event(Stored(slot, EvalResult(verdict=Verdict.build_failed, error=COMPILER)))
        for n, built in enumerate([BuildResult(code_hash="k", ok=True, seconds=18.4, cached=True),
                                   BuildResult(code_hash="p", ok=True, log=NOTHING_TO_BUILD)], start=1):
            other = _slot(sample=n)
            progress.event(Built(other, built))
    lines = capsys.readouterr().out.splitlines()
    assert "run 01RUN: 7 tasks x 1 model x 2 samples on cpu; 14 slots to do" in lines[0]
    assert "built before it is judged, 1 at a time: a C++ extension" in lines[1] and "30-90 s" in lines[1]
    text = "\n".join(lines)
    assert "answered  mse / m / sample 0: answer in 2.0 s, 99 tokens" in text
    assert "built     mse / m / sample 0: build failed after 31 s: main.cpp:37:18: error: 'foo'" in text
    assert "stored    mse / m / sample 0: build_failed" in text
    assert "built     mse / m / sample 1: kept from an earlier build (18 s then)" in text
    assert "built     mse / m / sample 2: nothing to build (no C++ extension)" in text
    ticks = [line for line in lines if " progress " in line]
    assert any("model answers 1/1; builds 0/1;" in tick for tick in ticks)  # printed while the build ran
    assert "attempts stored 1/1 (1 failed)" in lines[-1] and " done " in lines[-1]
    assert "\x1b" not in text


def test_the_build_count_says_the_headers_are_being_made(capsys):
    """While a new venv's fast-build headers are precompiled (minutes), the builds stand at 0/n: the
    progress line and the build bar say what is happening, and stop saying it once they are ready."""
    from pipeline.build.headers import PREPARING, READY
    from pipeline.run.events import LaneNotice

    progress = Progress(Console(file=io.StringIO(), force_terminal=False), interval=0)
    with progress:
        slot = _slot()
        progress.event(Building(slot))
        progress.event(LaneNotice(f"{PREPARING}: precompiling torch's headers"))
        assert progress.summary().split("; ")[1] == f"builds 0/1 ({PREPARING})"
        note = progress.bars.tasks[progress.ids["build"]].fields["note"]
        assert note.plain == PREPARING
        progress.event(LaneNotice(f"{READY} in 165 s"))
        assert progress.summary().split("; ")[1] == "builds 0/1"
    out = capsys.readouterr().out
    assert f"note      {PREPARING}: precompiling" in out and f"{READY} in 165 s" in out


def test_a_resumed_run_shows_its_stored_attempts_not_0_of_0(tmp_path):
    """A real Runner resuming a run whose every slot is stored: the bars count them."""
    import asyncio

    from pipeline.config import load_config
    from pipeline.run.batch import Runner

    replay = tmp_path / "replay.jsonl"
    replay.write_text(json.dumps({"task": "mse", "backend": "cpu", "text": "none"}) + "\n")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"models": [{"name": "r", "provider": "replay", "replay_file": str(replay)}],
                                      "tasks": {"names": ["mse", "huber"], "size": "small",
                                                "directory": str(ROOT / "reference_tasks")},
                                      "prompts_dir": str(ROOT / "prompts"), "samples": 2, "backend": "cpu"}))
    cfg = load_config(config)
    store = Store.open(cfg.path(cfg.database))
    out = io.StringIO()
    progress = Progress(Console(file=out, force_terminal=True, width=120))
    runner = Runner(cfg, store, on_event=progress.event)
    run_id = store.start_run("{}", "[]", "cpu", "cpu", "2.13.0", None, key=runner.key)
    for slot in runner.slots:
        store.save_attempt(Provenance(run_id=run_id, task_id="t", task=slot.task.name, model=slot.model.name,
                                      sample=slot.sample, backend="cpu", template=slot.template, completion_id=None,
                                      code_hash=None, size="small"), EvalResult(verdict=Verdict.extract_failed,
                                      error="no code"))
    with progress:
        assert asyncio.run(runner.run()) == run_id
    bars = {t.description: (t.completed, t.total) for t in progress.bars.tasks}
    assert bars["attempts stored"] == (4, 4)
    assert f"resuming run {run_id}" in out.getvalue() and "4 attempts stored before, 0 slots to do" in out.getvalue()
    assert "4/4" in out.getvalue()
