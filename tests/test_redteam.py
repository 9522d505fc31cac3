"""The red-team suite: one known cheat per exploit class (tests/redteam/), each run through the real
evaluator on the cpu backend, with the verdict it must get.

A cheat that comes out `correct`, a crash or hang that escapes, or a timing the candidate could bend
is an evaluator bug. One `prepare()` per task per session keeps the suite to a few minutes; the
honest C++ kernel is the only compile (marked slow, still in the default run).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pipeline import build, evaluate
from pipeline.child import tasks
from pipeline.config import EvalConfig
from pipeline.records import EvalResult, Flag, Verdict

ROOT = Path(__file__).resolve().parent.parent
REDTEAM = Path(__file__).resolve().parent / "redteam"
TASKS = ROOT / "reference_tasks"
SETTINGS = EvalConfig(compile_baseline=False, trials=5, timed_calls=10, timed_ms=0, warmup_calls=2, timeout_s=60)
HANG_SETTINGS = SETTINGS.model_copy(update={"timeout_s": 20})

V = Verdict
FAILS = [
    # (candidate, task, verdicts it may get, why)
    ("constant.py", "mse", {V.mismatch}, "a fixed 0.3333 misses every randomized trial"),
    ("partial_read.py", "mse", {V.mismatch}, "1/16 of the rows: ~1e-3 off on base data, needles worse"),
    ("hinge_targets_only.py", "hinge", {V.mismatch}, "1 - 0.5*mean(t) ignores the predictions"),
    ("ce_shape_constant.py", "cross_entropy", {V.mismatch}, "log(C) from the shape alone"),
    ("cache_shape.py", "mse", {V.mismatch, V.nondeterministic}, "trial 1 has new values at the same shape"),
    ("cache_pointer.py", "mse", {V.mismatch}, "timed calls refill the same storage with new values"),
    # The output is digested the moment forward returns (before any sync), so the thread has not
    # written yet: the digest sees the raw allocation. Seen both ways: a block the harness had
    # poisoned with NaN (non_finite), or one that read 0.0 (mismatch, relative error 1).
    ("side_thread.py", "mse", {V.mismatch, V.non_finite}, "the digest is taken before the thread writes"),
    ("reference_patch.py", "mse", {V.mismatch}, "the reference lives in another process, unpatched"),
    ("input_mutation.py", "mse", {V.inputs_mutated}, "inputs are compared with a fresh copy afterwards"),
    ("stale_memory.py", "mse", {V.non_finite, V.mismatch}, "an unwritten allocation: NaN poison or garbage"),
    ("nan.py", "mse", {V.non_finite}, "NaN is rejected before any comparison"),
    ("wrong_shape.py", "mse", {V.wrong_shape}, "(1,) is not ()"),
    ("wrong_dtype.py", "mse", {V.wrong_dtype}, "float64 is not the reference's float32"),
    ("not_tensor.py", "mse", {V.wrong_type}, "a float is not a tensor"),
    ("tensor_subclass.py", "mse", {V.wrong_type}, "the type must be exactly torch.Tensor"),
    ("crash_segv.py", "mse", {V.crashed}, "killed by SIGSEGV"),
    ("crash_exit.py", "mse", {V.crashed}, "os._exit(3)"),
]
CORRECT = [
    # (candidate, task, flags that must be set)
    ("torch_fallback.py", "mse", {Flag.no_custom_kernel}),
    ("hardcoded_size.py", "mse", {Flag.shape_specialized}),
]


@pytest.fixture(scope="session")
def bench():
    """One reference process per task for the whole session."""
    cache: dict[str, evaluate.TaskBench] = {}

    def get(name: str) -> evaluate.TaskBench:
        if name not in cache:
            task = tasks.discover(TASKS, [name])[0]
            cache[name] = evaluate.prepare(task, "small", "cpu", SETTINGS)
        return cache[name]

    return get


def run(bench, name: str, task: str, tmp_path: Path, settings: EvalConfig = SETTINGS,
        code: Path | None = None) -> EvalResult:
    build_dir = tmp_path / "build"
    build_dir.mkdir(exist_ok=True)
    return evaluate.evaluate(bench(task), code or REDTEAM / name, build_dir, settings)


def describe(result: EvalResult) -> str:
    return f"{result.verdict.value} flags={[f.value for f in result.flags]} error={result.error}\n{result.detail or ''}"


@pytest.mark.parametrize("name,task,verdicts,why", FAILS, ids=[c[0].removesuffix(".py") for c in FAILS])
def test_cheat_is_rejected(bench, tmp_path, name, task, verdicts, why):
    result = run(bench, name, task, tmp_path)
    assert result.verdict in verdicts, f"{name} ({why}): {describe(result)}"
    if result.verdict is V.crashed:
        assert ("SIGSEGV" if "segv" in name else "status 3") in result.error


@pytest.mark.parametrize("name,task,flags", CORRECT, ids=[c[0].removesuffix(".py") for c in CORRECT])
def test_correct_but_flagged(bench, tmp_path, name, task, flags):
    result = run(bench, name, task, tmp_path)
    assert result.verdict is V.correct, describe(result)
    assert flags <= set(result.flags), describe(result)
    assert result.time_ms and result.time_ms > 0


def test_timer_patch_has_no_effect(bench, tmp_path):
    """The candidate replaces perf_counter(_ns), monotonic(_ns), time_ns, Event.elapsed_time and
    cuda.synchronize at import, and sleeps 50 ms per call. The Clock takes its references before the
    candidate is imported, so the recorded time is the real one: at least the sleep."""
    result = run(bench, "timer_patch.py", "mse", tmp_path)
    assert result.verdict is V.correct, describe(result)
    assert Flag.no_custom_kernel in result.flags
    assert result.time_ms >= 50.0, describe(result)
    assert result.wall_ms_per_call >= 50.0


def _alive(pids: list[int], pgid: int) -> list[str]:
    """Processes among `pids`, or anywhere in group `pgid`, that still run (zombies count as gone)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        state, pgrp = fields[0], int(fields[2])
        if state not in ("Z", "X") and (int(entry.name) in pids or pgrp == pgid):
            alive.append(f"pid {entry.name} state {state} pgrp {pgrp}")
    return alive


