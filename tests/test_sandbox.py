"""The sandbox around untrusted code: the child's environment, process group, working directory and
Landlock confinement, and the build step's log and stale-lock handling."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from pipeline.build import build
from pipeline import sandbox
from pipeline.sandbox import cgroup
from pipeline.child.jail import landlock
from pipeline.policy import POLICY

ROOT = Path(__file__).resolve().parent.parent
SECRETS = {
    "OPENAI_API_KEY": "sk-sandbox-" + uuid.uuid4().hex,
    "KGEN_TEST_SECRET": "s3cret-" + uuid.uuid4().hex,
    "HF_TOKEN": "hf_" + uuid.uuid4().hex,
    "AWS_SECRET_ACCESS_KEY": uuid.uuid4().hex,
    "KGEN_DATABASE": str(ROOT / "db" / "kgen.db"),
}
# What the child may hold: the allow-list, the variables sandbox.start sets itself, and the extras we pass.
SET_BY_SANDBOX = {"HOME", "TMPDIR", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONNOUSERSITE",
                  *POLICY.malloc_env}


def probe(*args: str, extra_env: dict[str, str] | None = None, jail: sandbox.Jail | None = None,
          seen: list | None = None) -> tuple[dict, str, Path]:
    """Run tests/sandbox_probe.py in a sandboxed child; return its report, its log and its workdir.
    With `jail`, the parent's checked confinement of it is appended to `seen`."""
    child = sandbox.start("tests.sandbox_probe", list(args), 120, extra_env, jail=jail)
    report = child.receive()
    if seen is not None:
        seen.append(child.confinement())
    code, log = child.finish()
    assert report is not None, f"probe exited {code}: {log[-3000:]}"
    assert code == 0, log[-3000:]
    return report, log, child.workdir


