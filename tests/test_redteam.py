"""The red-team suite: one known cheat per exploit class (tests/redteam/), each run through the real
evaluator on the cpu backend, with the verdict it must get.

A cheat that comes out `correct`, a crash or hang that escapes, or a timing the candidate could bend
is an evaluator bug. One `prepare()` per task per session keeps the suite to a few minutes; the
honest C++ kernel is the only compile (marked slow, still in the default run).
"""

from __future__ import annotations

import hashlib
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline.build import build
from pipeline.judge import evaluate, owncode
from pipeline.judge.bench import TaskBench, measure_baselines, open_bench, prepare
from pipeline.library import kernels
from pipeline import sandbox
from pipeline.sandbox.spares import Spares
from pipeline.child import HARNESS, tasks
from pipeline.config import EvalConfig
from pipeline.policy import POLICY
from pipeline.records import BuildResult, EvalResult, Flag, Verdict

from forgers import UNEARNED_X, gains_nothing, load_unfit, no_figure

ROOT = Path(__file__).resolve().parent.parent
REDTEAM = Path(__file__).resolve().parent / "redteam"
TASKS = ROOT / "reference_tasks"
TEST_TASKS = Path(__file__).resolve().parent / "tasks"  # tasks of our own (big_add: a large output)
SETTINGS = EvalConfig(compile_baseline=False, trials=5, timed_calls=10, timed_ms=0, warmup_calls=2, timeout_s=60)
# For the tests that look at verdicts, notes and rooms, never at a timing figure: a correct result the
# cpu was too loaded to time is judged again (load_retries) only to get it a figure, and each such
# judgement is a fresh child and draw (seconds each on a loaded CI box) that these tests never read.
ONCE = SETTINGS.model_copy(update={"load_retries": 0})

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
    ("forged_protocol.py", "mse", {V.mismatch, V.protocol_error},
     "forged replies are claims: the zeros it wrote to the outbox are compared with the reference"),
    ("sampled_positions.py", "big_add", {V.mismatch}, "every one of 262144 values is compared, not a sample"),
    ("garbage_reply.py", "mse", {V.protocol_error}, "a line that is not the reply the request calls for"),
    ("long_line.py", "mse", {V.protocol_error}, "a line over MAX_LINE ends the attempt, unbuffered"),
]
CORRECT = [
    # (candidate, task, flags that must be set)
    ("torch_fallback.py", "mse", {Flag.no_custom_kernel}),
    ("hardcoded_size.py", "mse", {Flag.shape_specialized}),
    # Pure PyTorch that rebinds the harness's profile function to claim all the time as its own: the
    # flag is the parent's finding (nothing built), whatever the child's profile says.
    ("profile_rebind.py", "mse", {Flag.no_custom_kernel}),
]


@pytest.fixture(scope="session")
def bench():
    """One reference process per task for the whole session."""
    cache: dict[tuple[str, str], TaskBench] = {}

    def get(name: str, size: str = "small") -> TaskBench:
        if (name, size) not in cache:
            task = tasks.discover(TEST_TASKS if (TEST_TASKS / f"{name}.py").exists() else TASKS, [name])[0]
            cache[name, size] = prepare(task, size, "cpu", SETTINGS)
        return cache[name, size]

    yield get
    for bench_ in cache.values():
        bench_.close()


def run(bench, name: str, task: str, tmp_path: Path, settings: EvalConfig = SETTINGS,
        code: Path | None = None) -> EvalResult:
    build_dir = tmp_path / "build"
    build_dir.mkdir(exist_ok=True)
    return evaluate.evaluate(bench(task), code or REDTEAM / name, build_dir, settings)


def describe(result: EvalResult) -> str:
    return (f"{result.verdict.value} flags={[f.value for f in result.flags]} error={result.error} "
            f"time_ms={result.time_ms} wall_ms_per_call={result.wall_ms_per_call}\n{result.detail or ''}")


def notes(result: EvalResult) -> list[list[str]]:
    """The KGEN-NOTE lines the candidate printed (the tail the parent kept), as words after the tag."""
    found = []
    for line in (result.output or "").splitlines():
        at = line.find("KGEN-NOTE ")
        if at >= 0:
            found.append(line[at:].split()[1:])
    return found


def real_ms(result: EvalResult) -> float | None:
    """The last `real_ms` a timing exploit reported: what its work really cost per call."""
    values = [float(n[n.index("real_ms") + 1]) for n in notes(result) if "real_ms" in n]
    return values[-1] if values else None


