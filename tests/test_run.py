"""The batch end to end, for real: replay and openai providers, sandboxed builds and evaluations,
SQLite, resume after kill -9, retries, the budget, the Ray executor, cuda slots on a CPU machine.

Candidates here are plain PyTorch modules, so a "build" is an import (seconds, no compiler); the
compiled path is covered by tests/test_redteam.py and tests/test_build.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from chat_server import Failure, Reply, serve
from forgers import no_figure
from pipeline.policy import POLICY
from pipeline.cli.main import main
from pipeline.judge.health import descendants
from pipeline.config import load_config
from pipeline.run.batch import Runner
from pipeline.store.store import Store

ROOT = Path(__file__).resolve().parent.parent

RIGHT = """Reasoning: a squared difference, then a mean.

```python
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return ((predictions - targets) ** 2).mean()
```
"""
WRONG = """Every input is uniform, so the answer is about a third.

```python
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.tensor(0.3333)
```
"""
NO_CODE = "I would write a kernel here, but I ran out of time."


def write_config(tmp: Path, models: list[dict], samples: int = 2, names=("mse",), size: str = "small",
                 **extra) -> Path:
    cfg = {
        "models": models,
        "tasks": {"names": list(names), "size": size, "directory": str(ROOT / "reference_tasks")},
        "prompts_dir": str(ROOT / "prompts"),
        "samples": samples,
        "backend": "cpu",
        "evaluation": {"trials": 3, "timed_calls": 5, "warmup_calls": 1, "compile_baseline": False,
                       "check_shapes": False, "timeout_s": 120},
        **extra,
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def replay(tmp: Path, entries: list[tuple[str, str]]) -> dict:
    path = tmp / "replay.jsonl"
    path.write_text("".join(json.dumps({"task": t, "backend": "cpu", "text": text}) + "\n" for t, text in entries))
    return {"name": "recorded", "provider": "replay", "replay_file": str(path)}


def run(config: Path, **kwargs) -> tuple[str, Store]:
    cfg = load_config(config)
    store = Store.open(cfg.path(cfg.database))
    return asyncio.run(Runner(cfg, store).run(**kwargs)), store


def test_replay_run_stores_each_outcome_and_resumes(tmp_path):
    config = write_config(tmp_path, [replay(tmp_path, [("mse", RIGHT), ("mse", WRONG), ("mse", NO_CODE)])],
                          samples=3)
    run_id, store = run(config)
    verdicts = {a["sample"]: a["verdict"] for a in store.attempts(run=run_id)}
    assert verdicts == {0: "correct", 1: "mismatch", 2: "extract_failed"}
    right = store.attempt(next(a["id"] for a in store.attempts(run=run_id) if a["sample"] == 0))
    assert no_figure(right["result"]) or right["result"].speedup_eager > 0  # the rule on a box too loaded to time
    assert right["result"].baselines.floor_ms > 0
    assert right["result"].policy == POLICY.version  # the thresholds it was judged under, stored with it
    assert (tmp_path / "generated" / f"{right['code_hash']}.py").read_text().startswith("import torch")
    db = str(tmp_path / "db" / "kgen.db")
    listed = CliRunner().invoke(main, ["attempts", "--db", db, "--json", "--verdict", "mismatch"])
    (row,) = [json.loads(line) for line in listed.output.splitlines()]
    assert {"id", "run", "task", "model", "sample", "backend", "verdict", "flags", "time_ms", "eager_ms",
            "speedup_eager"} <= set(row) and row["sample"] == 1 and row["run"] == run_id
    shown = CliRunner().invoke(main, ["show", right["id"][:20], "--db", db, "-c", str(config)])
    assert shown.exit_code == 0, shown.output
    timed = () if no_figure(right["result"]) else ("x eager",)
    for part in ("prompt", "completion", "class ModelNew", "verdict detail", "trial 0", "judged under policy", *timed):
        assert part in shown.output, part
    first = store.attempts(run=run_id)
    again, store = run(config)
    assert again == run_id  # the same plan resumes the same run
    # Nothing left to do: every attempt stands as stored, not judged again. Only a correct one whose
    # timing a busy box's load marked unfit is re-timed (pipeline.run.batch.Runner._redo). A bound
    # on the resume's seconds stood here and failed beside other work.
    now = {a["id"] for a in store.attempts(run=run_id)}
    assert len(now) == 3 and {a["id"] for a in first if not a["device_unfit"]} <= now


def test_samples_of_one_turn_are_judged_on_one_draw(tmp_path):
    """Samples of one turn are siblings, judged on one draw (pipeline.judge.bench.Draws): the reference
    computed its values for the first judged, and the second is refused on them all the same. Two
    wrong answers, refused on their first trial whatever the box's speed, at "odd", where every
    draw is whole (its values and Bound inputs all computed before the child) and so kept. (At
    "small" on the cpu a draw is whole only where eager takes over POLICY.cpu_short_ms a call: CI's box
    shared none.)"""
    wrong_too = WRONG.replace("0.3333", "0.25")
    config = write_config(tmp_path, [replay(tmp_path, [("mse", WRONG), ("mse", wrong_too)])], samples=2, size="odd")
    run_id, store = run(config)
    results = [store.attempt(a["id"])["result"] for a in store.attempts(run=run_id)]
    assert [r.verdict.value for r in results] == ["mismatch", "mismatch"]
    assert sorted(r.phases.get("shared_draw") for r in results) == [0.0, 1.0]
    # One draw's inputs judged both: trial 0's reference value is the same, the answers' errors are not.
    first, second = (r.trials[0] for r in results)
    assert first.expected == second.expected and first.expected is not None
    assert first.max_rel_err != second.max_rel_err


def _count(db: Path, sql: str) -> int:
    try:
        with sqlite3.connect(db) as con:
            return con.execute(sql).fetchone()[0]
    except sqlite3.OperationalError:  # the run has not made its tables yet
        return 0


def test_kill9_mid_run_then_resume_stores_every_slot_once(tmp_path):
    config = write_config(tmp_path, [replay(tmp_path, [("mse", RIGHT), ("mse", WRONG)])], samples=4)
    db = tmp_path / "db" / "kgen.db"
    cmd = [sys.executable, "-m", "pipeline.cli", "run", "-c", str(config)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if db.exists() and _count(db, "SELECT count(*) FROM attempts") >= 1:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and every child it started, mid-way
    proc.wait()
    stored_before = _count(db, "SELECT count(*) FROM attempts")
    assert 1 <= stored_before < 4
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _count(db, "SELECT count(*) FROM attempts")
    slots = _count(db, "SELECT count(DISTINCT run_id || task || model || sample) FROM attempts")
    assert rows == slots == 4
    assert _count(db, "SELECT count(DISTINCT run_id) FROM attempts") == 1
    # Completions are cached by key: the restarted run asked the model only for what was missing.
    assert _count(db, "SELECT count(DISTINCT cache_key) FROM completions") == 4


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


SPINS = """A kernel that never returns.

