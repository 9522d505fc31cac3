"""Search (pipeline.run.search): refine and evolve against the local OpenAI-compatible test server, whose
scripted model (tests/search_model.py) fixes only what the judge's feedback shows it."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from click.testing import CliRunner

from chat_server import serve
from search_model import MSE_BROKEN_LINE, answer
from test_run import ROOT, _count, run

from pipeline.generate import feedback
from pipeline.cli.main import main
from pipeline.generate.diagnostics import Diagnostic
from pipeline.records import Baselines, EvalResult, Flag, Timing, TrialResult, Verdict

TASKS = ("cosine", "cross_entropy", "hinge", "huber", "kl_div", "mse", "triplet")
PROMPTS = ROOT / "prompts"


def search_config(tmp: Path, base_url: str, names=TASKS, search: dict | None = None, **extra) -> Path:
    cfg = {
        "models": [{"name": "scripted", "provider": "openai", "model": "scripted", "base_url": base_url,
                    "max_retries": 0}],
        "tasks": {"names": list(names), "size": "small", "directory": str(ROOT / "reference_tasks")},
        "prompts_dir": str(PROMPTS),
        "samples": 1,
        "backend": "cpu",
        "evaluation": {"trials": 3, "timed_calls": 8, "timed_ms": 0, "warmup_calls": 1, "compile_baseline": False,
                       "check_shapes": False, "profile": False, "timeout_s": 120},
        **({"search": search} if search else {}),
        **extra,
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _last_turns(store, run_id) -> dict[str, dict]:
    last: dict[str, dict] = {}
    for a in store.attempts(run=run_id):
        if a["task"] not in last or a["turn"] > last[a["task"]]["turn"]:
            last[a["task"]] = a
    return last


# ---- feedback, rendered from typed results --------------------------------------------------------

def test_feedback_shows_what_a_model_can_act_on_and_nothing_secret():
    build = feedback.render("feedback.j2", PROMPTS, EvalResult(verdict=Verdict.build_failed, error="main.cpp:9: error"),
                            [Diagnostic(file="main.cpp", line=9, column=16, message="'dd' was not declared in this scope",
                                        source_line="acc += d * dd;", candidate_line=15)], turn=0, max_turns=3)
    assert "line 15 of your code: error: 'dd' was not declared in this scope" in build
    assert "acc += d * dd;" in build and "turn 1 of 3" in build and "Fix it." in build

    failing = TrialResult(index=2, variant="scaled", ok=False, verdict=Verdict.mismatch, error="max relative error",
                          max_abs_err=3.5, max_rel_err=0.25, worst_index=[7, 3], expected=14.0, got=10.5)
    passing = TrialResult(index=0, variant="base", ok=True, max_abs_err=1e-7, max_rel_err=2e-8)
    wrong = feedback.render("feedback.j2", PROMPTS, EvalResult(verdict=Verdict.mismatch, error="trial 2 (scaled): x",
                                                               trials=[passing, failing]), turn=1, max_turns=3)
    assert "Worst element at index [7, 3]: expected 14, got 10.5" in wrong
    assert "trial 2 (input family: scaled), after 1 trial passed (base)" in wrong
    assert "the error grows on the scaled inputs" in wrong
    assert "seed" not in wrong.lower()

    timing = Timing(median_ms=2.0, p25_ms=1.9, p75_ms=2.1, n=40)
    correct = EvalResult(verdict=Verdict.correct, timing=timing, flags=[Flag.no_custom_kernel],
                         eager_beside=Timing(median_ms=3.0, p25_ms=2.9, p75_ms=3.1, n=40),
                         baselines=Baselines(compiled=Timing(median_ms=1.0, p25_ms=1, p75_ms=1, n=40), floor_ms=0.5),
                         detail=json.dumps({"event": "profile_done", "total_us": 2000.0, "torch_us": 1900.0,
                                            "torch_fraction": 0.95, "top": [["aten::mul", 1500.0]]}))
    fast = feedback.render("feedback.j2", PROMPTS, correct, turn=2, max_turns=3)
    for part in ("yours: 2.0", "eager PyTorch, timed beside yours: 3.0 (you are 1.5x as fast)",
                 "torch.compile: 1.0 (you are 0.5x as fast)", "bandwidth floor", "you run at 25.0% of the floor's speed",
                 "aten::mul 1500.0 us", "95% of it", "Flag no_custom_kernel:", "Make it faster"):
        assert part in fast, part


def test_a_template_that_names_an_unknown_variable_is_an_error():
    import pytest

    from pipeline.generate.prompts import PromptError

    with pytest.raises(PromptError, match="undefined"):
        feedback.render("one_shot.j2", PROMPTS, EvalResult(verdict=Verdict.correct))


# ---- the searches ---------------------------------------------------------------------------------

def test_refine_fixes_what_single_cannot_and_only_from_the_feedback(tmp_path):
    """Turn 1 is the single-shot answer: mse does not build and huber is wrong; cosine is correct but
    slow; hinge is right and fast at once. refine (on those four: the other three losses behave as
    hinge does, and judging them cost 40 s of CI): all end correct, each fix coming the turn after
    the feedback that shows it,
    and cosine reaches its fast version from the timing feedback. Then a feedback template that
    shows only the verdict: the same model cannot fix mse (it needs the compiler's line). (A
    separate single-shot run would judge the same seven first answers again: 60 s of CI.)"""
    with serve([answer], max_requests=200) as server:
        # The target: slow cosine (64 recomputes, about 0.03x eager) sits far below it. With 8 it read
        # 0.14-0.20x idle on the 2-core box; with 8 and then 24 it reached 0.25 at turn 0 in two
        # fresh-clone runs (cause not found). Everything else 0.36x (mse's serial C++
        # loop) to 1.08x.
        search = {"strategy": "refine", "max_turns": 3, "target": {"speedup_eager": 0.25}}
        tasks = ("cosine", "hinge", "huber", "mse")
        config = search_config(tmp_path, server.base_url, names=tasks, search=search)
        refine_id, store = run(config)
        single = {a["task"]: a for a in store.attempts(run=refine_id, turn=0)}
        assert set(single) == set(tasks)
        assert single["mse"]["verdict"] == "build_failed" and single["huber"]["verdict"] == "mismatch"
        assert sum(a["verdict"] == "correct" for a in single.values()) == 2
        slow = single["cosine"]["speedup_eager"]
        last = _last_turns(store, refine_id)
        assert {t: a["verdict"] for t, a in last.items()} == {t: "correct" for t in tasks}
        first_correct = {t: min(a["turn"] for a in store.attempts(run=refine_id, task=t) if a["verdict"] == "correct")
                         for t in tasks}
        assert first_correct == {t: 1 if t in ("mse", "huber") else 0 for t in tasks}  # cosine: slow, but correct
        # Each conversation ends at the first attempt that reaches the target (or after max_turns):
        # hinge at once, cosine at its fast version. On a busy box the judge may mark a timing unfit
        # for the load, which never reaches a target (pipeline.run.search.reached): the conversation
        # then goes on, and the turn it ends on moves with it.
        turns = {t: sorted(store.attempts(run=refine_id, task=t), key=lambda a: a["turn"]) for t in tasks}
        for t, rows in turns.items():
            ends = [a["turn"] for a in rows if a["verdict"] == "correct" and not a["device_unfit"]
                    and (a["speedup_eager"] or 0) >= 0.25]
            assert last[t]["turn"] == (ends[0] if ends else 2), (t, [(a["turn"], a["verdict"], a["speedup_eager"],
                                                                     a["device_unfit"]) for a in rows])
        assert turns["hinge"][0]["device_unfit"] or last["hinge"]["turn"] == 0  # right and fast enough at once
        assert len(turns["cosine"]) > 1, [(a["turn"], a["verdict"], a["speedup_eager"], a["time_ms"], a["eager_ms"],
                                          a["device_unfit"]) for a in turns["cosine"]]
        fast = turns["cosine"][1]
        assert fast["verdict"] == "correct", fast
        if not (single["cosine"]["device_unfit"] or fast["device_unfit"]):
            # A ratio only between two timings fit to compare: beside another suite the slow one's
            # eager, slowed 16x with it, read 1.53x, and the judge marked it loaded.
            assert fast["speedup_eager"] > 3 * slow, (slow, fast)
        assert fast["device_unfit"] or last["cosine"]["turn"] == 1
        mse_feedback = store.attempt(store.attempts(run=refine_id, task="mse", turn=0)[0]["id"])["feedback"]
        assert f"line {MSE_BROKEN_LINE} of your code: error:" in mse_feedback
        turn2 = store.attempt(store.attempts(run=refine_id, task="mse", turn=1)[0]["id"])
        sent = json.loads(turn2["messages_json"])
        assert [m["role"] for m in sent] == ["user", "assistant", "user"] and sent[2]["content"] == mse_feedback
        assert json.loads(turn2["parents"]) == [store.attempts(run=refine_id, task="mse", turn=0)[0]["id"]]

        db = str(tmp_path / "db" / "kgen.db")
        shown = CliRunner().invoke(main, ["show", turn2["id"], "--db", db, "-c", str(config)])
        assert shown.exit_code == 0, shown.output
        assert "search chain" in shown.output and "turn 1: build_failed" in shown.output
        listed = CliRunner().invoke(main, ["attempts", "--db", db, "--run", refine_id, "--turn", "2", "--json"])
        second = {t for t, rows in turns.items() if len(rows) > 1}  # cosine, huber and mse on an idle box
        assert {"cosine", "huber", "mse"} <= second
        assert {json.loads(line)["task"] for line in listed.output.splitlines()} == second
        html = tmp_path / "report.html"
        reported = CliRunner().invoke(main, ["report", "--db", db, "--run", refine_id, "-o", str(html)])
        assert reported.exit_code == 0, reported.output
        page = html.read_text()
        assert "Search, by turn" in page and 'id="search-steps"' in page
        # turn 1: the 4 single-shot answers; turn 2: the conversations asked again. The share whose best so
        # far is verified never falls from a turn to the next (it is the best so far).
        steps = {int(m[0]): (int(m[1]), int(m[2])) for m in re.findall(
            r"<tr><td>(\d+)</td><td>(\d+)</td><td>(\d+)%</td>", page.split('id="search-steps"')[1].split("</table>")[0])}
        assert steps[1][0] == 4 and steps[2][0] == len(second) and steps[2][1] >= steps[1][1], steps
        best = CliRunner().invoke(main, ["best", "--db", db, "--task", "mse", "--json"])  # huber is plain PyTorch: flagged, never best
        assert best.exit_code == 0, best.output
        if any(a["verdict"] == "correct" and not a["device_unfit"] for a in turns["mse"]):
            assert "turn" in json.loads(best.output.splitlines()[0])
        else:  # a busy box timed every correct mse unfit: never best (pipeline.leaderboard)
            assert best.output == ""

        (tmp_path / "blind").mkdir()
        for f in PROMPTS.iterdir():
            if f.is_file():
                (tmp_path / "blind" / f.name).write_text(f.read_text())
        (tmp_path / "blind" / "examples").symlink_to(PROMPTS / "examples")
        (tmp_path / "blind" / "feedback.j2").write_text("Your answer was judged {{ verdict }}. {{ ask }}\n")
        blind = tmp_path / "blind-run"
        blind.mkdir()
        config = search_config(blind, server.base_url, names=("mse",), search={"strategy": "refine", "max_turns": 2},
                               prompts_dir=str(tmp_path / "blind"), database=str(tmp_path / "db" / "kgen.db"))
        blind_id, store = run(config)  # the same database: the broken build's failure is reused, not rebuilt
        assert [a["verdict"] for a in store.attempts(run=blind_id)] == ["build_failed", "build_failed"]


def test_evolve_prompts_a_child_with_a_parent_from_the_archive(tmp_path):
    search = {"strategy": "evolve", "generations": 2, "population": 2, "parents": 2, "fix_turns": 1}
    with serve([answer], max_requests=50) as server:
        config = search_config(tmp_path, server.base_url, names=("hinge",), search=search)
        run_id, store = run(config)
        rows = store.attempts(run=run_id)
        # A fix turn (turn 1) follows an attempt the judge refused; the scripted model's hinge is
        # honest, so one is rare (a fresh-clone CI run saw three attempts in a generation once), and
        # the conversation it ends must end correct.
        seen = [(a["generation"], a["turn"], a["verdict"], (a["error"] or "")[:200]) for a in rows]
        first = [a for a in rows if a["generation"] == 0 and a["turn"] == 0]
        second = [a for a in rows if a["generation"] == 1 and a["turn"] == 0]
        assert len(first) == 2 and len(second) == 2, seen
        last = {}
        for a in rows:
            key = (a["generation"], a["sample"])
            if key not in last or a["turn"] > last[key]["turn"]:
                last[key] = a
        assert all(a["verdict"] == "correct" for a in last.values()), seen
        archive_ids = {a["id"] for a in rows if a["generation"] == 0 and a["verdict"] == "correct"}
        for child in second:
            parents = json.loads(store.attempt(child["id"])["parents"])
            assert len(parents) == 1 and parents[0] in archive_ids  # one unique kernel in the archive
        prompts = [r.body["messages"][0]["content"] for r in server.requests]
        shown = [p for p in prompts if "### Parent 1:" in p]
        assert len(shown) == 2 and all("torch.clamp(1 - predictions * targets, min=0)" in p for p in shown)
        assert ("x eager" in shown[0] or "not timed (" in shown[0]) and "### Parent 2" not in shown[0]
        chain = store.chain(second[0]["id"])
        assert [r["generation"] for r in chain] == [0, 1]


def test_kill9_mid_refine_resumes_without_repeating_a_model_call(tmp_path):
    search = {"strategy": "refine", "max_turns": 2, "target": {"speedup_eager": 0.5}}
    with serve([answer], max_requests=50) as server:
        config = search_config(tmp_path, server.base_url, names=("cosine", "huber"), search=search)
        db = tmp_path / "db" / "kgen.db"
        cmd = [sys.executable, "-m", "pipeline.cli", "run", "-c", str(config)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(cmd, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and _count(db, "SELECT count(*) FROM completions") < 3:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # mid-way: a second turn answered, its verdict not yet stored
        proc.wait()
        asked_before = len(server.requests)
        stored_before = _count(db, "SELECT count(*) FROM attempts")
        assert asked_before >= 3 and stored_before < 4
        done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        sent = [json.dumps(r.body["messages"], sort_keys=True) for r in server.requests]
        assert len(sent) == len(set(sent)) == 4  # two turns for each task, each asked once
        turns = list(map(tuple, _rows(db, "SELECT task, turn, verdict FROM attempts ORDER BY task, turn")))
        assert turns == [("cosine", 0, "correct"), ("cosine", 1, "correct"),
                         ("huber", 0, "mismatch"), ("huber", 1, "correct")]


def _rows(db: Path, sql: str) -> list:
    import sqlite3

    with sqlite3.connect(db) as con:
        return con.execute(sql).fetchall()


def test_a_bad_search_section_gets_one_line_naming_the_key(tmp_path):
    for search, key in (({"strategy": "anneal"}, "search.strategy"), ({"parents": 4}, "search.parents"),
                        ({"target": {"floor_fraction": 1.5}}, "search.target.floor_fraction"),
                        ({"max_turn": 3}, "search.max_turn")):
        config = search_config(tmp_path, "http://127.0.0.1:9/v1", search=search)
        result = CliRunner().invoke(main, ["run", "-c", str(config)])
        assert result.exit_code != 0 and key in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output


def test_the_archive_keeps_a_loaded_box_s_kernels_after_the_fit_ones(tmp_path):
    """Evolve's archive (Store.archive): correct, trusted kernels, fit timings fastest first and then
    those a loaded box could not time (stored with no figure, oldest first), which a child's prompt
    shows as not timed, with no number; never an untrusted or incorrect one. With the loaded ones
    left out, a search on a busy box had no parents."""
    from pipeline.records import Completion, Provenance
    from pipeline.store.store import Store

    loaded = "the cpu was loaded (30% of the windows' time waiting for a core)"
    kinds = {"fit_slow": (2.0, None, True, Verdict.correct), "fit_fast": (1.0, None, True, Verdict.correct),
             "loaded_fastest": (0.5, loaded, True, Verdict.correct), "loaded_slow": (3.0, loaded, True, Verdict.correct),
             "untrusted": (0.1, None, False, Verdict.correct), "wrong": (0.1, None, True, Verdict.mismatch)}
    with Store.open(tmp_path / "kgen.db") as store:
        run = store.start_run("{}", "[]", "cpu", "cpu: test", "2", None)
        task_id = store.upsert_task("hinge", str(ROOT / "reference_tasks" / "hinge.py"), "src")
        prompt_id = store.save_prompt(task_id, "t", "cpu", "prompt")
        ids = {}
        for sample, (label, (ms, unfit, trusted, verdict)) in enumerate(kinds.items()):
            completion = store.save_completion(run, task_id, prompt_id, "m", "replay", None, sample, label,
                                               Completion(text=f"```python\n# {label}\n```"), 0.0)
            result = EvalResult(verdict=verdict, timing=Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, n=8),
                                device_unfit=unfit, trusted=trusted, untrusted_reason=None if trusted else "test")
            ids[store.save_attempt(Provenance(run_id=run, task_id=task_id, task="hinge", model="m", sample=sample,
                                              backend="cpu", template="t", size="small", completion_id=completion,
                                              code_hash=label), result)] = label
        archive = store.archive(run, "hinge", "m", "t", "cpu", 1)
    assert [ids[r["id"]] for r in archive] == ["fit_fast", "fit_slow", "loaded_fastest", "loaded_slow"]
    views = [feedback.parent_view(r, "class ModelNew: pass") for r in archive]
    assert [v.untimed for v in views] == [None, None, loaded, loaded]
    assert [v.time_ms for v in views[2:]] == [None, None] and all(v.speedup_eager is None for v in views[2:])
    text = feedback.render_evolve("evolve.j2", PROMPTS, "hinge", "src", "cpu", 1, views[1:3])
    parts = text.split("### Parent")
    assert "not timed" not in parts[1] and "2.0 ms a call" in parts[1]
    assert f"not timed ({loaded})" in parts[2] and "ms a call" not in parts[2].splitlines()[0]