def assert_time_earned(result: EvalResult, real: float | None = None) -> None:
    """A timing exploit ends in impossible_timing (or its timing unfit for a loaded cpu), or it is correct
    and, where it reported its real cost, recorded within UNEARNED_X of that: its own measure counts
    the time others held its core, the parent's figure does not (clocks.unloaded_ms)."""
    if result.verdict is V.impossible_timing or load_unfit(result):
        return
    assert result.verdict is V.correct, describe(result)
    assert result.wall_ms_per_call is not None, describe(result)
    if real is not None:
        assert result.time_ms * UNEARNED_X >= real, \
            f"recorded {result.time_ms:.4g} ms for work that cost {real:.4g} ms a call: {describe(result)}"


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
    # timed, or (a loaded box) marked unfit with no figure at all
    assert (result.time_ms or 0) > 0 if not result.device_unfit else result.time_ms is None, describe(result)
    if Flag.no_custom_kernel in flags:  # nothing was built: the parent's finding, not the child's claim
        assert result.own_code is not None and result.own_code.holds_own is False, result.own_code
        assert Flag.no_custom_kernel not in result.outcome.claims
        assert result.shapes and not any(s.served for s in result.shapes), result.shapes


def test_timer_patch_has_no_effect(bench, tmp_path):
    """The candidate replaces perf_counter(_ns), monotonic(_ns), time_ns, Event.elapsed_time and
    cuda.synchronize at import, and sleeps 50 ms per call. The Clock takes its references before the
    candidate is imported, so the recorded time is the real one: at least the sleep."""
    result = run(bench, "timer_patch.py", "mse", tmp_path)
    assert result.verdict is V.correct, describe(result)
    assert Flag.no_custom_kernel in result.flags
    assert no_figure(result) or result.time_ms >= 50.0, describe(result)
    # The parent's estimate is net of the calibration's fastest null request, whose own noise a
    # fresh clone's busy run put 0.34 ms past the protocol's cost: 49.66 ms for the 50 ms sleep.
    assert result.wall_ms_per_call >= 49.0, describe(result)


def test_a_hang_costs_the_step_limit_its_baseline_gives_and_every_process_dies(bench, tmp_path):
    """The child may run 120 s, but the first calls (Setup) of a 2 ms task get three floors of 2 s
    plus 50 x 2 warm-up calls at the eager baseline: the hang is a timeout after about 6 s. The
    hang spins, so on a loaded box the time its thread waited for a cpu is added, up to the ceiling
    (30 s here; Session.ask): a fresh clone beside another suite took 27 s over all. Its helpers,
    one left in the child's group and one that tried to leave it, die with the room."""
    settings = SETTINGS.model_copy(update={"timeout_s": 120, "step_floor_s": 2.0, "step_ceiling_s": 30.0})
    started = time.monotonic()
    result = run(bench, "hang.py", "mse", tmp_path, settings)
    took = time.monotonic() - started
    assert result.verdict is V.timeout, describe(result)
    eager_s = bench("mse").baselines.eager.median_ms / 1e3
    limit = 3 * 2.0 + 50 * settings.warmup_calls * eager_s
    assert "while waiting for building ModelNew" in result.error and f"that step, {limit:.1f} s" in result.error, result.error
    waited = float(result.error.split("no reply in ")[1].split(" s")[0])
    assert limit - 0.1 <= waited <= settings.step_ceiling_s + 0.1, result.error
    assert took < settings.step_ceiling_s + 30 < settings.timeout_s, f"{took:.1f} s for a step limit of {limit:.1f} s"
    notes = {line.split()[1]: line.split()[2:] for line in (result.output or "").splitlines()
             if line.startswith("KGEN-NOTE ")}
    assert set(notes) == {"child", "helper", "escaper"}, notes  # all three ran before the deadline
    room = {int(fields[2]) for fields in notes.values()}
    assert len(room) == 1 and room != {os.stat("/proc/self/ns/pid").st_ino}, notes  # one room, not ours
    assert int(notes["helper"][1]) == int(notes["child"][1])  # the plain helper stayed in the child's group
    # The escaper could not start a session of its own (seccomp); it left the group with setpgid.
    assert notes["escaper"][3] == "setpgid", notes
    # Seen from outside, nothing was left in the room's pid namespace (the parent ended its pid 1, then
    # looked while it held the namespace, so its inode could be no later room's: Child.pidns_fd).
    assert "outlived" not in (result.untrusted_reason or ""), result.untrusted_reason


_SNOOP_RUNNER = """
import json, sys
from pathlib import Path
from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.child import tasks
from pipeline.config import EvalConfig
settings = EvalConfig.model_validate_json(sys.argv[3])
task = tasks.discover(Path(sys.argv[1]), ["mse"])[0]
bench = prepare(task, "small", "cpu", settings, cached_baselines=lambda key: sys.argv[5])
result = evaluate.evaluate(bench, Path(sys.argv[2]), Path(sys.argv[4]), settings)
print("RESULT " + result.model_dump_json())
bench.close()
"""


def test_environment_snooping_finds_nothing(bench, tmp_path, monkeypatch):
    """Secrets in the evaluating process's environment (set before it started, so they are in its
    /proc/PID/environ too), the database under the project folder, and a TCP listener: the
    candidate returns a wrong answer if it can read, write or reach any of them. The fresh process
    starts its own reference process and takes the session's mse baselines as cached ones (as a
    `kgen eval` finds those an earlier run stored), and judges the candidate once (ONCE: no figure
    is looked at)."""
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
                               ONCE.model_dump_json(), str(build_dir), bench("mse").baselines.model_dump_json()],
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