@pytest.fixture
def secrets(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return SECRETS


def test_child_environment_is_the_allow_list(secrets):
    report, _, _ = probe("plain", extra_env={"TORCH_EXTENSIONS_DIR": "/tmp/kgen-ext"})
    env = report["env"]
    assert set(env) <= set(sandbox.ENV_ALLOW) | SET_BY_SANDBOX | {"TORCH_EXTENSIONS_DIR"}, sorted(env)
    for name, value in secrets.items():
        assert name not in env
        assert not any(value in v for v in env.values()), name
    assert env["TORCH_EXTENSIONS_DIR"] == "/tmp/kgen-ext"


def test_child_runs_in_its_own_group_in_a_fresh_temp_dir():
    first, _, first_dir = probe("plain")
    second, _, second_dir = probe("plain")
    for report, workdir in ((first, first_dir), (second, second_dir)):
        assert report["pgid"] == report["pid"] == report["sid"]  # leader of a new session and group
        assert report["pgid"] != os.getpgid(0)
        assert report["ppid"] == os.getpid()
        assert report["cwd"] == str(workdir) == report["env"]["HOME"] == report["env"]["TMPDIR"]
        assert Path(report["cwd"]).name.startswith("kgen-child-")
        assert report["cwd_listing"] == ["output.log"]  # nothing but the child's own log
        assert not workdir.exists()  # removed when the child finished
    assert first_dir != second_dir


def test_a_forked_module_runs_as_python_m_would_with_nothing_on_its_output():
    """A reference process forked from a zygote that preloaded its module runs it as `python -m` would:
    a fresh copy as __main__, and no warning from runpy about the preloaded one (it began every log)."""
    child = sandbox.start("pipeline.judge.reference", ["--no-such-option"], 120, fork=True)
    code, log = child.finish()
    assert code == 2 and log.startswith("usage: pipeline.judge.reference"), log[-2000:]
    assert "RuntimeWarning" not in log, log[-2000:]


@pytest.mark.skipif(landlock.abi_version() == 0, reason="Landlock is not available on this kernel")
def test_landlock_confines_the_child(tmp_path, secrets):
    outside = tmp_path / "outside.txt"  # under pytest's tmp dir: neither HOME nor a build dir
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    try:
        report, log, _ = probe("confined", str(outside), str(ROOT / "pyproject.toml"),
                               str(listener.getsockname()[1]))
        confinement = report["confinement"]
        assert confinement["filesystem"] is True and confinement["seccomp"] is True, log
        assert confinement["private_tmp"] is True, log  # HOME and TMPDIR are this child's alone
        assert report["write_home"] == "ok"  # the one place it may write
        assert report["write_outside"].startswith("denied"), report
        assert not outside.exists()
        assert report["write_dev_shm"].startswith("denied"), report
        assert confinement["network"] is (landlock.abi_version() >= 4)
        assert confinement["signals"] is (landlock.abi_version() >= 6)
        assert report["read_project"].startswith("denied"), report  # the project folder holds the database
        # Another process's /proc/PID/environ holds the environment it started with (API keys in
        # a shell's, or in `kgen run`'s); Landlock lets a same-uid process read it unless /proc
        # itself is off the read list.
        assert report["read_parent_environ"].startswith("denied"), report
        assert report["read_own_status"] == "ok" and report["read_cpuinfo"] == "ok"
        assert report["setsid_in_fork"] == "denied"  # seccomp: nothing leaves the session we sweep
        if landlock.abi_version() >= 4:
            assert report["tcp_connect"].startswith("denied"), report
            with pytest.raises(BlockingIOError):
                listener.accept()
        if landlock.abi_version() >= 6:
            assert report["signal_parent"].startswith("denied"), report
    finally:
        listener.close()


def test_a_child_forked_from_the_zygote_holds_no_secret_of_the_parent_in_its_memory(secrets):
    """The zygote is started by exec with the allow-listed environment, never forked from the parent:
    a fresh one, started while the parent holds the secrets, leaves none of them in the memory of a
    child forked from it (its heap, anonymous memory and stack, read by the child itself). The parent's
    own memory holds them (the control: the same scan, of a process that inherits our environment)."""
    from pipeline.sandbox import zygote

    zygote._close()  # the next jailed child starts a zygote now, while our environment holds the secrets
    halves = [part for value in secrets.values() for part in (value[:len(value) // 2], value[len(value) // 2:])]
    report, log, _ = probe("memscan", *halves, jail=sandbox.Jail(gpu=False))
    assert report["scanned_bytes"] > 50 << 20, report["scanned_bytes"]  # torch and Python's heap: it looked
    assert report["found"] == [], log[-2000:]
    control = subprocess.run([sys.executable, "-m", "tests.sandbox_probe", "--result-fd", "1", "memscan", *halves],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert json.loads(control.stdout)["found"] == list(range(len(secrets)))


def test_a_zygote_whose_forks_could_not_use_cuda_is_seen_before_it_serves(monkeypatch):
    """torch marks a fork "bad" (no CUDA in it) once its parent has called the CUDA runtime; on the H100
    an import in the zygote did, and the forked reference failed ("Cannot re-initialize CUDA in forked
    subprocess"). The zygote asks a fork of itself before it serves; here torch's own mark is set."""
    import torch

    from pipeline.child import zygote as Z

    assert not Z._fork_poisoned()
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    assert Z._fork_poisoned()


DEAD_ZYGOTE = """
import ctypes, json, os, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: what the dead zygote orphans waits on us, unreaped
from pipeline import sandbox
from pipeline.sandbox import zygote
child = sandbox.start("tests.sandbox_probe", ["spin"], 120, jail=sandbox.Jail(gpu=False))
assert child.receive() is not None
namespace = child.room_namespace()
first = zygote.zygote(sandbox.child_env())
first.proc.kill()
first.proc.wait()
code, _ = child.finish(grace=5)
zombies = sandbox.in_namespace(namespace)
while True:  # ours now, and this process does nothing else: reap them all
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
print(json.dumps({"code": code, "left": child.left, "zombies": zombies}))
"""


def test_a_dead_zygote_takes_its_rooms_with_it_and_the_next_child_gets_a_new_one():
    """Killing the zygote kills its rooms. The room's pid 1 then waits, a zombie, for whoever reaps
    orphans (here a process that never does until the end, as a CI box's pid 1 did): it runs nothing,
    and is not counted as left."""
    from pipeline.sandbox import zygote

    done = subprocess.run([sys.executable, "-c", DEAD_ZYGOTE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["zombies"], seen  # the case happened: the room's pid 1, dead and unreaped, after finish
    assert seen["code"] == -signal.SIGKILL and seen["left"] == [], seen
    report, log, _ = probe("plain", jail=sandbox.Jail(gpu=False))
    assert report["pid"] == 2, log[-2000:]  # pid 2 of a room, forked from this process's zygote
    first = zygote.zygote(sandbox.child_env())
    first.proc.kill()
    first.proc.wait()
    assert zygote.zygote(sandbox.child_env()) is not first


def test_a_killed_rooms_first_process_is_reaped_by_the_zygote_not_left_to_the_hosts_pid_1():
    """Killing a room's outer process orphans the room's pid 1, which dies with it: the zygote, the child
    subreaper of its forks, reaps it at once. Left to the host's pid 1 it stayed a zombie in the room's
    namespace for a second here, and on a loaded CI box past the parent's look from outside (2 s): two
    killed attempts were counted as leaving processes behind."""
    child = sandbox.start("tests.sandbox_probe", ["spin"], 120, jail=sandbox.Jail(gpu=False))
    assert child.receive() is not None
    namespace = child.room_namespace()
    child.kill()
    parents, end = set(), time.monotonic() + 5
    while (pids := sandbox.in_namespace(namespace)) and time.monotonic() < end:
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parents.add(int(f.read().rsplit(")", 1)[1].split()[1]))
            except (OSError, IndexError):
                pass
        time.sleep(0.005)
    waited = 5 - (end - time.monotonic())
    code, _ = child.finish(grace=1)
    assert not pids and child.left == [], (pids, child.left)
    assert 1 not in parents and waited < 1.0, (parents, waited)


@pytest.mark.skipif(landlock.abi_version() == 0, reason="Landlock is not available on this kernel")
def test_the_jail_holds_on_every_thread_from_before_the_interpreter(tmp_path, secrets):
    """The jail (pipeline/sandbox/confine.py) confines the process before Python starts: a thread started
    first thing, before the probe does anything else, is as confined as the main thread; the
    parent's own check of the child says so (uid, seccomp, namespaces), not the child."""
    outside = tmp_path / "outside.txt"
    secret = tmp_path / "expected.f64"  # a file of the parent's, readable by its permissions
    secret.write_bytes(b"the answers")
    os.chmod(tmp_path, 0o755)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    seen: list = []
    try:
        report, log, workdir = probe("jailed", str(outside), str(secret), str(ROOT / "pyproject.toml"),
                                     str(listener.getsockname()[1]), jail=sandbox.Jail(gpu=False), seen=seen)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the host's loopback, from any thread
    finally:
        listener.close()
    confinement = seen[0]
    assert confinement.set_by == "parent" and confinement.before_exec and confinement.filesystem, confinement
    assert confinement.seccomp and confinement.netns and confinement.network, confinement
    if os.geteuid() == 0:
        assert confinement.uid == 65534 and "/tmp" in confinement.masked, confinement
    assert confinement.not_root
    for where in ("main", "thread"):
        seen_there = report[where]
        assert seen_there["uid"] != 0, report
        assert seen_there["write_home"] == "ok", report
        for probe_name in ("write_outside", "read_secret", "read_project", "read_parent_environ", "tcp_connect",
                           "write_job", "signal_parent"):
            assert seen_there[probe_name].startswith("denied"), (where, probe_name, seen_there)
    assert not outside.exists() and not list(workdir.parent.glob("kgen-child-*/job/pwned"))
    assert secrets["OPENAI_API_KEY"] not in log and "the answers" not in log


def _host_shm_keys() -> set[int]:
    """System V shared-memory keys the host's IPC namespace holds (ours: the test's)."""
    keys = set()
    with open("/proc/sysvipc/shm") as f:
        for line in f.readlines()[1:]:
            keys.add(int(line.split()[0]))
    return keys


@pytest.mark.skipif(os.geteuid() != 0, reason="the room's cgroup and mounts need root")
def test_a_room_closes_every_channel_from_every_thread(tmp_path):
    """A jailed child's room, probed from the main thread and from a thread started before the
    interpreter did anything: no host Unix socket (under /run or anywhere), no keyring, no user
    namespace, no io_uring, no file past the size limit, no host process in sight; a System V
    segment it makes stays in its own IPC namespace (the host never sees it, the next room does not
    find it); the parent checked each namespace, the cgroup and the limits itself, and once the room
    ended nothing of it was left, seen from outside."""
    socks = [Path(f"/run/kgen-test-{os.getpid()}.sock"), tmp_path / "service.sock"]
    os.chmod(tmp_path, 0o755)
    listeners = []
    for path in socks:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        os.chmod(path, 0o777)  # a service anyone may talk to
        server.listen(4)
        server.setblocking(False)
        listeners.append(server)
    key = 700_000 + os.getpid() % 1000 * 1000
    before = _host_shm_keys()
    try:
        for sock_path in socks:
            seen: list = []
            child = sandbox.start("tests.sandbox_probe", ["jailed", str(tmp_path / "o"), str(tmp_path / "s"),
                                  str(ROOT / "pyproject.toml"), "1", str(sock_path), str(key)], 120,
                                  jail=sandbox.Jail(gpu=False))
            report = child.receive()
            seen.append(child.confinement())
            pidns, room = child.room_namespace(), child.room
            # Our own hold on the namespace: once freed, its inode may be a later room's (another test's).
            held = os.open(f"/proc/{child.proc.pid}/ns/pid_for_children", os.O_RDONLY)
            code, log = child.finish()
            assert report is not None and code == 0, log[-3000:]
            c = seen[0]
            assert c.pidns and c.ipcns and c.utsns and c.netns and c.cgroup and c.limits, (c, child.status)
            for where in ("main", "thread"):
                got = report[where]
                for name in ("unix_connect", "keyring", "userns", "io_uring", "big_file", "signal_parent"):
                    assert got[name].startswith("denied"), (where, name, got)
                assert got["sysv_found"] == "absent" and got["sysv_create"] == "ok", got  # its own namespace
                # pid 2 of a namespace of its own, under the room's pid 1: no process of the host is
                # nameable, only the room's init and its own threads
                assert got["pid"] == 2 and set(got["ns_pids"]) <= {1, *got["own_tasks"]}, got
            try:
                assert pidns and not sandbox.in_namespace(pidns), "a process of the room outlived it"
            finally:
                os.close(held)
            assert room is not None and not Path(room.folders[0]).exists(), "the room's cgroup was left"
            assert not child.left
        for server in listeners:
            with pytest.raises(BlockingIOError):
                server.accept()  # nothing connected, from any thread of either room
        assert _host_shm_keys() == before, "a System V segment of the room reached the host"
    finally:
        for server, path in zip(listeners, socks):
            server.close()
            path.unlink(missing_ok=True)


BROKEN = textwrap.dedent('''
    import torch.nn as nn
    from torch.utils.cpp_extension import load_inline

    _ext = load_inline(name="kgen_sandbox_broken", functions=["twice"], cpp_sources="""
    torch::Tensor twice(torch::Tensor x) { return x * ; }
    """)


    class ModelNew(nn.Module):
        def forward(self, x):
            return _ext.twice(x)
''')

# Code that names no C++ extension gets no build child (build.NOTHING_TO_BUILD): what tests the build
# child itself names one.
NAMES_AN_EXTENSION = "from torch.utils.cpp_extension import load_inline  # noqa: F401\n"

PURE_PYTHON = NAMES_AN_EXTENSION + textwrap.dedent('''
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, predictions, targets):
            return torch.mean((predictions - targets) ** 2)
''')


@pytest.mark.slow
def test_failed_build_keeps_the_compiler_error(tmp_path):
    code = tmp_path / "broken.py"
    code.write_text(BROKEN)
    # fast=False: one plain build (with the fast headers a failing build is tried twice; that
    # fallback has its own test in tests/test_headers.py)
    result = build.build(code, "broken0000000000", tmp_path / "builds", build.BuildOptions(timeout_s=600, fast=False))
    assert not result.ok and not result.timed_out
    assert "error:" in result.log
    assert "expected primary-expression" in result.log, result.log[-3000:]  # g++'s own words
    assert "error" in build.failure_line(result).lower()


def test_stale_lock_is_removed_before_building(tmp_path):
    root = tmp_path / "builds"
    code_hash = "purepython000000"
    build_dir = build.build_dir_for(root, code_hash)
    lock = build_dir / "kgen_some_ext" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    assert build.clear_stale_locks(build_dir) == [lock]
    assert not lock.exists()

    lock.touch()  # a killed build left it again; build() must clear it itself
    code = tmp_path / "pure.py"
    code.write_text(PURE_PYTHON)
    result = build.build(code, code_hash, root, build.BuildOptions(timeout_s=120, reuse=False))
    assert result.ok, result.log[-3000:]
    # The jailed build wrote a folder of its own, which replaced the old one, stale lock and all.
    assert not lock.exists()
    assert (build_dir / "kgen_some_ext").exists() is False or not any(build_dir.rglob("lock"))
    assert result.build_dir == str(build_dir.resolve())


def test_core_plan_keeps_builds_off_the_lanes_timing_cores():
    from pipeline.run.executor import core_plan

    assert core_plan(1, list(range(16))) == ([[0, 1]], list(range(2, 16)))
    assert core_plan(2, list(range(8))) == ([[0, 1], [2, 3]], [4, 5, 6, 7])
    assert core_plan(1, [0, 1]) is None  # too few to split: nothing pinned
    assert core_plan(1, [3, 9, 4, 5]) == ([[3, 4]], [5, 9])


def test_a_lane_s_job_runs_on_the_lane_s_cores_and_the_rest_of_the_parent_does_not():
    """The parent's clock times every window on a GPU: a lane's job (executor._lane_job, in a worker
    thread) runs on that lane's cores and what it starts inherits them; the thread goes back to its
    own cores after, even where the job raised, and the process's other threads never move."""
    import asyncio

    from pipeline.run.executor import _lane_job

    mine = sorted(os.sched_getaffinity(0))
    lane = str(mine[-1])

    def job():
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True)
        return sorted(os.sched_getaffinity(0)), child.stdout.strip()

    def failing():
        raise RuntimeError("the stage failed")

    async def in_a_worker():
        ran = await asyncio.to_thread(_lane_job, job, None, None, lane)
        with pytest.raises(RuntimeError):
            await asyncio.to_thread(_lane_job, failing, None, None, lane)
        return ran, await asyncio.to_thread(lambda: sorted(os.sched_getaffinity(0)))

    (during, started), after = asyncio.run(in_a_worker())
    assert during == [int(lane)] and started == f"[{lane}]", (during, started)
    assert after == mine and sorted(os.sched_getaffinity(0)) == mine, (after, mine)


def test_a_pinned_build_stays_on_its_cores_whatever_the_candidate_asks(tmp_path):
    """KGEN_CORES pins the child from the parent right after exec; the harness's seccomp filter then
    refuses sched_setaffinity, so import-time code of the candidate cannot move onto a lane's cores."""
    core = sorted(os.sched_getaffinity(0))[-1]
    code = tmp_path / "pinned.py"
    code.write_text(NAMES_AN_EXTENSION + textwrap.dedent("""
        import os
        print("KGEN-NOTE affinity", sorted(os.sched_getaffinity(0)), flush=True)
        try:
            os.sched_setaffinity(0, set(range(os.cpu_count())))
            print("KGEN-NOTE widened", sorted(os.sched_getaffinity(0)), flush=True)
        except OSError as exc:
            print("KGEN-NOTE refused", type(exc).__name__, flush=True)

        class ModelNew:
            pass
    """))
    result = build.build(code, "pinned", tmp_path / "builds",
                         build.BuildOptions(timeout_s=120, env={"KGEN_CORES": str(core)}, fast=False, reuse=False))
    assert result.ok, result.log
    assert f"KGEN-NOTE affinity [{core}]" in result.log, result.log
    assert "KGEN-NOTE refused PermissionError" in result.log and "widened" not in result.log, result.log


def test_pause_stops_every_process_of_the_childs_session(cpu_ticks):
    """What keeps a candidate's helpers off the cpu while the reference times eager beside it
    (session.Session's eager blocks): pause stops the child and everything it forked, so none gains
    cpu time, and resume lets them run again."""
    child = sandbox.start("tests.sandbox_probe", ["spin"], 120)
    try:
        report = child.receive()
        assert report is not None and len(report["spinners"]) == 2, child.log()[-2000:]
        pids = [report["pid"], *report["spinners"]]
        time.sleep(0.3)
        child.pause()
        states = {pid: state for pid, state in sandbox.session_members(child.proc.pid, with_state=True)}
        before = [cpu_ticks(pid) for pid in report["spinners"]]
        time.sleep(0.5)
        paused = [cpu_ticks(pid) for pid in report["spinners"]]
        child.resume()
        time.sleep(0.5)
        resumed = [cpu_ticks(pid) for pid in report["spinners"]]
    finally:
        child.kill()
        child.finish(grace=0.1)
    assert set(pids) <= set(states) and all(states[pid] in ("T", "t") for pid in pids), states
    assert paused == before, f"a paused spinner ran: {before} -> {paused}"
    assert all(r > p for r, p in zip(resumed, paused)), f"a resumed spinner did not run: {paused} -> {resumed}"


SPARE_CANDIDATE = """
import os
from pathlib import Path
print("KGEN-NOTE affinity", sorted(os.sched_getaffinity(0)), flush=True)
print("KGEN-NOTE extensions", os.environ.get("TORCH_EXTENSIONS_DIR"), flush=True)
print("KGEN-NOTE secret", os.environ.get("KGEN_TEST_SECRET"), flush=True)
try:
    os.sched_setaffinity(0, set(range(os.cpu_count())))
    print("KGEN-NOTE widened", flush=True)
except OSError as exc:
    print("KGEN-NOTE refused", type(exc).__name__, flush=True)
try:
    Path(OUTSIDE).write_text("planted")
    print("KGEN-NOTE wrote outside", flush=True)
except OSError as exc:
    print("KGEN-NOTE outside", type(exc).__name__, flush=True)

class ModelNew:
    pass
"""


def test_a_build_child_started_ahead_builds_confined_as_a_fresh_one(tmp_path, secrets):
    """build.BuildSpares: a child that imported torch before its build was known gets the build's
    variables from the job, then confines itself (Landlock, seccomp, its pinned cores) before the
    candidate's module runs; the secrets in the parent's environment never reach it."""
    core = sorted(os.sched_getaffinity(0))[-1]
    outside = tmp_path / "outside.txt"
    code = tmp_path / "spare.py"
    code.write_text(NAMES_AN_EXTENSION + f"OUTSIDE = {str(outside)!r}\n" + SPARE_CANDIDATE)
    env = {"KGEN_CORES": str(core)}
    spares = build.BuildSpares(1)
    try:
        spares.fill(env, wait=True)
        waiting = spares._waiting[frozenset(env.items())][0]
        result = build.build(code, "spare0", tmp_path / "builds", build.BuildOptions(timeout_s=120, env=env, fast=False, reuse=False),
                             spares=spares)
        assert result.ok, result.log
        assert waiting.proc.poll() is not None  # the child started ahead built it, and is gone
        # It built into its own out/ folder (the only one it may write), which became the build's.
        assert re.search(r"KGEN-NOTE extensions /\S*/kgen-child-\w+/out\n", result.log), result.log
        assert Path(result.build_dir) == tmp_path / "builds" / "spare0" and Path(result.build_dir).is_dir()
        assert "KGEN-NOTE secret None" in result.log
        assert f"KGEN-NOTE affinity [{core}]" in result.log
        assert "KGEN-NOTE refused PermissionError" in result.log and "widened" not in result.log
        if os.environ.get("KGEN_LANDLOCK") != "0" and landlock.abi_version() > 0:
            # Refused, or not there at all: the child's /tmp is a fresh one (the jail's mount namespace).
            assert re.search(r"KGEN-NOTE outside (PermissionError|FileNotFoundError)", result.log), result.log
            assert not outside.exists()
        spares.fill(env, wait=True)  # the next one waits already (take started it)
        assert [c.proc.poll() for c in spares._waiting[frozenset(env.items())]] == [None]
        later = spares._waiting[frozenset(env.items())][0]
    finally:
        spares.close()
    assert later.proc.wait(timeout=10) is not None  # close() ends the ones still waiting


def test_kgen_cpu_cores_names_the_cores_a_cpu_evaluation_takes_first(monkeypatch, tmp_path):
    """Two cpu jobs on one machine each time on cores of their own (KGEN_CPU_CORES), not both on the
    first; a value that names no usable core is one line naming it."""
    cores = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("KGEN_CPU_CORES", str(cores[-1]))
    assert sandbox.cpu_cores(1) == str(cores[-1])
    taken = [int(c) for c in sandbox.cpu_cores(len(cores)).split(",")]
    assert taken[0] == cores[-1] and sorted(taken) == cores  # then the others, none twice
    monkeypatch.setenv("KGEN_CPU_CORES", f"{cores[-1]},{cores[-1]}")  # named twice, taken once
    assert [int(c) for c in sandbox.cpu_cores(len(cores)).split(",")] == taken
    monkeypatch.delenv("KGEN_CPU_CORES")
    assert sandbox.cpu_cores(1) == str(cores[0])
    for bad, why in (("one", "expected core numbers"), (str(max(cores) + 4096), "none of these cores")):
        monkeypatch.setenv("KGEN_CPU_CORES", bad)
        with pytest.raises(ValueError, match=f"KGEN_CPU_CORES='{bad}': {why}"):
            sandbox.cpu_cores(1)
    # `kgen run` on the cpu says it in one line before it builds anything (not once per attempt after).
    from click.testing import CliRunner

    from pipeline.cli.main import main

    db = tmp_path / "kgen.db"
    ran = CliRunner().invoke(main, ["run", "-c", str(Path(__file__).parent.parent / "config.yaml"), "--db", str(db),
                                    "--backend", "cpu"])
    assert ran.exit_code == 1 and ran.output.strip().splitlines() == [
        f"Error: KGEN_CPU_CORES='{bad}': none of these cores is among this process's {cores}"], ran.output
    import sqlite3  # the database was opened for the run, and nothing was asked, built or judged

    con = sqlite3.connect(db)
    try:
        assert [con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("runs", "builds", "attempts")] == [0, 0, 0]
    finally:
        con.close()


@pytest.mark.skipif(os.geteuid() != 0 or cgroup.available() is None, reason="cgroups need root and a pids/memory hierarchy")
def test_a_room_left_by_a_killed_run_is_swept_and_a_live_one_kept(tmp_path):
    """A kgen killed before it removed its rooms' cgroups leaves them empty; the next room made
    removes those whose maker has exited, never one of a live process, not even one whose workdir
    is not where the sweeper looks (another process's TMPDIR: a live, empty room swept so was
    "no cgroup" to its jail, once in four runs of four test files)."""
    made = subprocess.run([sys.executable, "-c", "from pipeline.sandbox import cgroup; "
                           "print(cgroup.make('kgen-child-left', 10, 1 << 30).folders[0])"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    left = cgroup.Room([made.stdout.strip()], [])  # its maker has exited
    assert Path(left.folders[0]).is_dir(), made.stderr[-2000:]
    live = cgroup.make("kgen-child-live", 10, 1 << 30)  # ours, its workdir nowhere
    assert live is not None
    new = None
    try:
        new = cgroup.make("kgen-child-new", 10, 1 << 30, workdirs=tmp_path)
        assert new is not None
        assert not Path(left.folders[0]).exists(), left.folders
        assert all(Path(f).exists() for f in live.folders), live.folders
    finally:
        for room in (left, live, new):
            if room is not None:
                room.remove()