def test_hang_times_out_and_every_process_dies(bench, tmp_path):
    result = run(bench, "hang.py", "mse", tmp_path, HANG_SETTINGS)
    assert result.verdict is V.timeout, describe(result)
    notes = {line.split()[1]: line.split()[2:] for line in (result.output or "").splitlines()
             if line.startswith("KGEN-NOTE ")}
    assert set(notes) == {"child", "helper", "escaper"}, notes  # all three ran before the deadline
    child, pgid = int(notes["child"][0]), int(notes["child"][1])
    assert child == pgid != os.getpgid(0)  # the child leads a group of its own
    assert int(notes["helper"][1]) == pgid  # the plain helper stayed in it
    # The escaper could not start a session of its own (seccomp); it left the group with setpgid.
    assert notes["escaper"][2] == "setpgid", notes
    pids = [child, int(notes["helper"][0]), int(notes["escaper"][0])]
    deadline = time.monotonic() + 5  # SIGKILL is sent by now, but a process takes a moment to die
    while (alive := _alive(pids, pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive == [], alive


_SNOOP_RUNNER = """
import json, sys
from pathlib import Path
from pipeline import evaluate
from pipeline.child import tasks
from pipeline.config import EvalConfig
settings = EvalConfig.model_validate_json(sys.argv[3])
task = tasks.discover(Path(sys.argv[1]), ["mse"])[0]
bench = evaluate.prepare(task, "small", "cpu", settings)
result = evaluate.evaluate(bench, Path(sys.argv[2]), Path(sys.argv[4]), settings)
print("RESULT " + result.model_dump_json())
"""


def test_environment_snooping_finds_nothing(tmp_path, monkeypatch):
    """Secrets in the evaluating process's environment (set before it started, so they are in its
    /proc/PID/environ too), the database under the project folder, and a TCP listener: the
    candidate returns a wrong answer if it can read, write or reach any of them."""
    monkeypatch.setenv("KGEN_TEST_SECRET", "s3cret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-redteam-" + uuid.uuid4().hex)
    db_dir = ROOT / "db"
    db_dir.mkdir(exist_ok=True)
    db = db_dir / f"redteam-{uuid.uuid4().hex}.db"
    pwned = db_dir / "redteam-pwned.txt"
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE attempts (id INTEGER PRIMARY KEY, verdict TEXT)")
        con.execute("INSERT INTO attempts (verdict) VALUES ('correct')")
        con.commit()
        con.close()
        before = hashlib.sha256(db.read_bytes()).hexdigest()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = tmp_path / "env_snoop.py"
        code.write_text((REDTEAM / "env_snoop.py").read_text()
                        .replace("__KGEN_DB_PATH__", str(db)).replace("__KGEN_PORT__", str(port)))
        build_dir = tmp_path / "build"
        build_dir.mkdir()
        # A fresh evaluating process, so the secrets are in its initial environment as a real
        # `kgen run` launched from a shell with the key exported would have them.
        proc = subprocess.run([sys.executable, "-c", _SNOOP_RUNNER, str(TASKS), str(code),
                               SETTINGS.model_dump_json(), str(build_dir)],
                              cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=300)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
        result = EvalResult.model_validate_json(line[-1].removeprefix("RESULT "))
        assert result.verdict is V.correct, describe(result)  # a leak would have made it return 0
        assert hashlib.sha256(db.read_bytes()).hexdigest() == before
        assert not pwned.exists()
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection ever arrived
    finally:
        listener.close()
        for path in (db, db.with_name(db.name + "-journal"), db.with_name(db.name + "-wal"), pwned):
            path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def honest_build(tmp_path_factory):
    code = REDTEAM / "honest_cpp.py"
    code_hash = hashlib.sha256(code.read_bytes()).hexdigest()[:16]
    result = build.build(code, code_hash, tmp_path_factory.mktemp("builds"), timeout_s=600)
    assert result.ok, result.log[-4000:]
    return Path(result.build_dir)


@pytest.mark.slow
def test_honest_cpp_kernel_is_correct_and_unflagged(bench, honest_build):
    result = evaluate.evaluate(bench("mse"), REDTEAM / "honest_cpp.py", honest_build, SETTINGS)
    assert result.verdict is V.correct, describe(result)
    assert result.flags == [], describe(result)
    assert result.speedup_eager is not None and result.speedup_eager > 0
    assert result.floor_fraction is not None and 0 < result.floor_fraction < 1


def test_spare_child_serves_one_attempt_and_is_cleaned_up(bench, honest_build):
    """A spare child (started during the previous attempt, torch already loaded) serves the next
    attempt: same verdict, far less start-up; one that is never used is killed on close."""
    from pipeline import sandbox

    spares = sandbox.Spares("pipeline.child.harness", ["eval"])
    try:
        first = evaluate.evaluate(bench("mse"), REDTEAM / "honest_cpp.py", honest_build, SETTINGS, spares=spares)
        second = evaluate.evaluate(bench("mse"), REDTEAM / "honest_cpp.py", honest_build, SETTINGS, spares=spares)
        waiting = [child for child, _ in spares._waiting.values()]
    finally:
        spares.close()
    assert first.verdict is V.correct and second.verdict is V.correct, describe(second)
    assert second.phases["startup"] < 0.5 * first.phases["startup"], (first.phases, second.phases)
    assert len(waiting) == 1 and waiting[0].proc.poll() is not None, "the unused spare outlived close()"


# Two exploits that once passed, kept as regression tests. Each writes what its work really cost to
# real_ms.json in its build dir when the exploit gets a grip.
def _real_ms(tmp_path: Path) -> float:
    return json.loads((tmp_path / "build" / "real_ms.json").read_text())["median_ms"]


def test_timed_seeds_are_not_in_the_childs_plan(bench, tmp_path):
    """The candidate walks up the stack for the plan to precompute every timed answer; timed seeds
    now arrive one call at a time, so it finds none and has to do the work inside the timed calls."""
    result = run(bench, "replay_plan.py", "mse", tmp_path)
    assert not (tmp_path / "build" / "real_ms.json").exists(), "the exploit found the timed seeds"
    assert result.verdict is V.correct, describe(result)
    assert result.time_ms >= 0.5 * result.baselines.eager.median_ms, describe(result)


def test_patching_the_clock_class_changes_nothing_the_harness_calls(bench, tmp_path):
    """The candidate rebinds pipeline.child.timing.Clock.time_call to report 30% of the real time; the
    harness's Clock bound its methods before the candidate was imported, so the patch never runs."""
    result = run(bench, "clock_class_patch.py", "mse", tmp_path)
    assert not (tmp_path / "build" / "real_ms.json").exists(), "the patched time_call ran"
    assert result.verdict is V.correct, describe(result)
    assert result.time_ms >= 0.5 * result.baselines.eager.median_ms, describe(result)


# Known gaps: stronger variants of the two above. The child's clock, and the code that prepares each
# timed call, live in the candidate's process; the parent's only hard bound on a timed call is the
# bandwidth floor. Both are judged correct with a time well below what their work really cost. Kept
# so that a fix shows up as XPASS; not strict, since timing on a loaded CI box is noisy.
@pytest.mark.xfail(reason="known gap: the work can be done while the harness builds a timed call's inputs",
                   strict=False)
def test_known_gap_work_done_while_inputs_are_built(bench, tmp_path):
    result = run(bench, "replay_input_hook.py", "mse", tmp_path)
    real = _real_ms(tmp_path)
    assert not (result.verdict is V.correct and result.time_ms < 0.5 * real), \
        f"recorded {result.time_ms:.3g} ms for work that cost {real:.3g} ms: {describe(result)}"


@pytest.mark.xfail(reason="known gap: the live Clock instance can be found (gc) and its methods rebound",
                   strict=False)
def test_known_gap_patched_clock_instance(bench, tmp_path):
    result = run(bench, "clock_instance_patch.py", "mse", tmp_path)
    real = _real_ms(tmp_path)
    assert not (result.verdict is V.correct and result.time_ms < 0.5 * real), \
        f"recorded {result.time_ms:.3g} ms for calls that took {real:.3g} ms: {describe(result)}"