# The C++ candidates the tests below judge, each built once for the session.
PREBUILT = ("honest_cpp.py", "hardwired_size_fallback.py", "omp_all_cores.py", "honest_fast_mse.py")


@pytest.fixture(scope="session")
def prebuilt(tmp_path_factory) -> dict[str, BuildResult]:
    """Every PREBUILT candidate built by build.build as each test built its own before, two at a time
    (each build is one g++ on one core) when the first test needs one; nothing is judged meanwhile
    (the tests wait for their fixtures before they start), so no timing runs beside them."""
    root = tmp_path_factory.mktemp("builds")

    def one(name: str) -> BuildResult:
        code = REDTEAM / name
        return build.build(code, hashlib.sha256(code.read_bytes()).hexdigest()[:16], root,
                           build.BuildOptions(timeout_s=600))

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(PREBUILT, pool.map(one, PREBUILT)))


@pytest.fixture(scope="session")
def honest_build(prebuilt):
    result = prebuilt["honest_cpp.py"]
    assert result.ok, result.log[-4000:]
    return Path(result.build_dir)


@pytest.mark.slow
def test_honest_cpp_kernel_is_correct_and_unflagged(bench, honest_build):
    result = evaluate.evaluate(bench("mse"), REDTEAM / "honest_cpp.py", honest_build, SETTINGS)
    assert result.verdict is V.correct, describe(result)
    assert result.flags == [], describe(result)
    assert result.own_code.holds_own is True and "mse(at::Tensor, at::Tensor)" in result.own_code.functions
    # Every held-out size is recorded with the child's profile, and served (nothing is timed there).
    assert len(result.shapes) == len(result.sizes) - 1 and all(s.correct and s.own_ran for s in result.shapes)
    assert all(s.served for s in result.shapes), result.shapes
    if not no_figure(result):  # a figure, unless the cpu stayed too loaded through the retries
        assert result.speedup_eager is not None and result.speedup_eager > 0
        assert result.floor_fraction is not None and 0 < result.floor_fraction < 1


def test_the_parent_reads_the_extension_itself(honest_build, tmp_path):
    """The parent's look at a build: the candidate's function is found among pybind11's and torch's
    glue; a folder holding only a link to torch's own library holds nothing of the candidate's (the
    link is not followed), and neither does an empty one."""
    import torch

    own = owncode.inspect_build(honest_build, "cpu", "")
    assert own.holds_own is True and own.functions == ["mse(at::Tensor, at::Tensor)"], own
    assert not any("pybind11" in f or "PyInit" in f for f in own.functions)
    torch_lib = next((Path(torch.__file__).parent / "lib").glob("libtorch_cpu.so"))
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "ext.so").symlink_to(torch_lib)
    assert owncode.inspect_build(tmp_path / "linked", "cpu", "").holds_own is False
    assert owncode.inspect_build(tmp_path / "empty", "cpu", "").holds_own is False
    assert owncode.inspect_build(tmp_path / "empty", "triton", "@triton.jit\ndef k(x):\n    pass\n").holds_own is True


@pytest.fixture(scope="session")
def hardwired_build(prebuilt):
    result = prebuilt["hardwired_size_fallback.py"]
    assert result.ok, result.log[-4000:]
    return Path(result.build_dir)


@pytest.mark.slow
def test_a_kernel_hardwired_to_the_declared_size_is_served_there_alone(bench, hardwired_build):
    """Its own kernel at 256 x 4096, PyTorch at every other size: right everywhere, so no held-out
    trial fails. The child's profile at each held-out size says PyTorch did the work: flagged
    shape_specialized (the child's claim, stored as such), and no held-out size is served."""
    result = evaluate.evaluate(bench("mse"), REDTEAM / "hardwired_size_fallback.py", hardwired_build, ONCE)
    assert result.verdict is V.correct, describe(result)
    assert result.own_code.holds_own is True, result.own_code
    assert Flag.shape_specialized in result.flags and Flag.shape_specialized in result.outcome.claims, describe(result)
    assert Flag.no_custom_kernel not in result.flags, describe(result)
    assert result.shapes and all(s.correct and s.own_ran is False and not s.served for s in result.shapes), result.shapes
    task = tasks.discover(TASKS, ["mse"])[0]
    assert kernels.served_inputs(kernels.task_file("mse", "mse.py", task.path.read_text()), result) == {}