```python
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        while True:
            pass
```
"""


def test_nothing_kgen_started_outlives_a_kgen_killed_with_sigkill(tmp_path):
    """Only the kgen process is killed (not its group) while a candidate spins in its first call:
    its reference process, the zygote and the spinning child (in a room forked from the zygote), each
    in a session of its own and deaf to their closed stdin while busy, die with it (PR_SET_PDEATHSIG,
    and the zygote at the end of its socket). On the H100 such survivors held GPU
    memory and a context beside every later run."""
    config = write_config(tmp_path, [replay(tmp_path, [("mse", SPINS)])], samples=1)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "-c", str(config)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 240
    child = []
    while time.monotonic() < deadline and not child:
        child = [pid for pid in descendants(proc.pid) if _in_a_room(pid)]  # a fork of the zygote, jailed
        time.sleep(0.2)
    assert child, "no candidate child started"
    time.sleep(5)  # past loading and import: spinning in its warm-up call
    started = descendants(proc.pid)
    assert any(b"pipeline.judge.reference" in _cmdline(pid) for pid in started)
    assert any(b"pipeline.child.zygote" in _cmdline(pid) and not _in_a_room(pid) for pid in started)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while (alive := [pid for pid in started if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive == [], [_cmdline(pid)[:120] for pid in alive]


def _in_a_room(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    except OSError:
        return False


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def test_openai_endpoint_answering_429_and_500_is_retried(tmp_path):
    script = [Failure(429), Failure(500), Reply(content=RIGHT, reasoning="think first", completion_tokens=50)]
    with serve(script) as server:
        model = {"name": "local", "provider": "openai", "base_url": server.base_url, "model": "coder-1",
                 "max_retries": 3, "sampling": {"temperature": 0.2}}
        run_id, store = run(write_config(tmp_path, [model], samples=1))
        assert len(server.requests) == 3
        assert server.requests[-1].body["temperature"] == 0.2
    attempt = store.attempt(store.attempts(run=run_id)[0]["id"])
    assert attempt["verdict"] == "correct"
    assert attempt["reasoning"] == "think first"
    assert attempt["usage"].completion_tokens == 50


def test_budget_stops_new_model_calls(tmp_path):
    with serve([Reply(content=WRONG, prompt_tokens=700, completion_tokens=300)]) as server:
        model = {"name": "local", "provider": "openai", "base_url": server.base_url, "model": "coder-1",
                 "max_concurrency": 1}
        run_id, store = run(write_config(tmp_path, [model], samples=5, budget={"max_tokens": 1500}))
        calls = len(server.requests)
    assert calls == 2  # 1000 tokens after the first, 2000 after the second: no third call
    assert len(store.attempts(run=run_id)) == 2
    assert store.get_run(run_id)["status"] == "budget_reached"


def test_cuda_slots_on_a_machine_without_gpu_wait_for_one(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    entries = [(t, RIGHT) for t in ("mse",)]
    path = tmp_path / "replay.jsonl"
    path.write_text(json.dumps({"task": "mse", "backend": "cuda", "text": RIGHT}) + "\n")
    model = {"name": "recorded", "provider": "replay", "replay_file": str(path)}
    config = write_config(tmp_path, [model], samples=1, backend="cuda")
    run_id, store = run(config)
    (attempt,) = store.attempts(run=run_id)
    assert attempt["verdict"] == "waiting_gpu" and attempt["code_hash"]
    assert entries


def test_ray_executor_completes_a_cpu_run(tmp_path):
    pytest.importorskip("ray")
    config = write_config(tmp_path, [replay(tmp_path, [("mse", RIGHT), ("mse", WRONG)])], samples=2,
                          executor="ray")
    run_id, store = run(config)
    assert sorted(a["verdict"] for a in store.attempts(run=run_id)) == ["correct", "mismatch"]


def test_bad_config_gets_one_line_naming_the_key(tmp_path):
    config = write_config(tmp_path, [replay(tmp_path, [("mse", RIGHT)])])
    data = yaml.safe_load(config.read_text())
    data["evaluation"]["trials"] = 0
    config.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(main, ["run", "-c", str(config)])
    assert result.exit_code != 0
    assert "evaluation.trials" in result.output and len(result.output.strip().splitlines()) == 1


def test_kgen_eval_judges_a_file_and_stores_it(tmp_path):
    config = write_config(tmp_path, [replay(tmp_path, [("mse", RIGHT)])])
    code = tmp_path / "mine.py"
    code.write_text(RIGHT.split("```python")[1].split("```")[0])
    result = CliRunner().invoke(main, ["eval", str(code), "--task", "mse", "--backend", "cpu", "--size", "small",
                                       "-c", str(config), "--json"])
    out = json.loads(result.output)
    assert out["verdict"] == "correct" and out["flags"] == ["no_custom_kernel"]
    assert result.exit_code == 1, result.output  # correct but flagged: not verified, so not 0
    for key in ("error", "time_ms", "eager_ms", "compile_ms", "floor_ms", "speedup_eager", "speedup_compile"):
        assert key in out
    if out["time_ms"] is None:  # the rule on a cpu too loaded to time it: no figure, and the reason said
        assert out["speedup_eager"] is None and out["device_unfit"], out
    else:
        assert out["time_ms"] > 0 and out["floor_ms"] > 0
    store = Store.open(tmp_path / "db" / "kgen.db")
    assert store.attempt(out["id"])["verdict"] == "correct"
    built = list(store.db["builds"].rows)
    assert len(built) == 1 and built[0]["ok"]
    # Judged again: the build the database records (for this torch) is reused, as a batch reuses
    # it, not checked by another build child (5.5 s of an H100 `kgen eval`); its row is untouched.
    again = CliRunner().invoke(main, ["eval", str(code), "--task", "mse", "--backend", "cpu", "--size", "small",
                                      "-c", str(config), "--json"])
    assert again.exit_code == 1, again.output  # correct but flagged (plain PyTorch): not verified
    assert json.loads(again.output)["verdict"] == "correct"
    assert list(store.db["builds"].rows) == built


def test_retry_errors_redoes_failed_model_calls_in_the_same_run(tmp_path):
    with serve([Failure(400, retry_after_ms=None)]) as broken:  # not transient: a plain resume leaves it
        model = {"name": "local", "provider": "openai", "base_url": broken.base_url, "model": "coder-1",
                 "max_retries": 0}
        config = write_config(tmp_path, [model], samples=1)
        run_id, store = run(config)
    assert [a["verdict"] for a in store.attempts(run=run_id)] == ["model_error"]
    with serve([Reply(content=RIGHT)]) as healthy:
        data = yaml.safe_load(config.read_text())
        data["models"][0]["base_url"] = healthy.base_url  # base_url is not part of the plan's key
        config.write_text(yaml.safe_dump(data))
        again, store = run(config)
        assert again == run_id and not healthy.requests  # a plain resume leaves stored errors alone
        again, store = run(config, retry_errors=True)
        assert len(healthy.requests) == 1
    assert again == run_id
    assert [a["verdict"] for a in store.attempts(run=run_id)] == ["correct"]


def test_show_prints_a_completion_literally_never_as_markup(tmp_path):
    """Completions are hostile text: rich markup in one is shown as written."""
    text = "No code. [red]not markup[/red] [link=file:///etc/passwd]x[/link] [/]"
    config = write_config(tmp_path, [replay(tmp_path, [("mse", text)])], samples=1)
    run_id, store = run(config)
    (row,) = store.attempts(run=run_id)
    db = str(tmp_path / "db" / "kgen.db")
    shown = CliRunner().invoke(main, ["show", row["id"], "--db", db, "-c", str(config)])
    assert shown.exit_code == 0, shown.output
    assert "[red]not markup[/red]" in shown.output and "[link=file:///etc/passwd]x[/link]" in shown.output


SQUARED = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return ((a - b) ** 2).mean()


def get_inputs():
    return [torch.randn({shape}), torch.randn({shape})]


def get_init_inputs():
    return []
"""
SQUARED_NEW = RIGHT.replace("predictions, targets", "a, b").replace("(predictions - targets)", "(a - b)")