def test_spare_child_serves_one_attempt_and_is_cleaned_up(bench, honest_build):
    """A spare child (started during the previous attempt, torch already loaded) serves the next
    attempt: the one waiting when it starts is gone when it ends, and the verdict is the same.
    Without refill (kgen eval) taking it starts no other; one that is never used is killed on close.
    (How much start-up it saves is a timing, which a loaded box moves: not asserted here.)"""
    spares = Spares(HARNESS, ["eval"], refill=True)
    try:
        first = evaluate.evaluate(bench("mse"), REDTEAM / "honest_cpp.py", honest_build, ONCE, spares=spares)
        spares.refill = False
        waiting = [child for queue in spares._waiting.values() for child, _ in queue]
        second = evaluate.evaluate(bench("mse"), REDTEAM / "honest_cpp.py", honest_build, ONCE, spares=spares)
        left = [entry for queue in spares._waiting.values() for entry in queue]
    finally:
        spares.close()
    assert first.verdict is V.correct and second.verdict is V.correct, describe(second)
    assert len(waiting) == 1 and waiting[0].proc.poll() is not None, "the spare did not serve the second attempt"
    assert left == [], "a spare was started after the last one was taken without refill"
    unused = Spares(HARNESS, ["eval"], refill=False)
    unused.spawn(evaluate.child_environment("cpu"), evaluate.spare_init("cpu", SETTINGS))
    waiting = [child for queue in unused._waiting.values() for child, _ in queue]
    unused.close()
    assert len(waiting) == 1 and waiting[0].proc.poll() is not None, "the unused spare outlived close()"


def _thread_cores(pid: int) -> list[set[int]]:
    """The cores each thread of `pid` may run on, read by the test itself."""
    return [os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


def _wait_idle(pids: list[int], cpu_ticks, limit: float = 120.0) -> None:
    """Until none of `pids` used CPU time for half a second: a spare done loading torch."""
    end, last = time.monotonic() + limit, None
    while time.monotonic() < end:
        now = [cpu_ticks(pid) for pid in pids]
        if now == last:
            return
        last = now
        time.sleep(0.5)


def test_a_reference_started_off_the_lane_moves_to_it(honest_build):
    """A task's reference process started on other cores (a one-GPU batch starts it off the lane:
    executor.LocalExecutor.prepare) moves, every thread, to the lane's cores, measures its baselines
    there as the lane's own (no second reference starts) and serves an attempt."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    lane, own = {"KGEN_CORES": str(cores[0])}, {"KGEN_CORES": str(cores[-1])}
    task = tasks.discover(TASKS, ["mse"])[0]
    opened = open_bench(task, "small", "cpu", SETTINGS, own)
    try:
        ref = next(iter(opened.references.values()))
        before = [c for pid in sandbox.session_members(ref.proc.pid) for c in _thread_cores(pid)]
        opened.move_reference(own, lane)
        after = [c for pid in sandbox.session_members(ref.proc.pid) for c in _thread_cores(pid)]
        measure_baselines(opened, env=lane)
        result = evaluate.evaluate(opened, REDTEAM / "honest_cpp.py", honest_build, ONCE, env=lane)
        serving = list(opened.references.values())
    finally:
        opened.close()
    assert before and all(c == {cores[-1]} for c in before), before
    assert after and all(c == {cores[0]} for c in after), after
    assert serving == [ref], "a second reference process was started for the lane"
    assert opened.baselines is not None and result.verdict is V.correct, describe(result)


def test_spares_ahead_wait_on_their_own_cores_and_move_to_the_lane(bench, honest_build, cpu_ticks):
    """With cores of their own (the build cores of a GPU machine), spares start ahead, `depth` of
    them, initialised at once on those cores; a taken one has every thread on the lane's cores
    (KGEN_CORES) and judges a candidate as a fresh child would."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    lane, own = cores[0], cores[-1]
    env = evaluate.child_environment("cpu", {"KGEN_CORES": str(lane)})
    spares = Spares(HARNESS, ["eval"], cores=str(own))
    try:
        spares.spawn(env, evaluate.spare_init("cpu", SETTINGS))
        queue = list(spares._waiting[frozenset(env.items())])
        _wait_idle([child.pid for child, _ in queue], cpu_ticks)
        waiting_on = [_thread_cores(child.pid) for child, _ in queue]
        spares.refill = False  # nothing else starts beside the timed attempt on this small machine
        once = SETTINGS.model_copy(update={"load_retries": 0})  # a re-judging on load would take the second spare
        result = evaluate.evaluate(bench("mse"), REDTEAM / "honest_cpp.py", honest_build, once,
                                   env={"KGEN_CORES": str(lane)}, spares=spares)
        taken = spares.take(env, 60)
        moved = _thread_cores(taken.pid)
        taken.kill()
        taken.finish(grace=0.1)
    finally:
        spares.close()
    assert len(queue) == 2 and all(init is None for _, init in queue), "two spares, each sent its Init at start"
    assert all(threads and all(c == {own} for c in threads) for threads in waiting_on), waiting_on
    assert moved and all(c == {lane} for c in moved), moved
    assert result.verdict is V.correct, describe(result)


# ---- timing: the child's clock is the candidate's, the parent's bound is not --------------------


# These cheats were judged correct while the parent's cpu estimate was drowned in input generation:
# Bound inputs now come through the inbox and the estimate is the fastest request, so
# each must get the verdict it asserts, every run.


def test_forged_time_blocks_gains_nothing(bench, tmp_path):
    """Right answers, but the harness's Clock rebound to report 10% of each call's real time: on the cpu
    the time recorded is the parent's window around Bound requests, and the child's Clock is never
    asked at all (no timed blocks, nothing timed at held-out sizes), so the forgery moves nothing."""
    result = run(bench, "forged_time_blocks.py", "mse", tmp_path)
    assert real_ms(result) is None, f"the child's clock was asked on the cpu: {describe(result)}"
    gains_nothing(result)


def test_work_deferred_to_the_output_copy_is_counted(bench, tmp_path):
    """forward returns an empty tensor (spinning to just above the floor) and the rebound
    protocol.put computes it when the harness copies it out, after the child's timer stopped. The
    parent's clock around Bound requests includes that copy, so the work counts there."""
    result = run(bench, "deferred_put.py", "mse", tmp_path)
    real = real_ms(result)
    assert real is not None, f"the patched put never computed anything: {describe(result)}"
    assert result.verdict is not V.correct or load_unfit(result), \
        f"recorded {result.time_ms:.4g} ms for work that cost {real:.4g} ms a call, done after the " \
        f"timer: {describe(result)} unfit={result.device_unfit}"


def test_timed_seeds_are_not_in_the_childs_plan(bench, tmp_path):
    """The candidate reads ahead: on a block's first call it walks up the stack to the harness's
    filled input sets and answers the whole block at once. Every call of a block is timed and the
    block mean is what counts, so the work still shows in full."""
    result = run(bench, "replay_plan.py", "mse", tmp_path)
    if no_figure(result):
        pytest.skip(f"the cpu stayed too loaded to time through the judge's retries: {result.device_unfit}")
    real = real_ms(result)
    assert real is not None, f"the candidate never found the input sets: {describe(result)}"
    assert result.verdict is V.correct, describe(result)
    # Its own measure of the work, not the parent's estimate: the block means must carry all of it.
    assert result.time_ms >= 0.5 * real, \
        f"recorded {result.time_ms:.4g} ms for work that cost {real:.4g} ms a call: {describe(result)}"


def test_patching_the_clock_class_changes_nothing_the_harness_calls(bench, tmp_path):
    """The candidate rebinds pipeline.child.timing.Clock.time_call to report 30% of the real time; the
    harness's Clock bound its methods before the candidate was imported, so the patch never runs."""
    result = run(bench, "clock_class_patch.py", "mse", tmp_path)
    assert not any(n[0] == "class_patch" for n in notes(result)), f"the patched time_call ran: {describe(result)}"
    assert result.verdict is V.correct, describe(result)
    assert no_figure(result) or result.time_ms > 0 and result.timing.n == result.eager_beside.n > 0, describe(result)


def test_work_done_while_inputs_are_built_is_held_to_the_parents_bound(bench, tmp_path):
    """The candidate computes each answer inside tasks.make_inputs, where the harness makes a set from
    a seed, and spins to just above the floor in the call. On the cpu the times recorded are the Bound
    requests' calls, whose inputs come through the inbox, never made from a seed in the window (the
    hook runs for the trials, untimed): the work of every timed call is done in it and counted.
    (Against the child's timed blocks and their refills it once read 0.40-0.56 of the parent's estimate.)"""
    result = run(bench, "replay_input_hook.py", "mse", tmp_path)
    assert_time_earned(result)
    gains_nothing(result)


def test_patched_clock_instance_is_caught(bench, tmp_path):
    """Once a known gap: the live Clock found through gc and its time_call rebound to report 30%.
    On the cpu that Clock is never asked (the parent's windows are the only clock there)."""
    result = run(bench, "clock_instance_patch.py", "mse", tmp_path)
    assert real_ms(result) is None, f"the child's clock was asked on the cpu: {describe(result)}"
    assert_time_earned(result)
    gains_nothing(result)


# ---- the child's files: links, FIFOs, giants ----------------------------------------------------

LOG_TRICKS = ["log_symlink.py", "log_fifo.py", "huge_stdout.py"]
LOG_SETTINGS = SETTINGS.model_copy(update={"trials": 2, "timed_calls": 4, "profile": False, "check_shapes": False})

_EVAL_RUNNER = """
import sys
from pathlib import Path
from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.child import tasks
from pipeline.config import EvalConfig
settings = EvalConfig.model_validate_json(sys.argv[2])
bench = prepare(tasks.discover(Path(sys.argv[1]), ["mse"])[0], "small", "cpu", settings,
                cached_baselines=lambda key: sys.argv[3])
for code, build_dir in zip(sys.argv[4::2], sys.argv[5::2]):
    print("RESULT " + evaluate.evaluate(bench, Path(code), Path(build_dir), settings).model_dump_json(), flush=True)
bench.close()
"""


def test_log_link_fifo_and_giant_leak_and_hang_nothing(bench, tmp_path, monkeypatch):
    """Each candidate swaps its log (HOME/output.log) for a symlink to the parent's
    /proc/PID/environ, a FIFO nobody writes, or a 1 TiB sparse file, then computes honestly. The
    evaluating process (a fresh one, with secrets in its initial environment) must finish each with
    its normal verdict in time, and no secret may reach the result. (It starts its own reference
    process and takes the session's mse baselines as cached ones.)"""
    secrets = {"KGEN_TEST_SECRET": "s3cret-" + uuid.uuid4().hex, "OPENAI_API_KEY": "sk-redteam-" + uuid.uuid4().hex}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    args = []
    for name in LOG_TRICKS:
        (tmp_path / name).mkdir()
        args += [str(REDTEAM / name), str(tmp_path / name)]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _EVAL_RUNNER, str(TASKS), LOG_SETTINGS.model_dump_json(),
                           bench("mse").baselines.model_dump_json(), *args],
                          cwd=ROOT, env=dict(os.environ), capture_output=True, text=True,
                          timeout=60 + len(LOG_TRICKS) * LOG_SETTINGS.timeout_s)
    elapsed = time.monotonic() - started
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert len(lines) == len(LOG_TRICKS), proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "MemoryError" not in proc.stderr
    results = dict(zip(LOG_TRICKS, (EvalResult.model_validate_json(x.removeprefix("RESULT ")) for x in lines)))
    for name, result in results.items():
        assert result.verdict is V.correct, f"{name}: {describe(result)}"
        assert result.eval_seconds < LOG_SETTINGS.timeout_s, f"{name}: {result.eval_seconds:.1f} s"
        text = " ".join(x or "" for x in (result.output, result.detail, result.error))
        for value in secrets.values():
            assert value not in text, f"{name} leaked a secret of the parent's environment"
        assert len(result.output or "") <= 4000
    tricks = {n[0]: n[1:] for r in results.values() for n in notes(r)}
    # each trick was played, or refused outright (the jail leaves the log's folder read-only)
    assert tricks["symlink"][0] in ("True", "refused") and tricks["fifo"][0] in ("True", "refused"), tricks
    # the room's file-size limit refused 1 TiB; the log is still as big as the limit allows
    assert tricks["huge"][0] == "limited" and int(tricks["huge"][1]) >= (1 << 30) - (1 << 20), tricks
    assert tricks["symlink"][1] != "read", tricks  # Landlock kept the child out of the parent's /proc
    assert elapsed < 60 + len(LOG_TRICKS) * LOG_SETTINGS.timeout_s