def _squared_config(tmp_path: Path, folder: Path, names: tuple[str, ...]) -> Path:
    """A replay config over the task files in `folder`, at their default size, answering each with SQUARED_NEW.
    One sample a task: what these tests show is about a task's reference process, not its samples (a
    second sample of tiny was one more evaluation, 4-6 s of CI, each)."""
    config = write_config(tmp_path, [replay(tmp_path, [(name, SQUARED_NEW) for name in names])], names=names,
                          samples=1)
    data = yaml.safe_load(config.read_text())
    data["tasks"].update(directory=str(folder), size="default")
    config.write_text(yaml.safe_dump(data))
    return config


def test_a_task_too_big_for_the_machine_fails_in_one_line_after_the_others_are_stored(tmp_path):
    """Each task's reference process is closed once its attempts are over (its memory goes back), and
    one that does not fit waits for the others' before the size is called too big: on the H100 a
    batch that kept every reference open to its end lost a task that fitted alone."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "tiny.py").write_text(SQUARED.format(shape="64, 64"))
    (folder / "huge.py").write_text(SQUARED.format(shape="32768, 32768, 64"))  # 2 x 256 GiB, never allocated
    config = _squared_config(tmp_path, folder, ("tiny", "huge"))
    result = CliRunner().invoke(main, ["run", "-c", str(config)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert "task huge: size 'default' needs about" in last and "other attempts are stored" in last
    assert "tiny: closed, the task's attempts are over" in result.output
    store = Store.open(tmp_path / "db" / "kgen.db")
    assert [a["verdict"] for a in store.attempts() if a["task"] == "tiny"] == ["correct"]


NO_FLOAT64 = SQUARED.replace("    def forward(self, a, b):\n",
                             "    def forward(self, a, b):\n        if a.dtype == torch.float64:\n"
                             "            raise RuntimeError('this reference has no float64 path')\n")


def test_an_attempt_that_cannot_be_judged_is_one_line_after_the_summary_and_the_same_command_resumes(tmp_path):
    """A reference process that fails (here a task whose Model refuses float64, which the judge's
    expected values need) leaves its attempts unjudged: the others are stored and summed up, then
    one line names the failure and the command that judges what is left. The demo's first run on the
    2-core box ended in a 60-line traceback instead (the kernel refused a memfd's seal once)."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "tiny.py").write_text(SQUARED.format(shape="64, 64"))
    (folder / "nof64.py").write_text(NO_FLOAT64.format(shape="64, 64"))
    config = _squared_config(tmp_path, folder, ("tiny", "nof64"))
    result = CliRunner().invoke(main, ["run", "-c", str(config)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output[-3000:]
    last = result.output.strip().splitlines()[-1]
    assert "could not be judged" in last and "nof64" in last and "no float64 path" in last, last
    assert f"judge what is left with: kgen run -c {config}" in last, last
    assert "tiny" in result.output.split("could not be judged")[0]  # the summary came first
    store = Store.open(tmp_path / "db" / "kgen.db")
    assert [a["verdict"] for a in store.attempts() if a["task"] == "tiny"] == ["correct"]
    # The reason is in the database too, written as it happened (a run cut short never reaches its end).
    run_id = store.latest_run_id()
    [unjudged] = store.unjudged(run_id)
    assert (unjudged["task"], unjudged["sample"]) == ("nof64", 0) and "no float64 path" in unjudged["error"], unjudged
    assert "\n" not in unjudged["error"]
    assert not [a for a in store.attempts() if a["task"] == "nof64"]
    assert store.get_run(store.latest_run_id())["status"] == "failed"
    # And where a user looks: the run's summary above the last line, and `kgen attempts` of the run.
    assert "1 attempt could not be judged and is not stored" in result.output.rsplit(last, 1)[0], result.output
    listed = CliRunner().invoke(main, ["attempts", "--run", "latest", "-c", str(config)])
    assert listed.exit_code == 0, listed.output
    assert "could not be judged" in listed.output and "nof64 sample 0" in listed.output, listed.output
    assert "no float64 path" in listed.output, listed.output
    # An attempt stored for that slot later (as a resume that judged it would) takes it off the list.
    store.db.execute("UPDATE attempts SET task = 'nof64' WHERE task = 'tiny'")
    assert store.unjudged(run_id) == []