@pytest.mark.parametrize("name", ["log_fifo.py", "huge_stdout.py"])
def test_log_tricks_at_build_time(tmp_path, name):
    """The same FIFO and 1 TiB tricks from a build's import: build() returns its result in time,
    with the log's tail only."""
    code = REDTEAM / name
    timeout_s = 60
    started = time.monotonic()
    result = build.build(code, "redteam-" + name.removesuffix(".py"), tmp_path / "builds",
                         build.BuildOptions(timeout_s=timeout_s, reuse=False))
    assert time.monotonic() - started < timeout_s
    assert result.ok and not result.timed_out, result.log[-2000:]
    assert len(result.log) < POLICY.log_tail_bytes + 1000
    assert "KGEN-NOTE" in result.log, result.log[-2000:]


# ---- memory across attempts ---------------------------------------------------------------------


def test_nothing_survives_from_one_attempt_to_the_next(bench, tmp_path):
    """Two attempts of the same code and build dir: the first tries to leave a mark in /dev/shm, the
    build dir, /tmp and beside its HOME; the second must find none, and must see other inputs."""
    tag = uuid.uuid4().hex[:12]
    code = tmp_path / "cross_attempt.py"
    code.write_text((REDTEAM / "cross_attempt.py").read_text().replace("__KGEN_TAG__", tag))
    name = f"kgen-redteam-{tag}"
    outside = [Path("/dev/shm") / name, Path("/tmp") / name, Path(tempfile.gettempdir()) / name,
               (tmp_path / "build").resolve() / name]
    try:
        first = run(bench, "", "mse", tmp_path, ONCE, code=code)
        second = run(bench, "", "mse", tmp_path, ONCE, code=code)
        left = [p for p in outside if p.exists()]
    finally:
        for path in outside:
            path.unlink(missing_ok=True)
    assert first.verdict is V.correct and second.verdict is V.correct, describe(second)
    one, two = notes(first), notes(second)
    assert not [n for n in one + two if n[0] == "found"], (one, two)
    assert left == [], left
    for n in one + two:  # writable: its own HOME alone, which went with the attempt
        if n[0] == "wrote":
            # Its own temp folder: tmp/ of a kgen-child- workdir (the jail's layout), gone afterwards.
            home = Path(n[1]).parent
            assert home.name == "tmp" and home.parent.name.startswith("kgen-child-") and not Path(n[1]).exists(), n
    denied = {n[1] for n in one if n[0] == "denied"}
    assert str(outside[0]) in denied, one  # /dev/shm
    # The build folder it sees is the parent's read-only copy in its job folder (the jail), else the original.
    assert any(d.endswith(f"/build/{name}") or d.endswith(f"/build/kgen_redteam/{name}") or
               ("/job/build" in d and d.endswith(name)) for d in denied), one
    hashes = [[n[1] for n in notes_ if n[0] == "inputs"] for notes_ in (one, two)]
    assert len(hashes[0]) == 1 and len(hashes[1]) == 1, hashes
    assert hashes[0] != hashes[1], "both attempts saw the same inputs: the seeds repeat"


def test_siblings_share_a_draw_and_nothing_else(bench, tmp_path):
    """Attempts of one task at one turn and generation (pipeline.judge.bench.Draws) are judged on one
    draw: the second's inputs are the first's and the reference computed its values once (no expect
    phase of its own), yet nothing the first left reaches it. An attempt of another turn draws
    afresh, and a sibling that computes nothing is refused on the shared draw as on its own. One
    evaluation each (evaluate._judge): a refusal on the parent's clock alone is judged again on a
    draw of its own, which is not what this test looks at. At "odd", where every draw is whole (Draws
    keeps only those): at "small" mse's Bound inputs fit ahead only where eager is slow, and CI's
    box kept none."""
    tag = uuid.uuid4().hex[:12]
    code = tmp_path / "cross_attempt.py"
    code.write_text((REDTEAM / "cross_attempt.py").read_text().replace("__KGEN_TAG__", tag))
    name = f"kgen-redteam-{tag}"
    outside = [Path("/dev/shm") / name, Path("/tmp") / name, Path(tempfile.gettempdir()) / name]
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    key = f"siblings {tag}"

    def judge(path: Path, draw: str) -> EvalResult:
        return evaluate._judge(bench("mse", "odd"), path, build_dir, SETTINGS, None, None, None, draw=draw)[0]

    try:
        first, second = judge(code, key), judge(code, key)
        other = judge(code, f"{key}, next turn")
        wrong = judge(REDTEAM / "constant.py", key)
        left = [p for p in outside if p.exists()]
    finally:
        bench("mse", "odd").draws.close()  # the session's bench would keep them for the rest of the run
        for path in outside:
            path.unlink(missing_ok=True)
    for result in (first, second, other):  # honest, if slow: on a loaded box the clock may refuse it
        assert result.verdict in (V.correct, V.impossible_timing), describe(result)
    assert first.phases["shared_draw"] == 0.0 and "expect" in first.phases, first.phases
    assert second.phases["shared_draw"] == 1.0 and "expect" not in second.phases, second.phases
    assert other.phases["shared_draw"] == 0.0, other.phases
    seen = [notes(r) for r in (first, second, other)]
    assert not [n for ns in seen for n in ns if n[0] == "found"], seen
    assert left == [], left
    hashes = [[n[1] for n in ns if n[0] == "inputs"] for ns in seen]
    assert hashes[0] == hashes[1] != hashes[2], hashes
    assert wrong.verdict is V.mismatch and wrong.phases["shared_draw"] == 1.0, describe(wrong)


# ---- the result pipe ----------------------------------------------------------------------------


def test_trickled_reply_times_out_on_schedule(bench, tmp_path, monkeypatch):
    """A byte every 0.2 s and never a newline: the wait for the reply is under the child's absolute
    deadline, so the attempt ends as a timeout at timeout_s, not later."""
    settings = SETTINGS.model_copy(update={"timeout_s": 8})
    started = []
    real_start = sandbox.start

    def start(module, *args, **kwargs):
        child = real_start(module, *args, **kwargs)
        if module == HARNESS:  # the candidate's child, not a reference process
            started.append(child.started)
        return child

    bench("mse")  # the reference process is up before the clock starts
    monkeypatch.setattr(sandbox, "start", start)
    result = run(bench, "trickle.py", "mse", tmp_path, settings)
    ended = time.monotonic()
    assert result.verdict is V.timeout, describe(result)
    assert len(started) == 1
    assert settings.timeout_s - 0.5 <= ended - started[0] <= settings.timeout_s + 4, ended - started[0]


# ---- unequal cores: both sides of a speedup get the same cores ----------------------------------


def test_a_kernel_on_every_core_is_held_to_eager_s_threads(bench, honest_build, prebuilt):
    """omp_all_cores.py spreads honest_cpp.py's loop over every core with std::thread while eager is
    timed on cpu_threads (1) threads. The child is held to that many cores (sandbox.cpu_cores), so
    its threads share that one core (unpinned on the 2-core box: 1.15x against its twin's 0.65x).
    What is asserted is the cores it could run on; the speedups are printed: two evaluations apart on
    a busy shared box (load 6) read 0.47x and 0.78x for the twin and this alike, so their ratio is
    measured over ten runs each (bench/cpu_judge_probe.py; docs/decisions/cpu-timing.md), not here."""
    code = REDTEAM / "omp_all_cores.py"
    built = prebuilt["omp_all_cores.py"]
    assert built.ok, built.log[-4000:]
    twin = evaluate.evaluate(bench("mse"), REDTEAM / "honest_cpp.py", honest_build, SETTINGS)
    spread = evaluate.evaluate(bench("mse"), code, Path(built.build_dir), SETTINGS)
    assert twin.verdict is V.correct and spread.verdict is V.correct, (describe(twin), describe(spread))
    if no_figure(twin) or no_figure(spread):
        pytest.skip("the cpu stayed too loaded to time through the judge's retries: no ratio to compare")
    cores = [int(n[1]) for n in notes(spread) if n[0] == "cores"]
    assert cores and cores[-1] == SETTINGS.cpu_threads, f"the child could run on {cores} cores: {describe(spread)}"
    ratio = spread.eager_ratio.median / twin.eager_ratio.median
    print(f"spread {spread.eager_ratio.median:.3g}x, twin {twin.eager_ratio.median:.3g}x, ratio {ratio:.3g}")


def test_the_cpu_child_and_reference_are_pinned_to_cpu_threads_cores(bench):
    """The reference process (and so eager) runs on exactly the cores the child is held to."""
    ref = bench("mse")._reference(None)
    assert os.sched_getaffinity(ref.proc.pid) == {int(c) for c in sandbox.cpu_cores(SETTINGS.cpu_threads).split(",")}


def test_the_cpu_floor_is_no_slower_than_a_warm_read_of_the_inputs(bench):
    """The floor is the inputs' bytes over the bandwidth where they sit: on the cpu nothing is flushed
    between calls, so a kernel may read them from cache. A warm read of that many bytes here, on the
    timing's threads, must not beat the floor the reference measures in the same moments (a 256 MB copy
    once put mse's at 0.80 ms, and an honest fused mse at 0.65 ms, torch.compile too, was refused as
    impossible_timing). The rounds interleave the two: the baselines' floor, taken minutes earlier on
    a busy box, once read 0.111 ms against a warm read's 0.088 in CI (docs/decisions/cpu-timing.md)."""
    import torch

    b = bench("mse")
    buf = torch.ones(b.baselines.input_bytes // 4)
    threads = torch.get_num_threads()
    torch.set_num_threads(SETTINGS.cpu_threads)
    floors, times = [], []
    try:
        for _ in range(4):
            floors.append(b.floor_now().floor_ms)
            for _ in range(5):
                t0 = time.perf_counter()
                buf.sum()
                times.append((time.perf_counter() - t0) * 1e3)
    finally:
        torch.set_num_threads(threads)
    # Within timing noise of a warm read (the floor is then taken at floor_slack below it): the old
    # 256 MB floor read 1.91 ms against 0.35 here.
    assert min(floors) <= 1.25 * min(times), f"floors {floors} ms, a warm read {min(times):.4g} ms"
    assert b.baselines.floor_ms == min(floors), "the bench keeps the lowest floor it measured"


@pytest.mark.slow
def test_a_floor_taken_in_a_busy_moment_refuses_no_honest_kernel(bench, honest_build):
    """Baselines timed on a busy box (or cached from a slower one) can put the floor above what an honest
    kernel does in a quiet moment. Below it, the floor is measured again beside the claim before
    anything is refused: with the stored floor forged to 100 times eager's time, the honest kernel is
    correct and the bench's floor is back below what it ran at."""
    b = bench("mse")
    kept = b.baselines
    b.baselines = kept.model_copy(update={"floor_ms": 100 * kept.eager.median_ms, "bandwidth_gbs": 0.001})
    try:
        result = evaluate.evaluate(b, REDTEAM / "honest_cpp.py", honest_build, SETTINGS)
        assert result.verdict is V.correct, describe(result)
        assert b.baselines.floor_ms < kept.eager.median_ms and b.baselines.bandwidth_gbs > 1, b.baselines
        assert no_figure(result) or 0 < result.floor_fraction < 1, describe(result)
    finally:
        b.baselines = kept


# ---- a loaded box ------------------------------------------------------------------------------

_SPIN = "import os, sys\nos.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})\nwhile True: pass\n"


def test_beside_two_busy_processes_an_honest_kernel_is_correct_and_a_forged_clock_gains_nothing(bench, prebuilt, tmp_path):
    """Two processes spinning on the very cores the child and eager are held to (sandbox.cpu_cores):
    the honest fused mse is judged correct, faster than eager where it was timed (never refused),
    and the clock forged to 10% of its work gains nothing (pipeline.verdicts).
    The child gets 300 s, not 60: with the spinners on its
    core, on a CI box shared with other work, loading the task alone once took 60 s."""
    # No re-judging on load (load_retries): the spinners never stop, so each retry would meet them
    # again; what is asserted holds of each judgement as it comes.
    settings = SETTINGS.model_copy(update={"timeout_s": 300, "load_retries": 0})
    cores = sandbox.cpu_cores(SETTINGS.cpu_threads)
    code = REDTEAM / "honest_fast_mse.py"
    built = prebuilt["honest_fast_mse.py"]
    assert built.ok, built.log[-2000:]
    (tmp_path / "f").mkdir()
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN, cores]) for _ in range(2)]
    try:
        honest = [evaluate.evaluate(bench("mse"), code, Path(built.build_dir), settings)]
        forged = run(bench, "forged_time_blocks.py", "mse", tmp_path / "f", settings)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    for r in honest:
        assert r.verdict is V.correct, describe(r)
        if not r.device_unfit:
            assert r.speedup_eager > 1.0, describe(r)
    gains_nothing(forged)
