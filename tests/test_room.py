"""The red team's half of a sealed room per attempt (docs/threat-model.md). Each hole, as a candidate
in tests/redteam/ run for real on the cpu backend (`kgen run` on a batch, `kgen eval` in a fresh
process), with what must be true once the room holds, checked from outside where it can be:

1. siblings share answers (sibling_sysv.py beside its honest twin): no sibling is correct and faster
   than eager by reading what another computed, and no System V segment is left after the batch;
2. processes outlive the attempt (pid_hopper.py): after `kgen eval` returns, no process the attempt
   started (from its build or its evaluation) is alive, by /proc and by `ps`;
3. channels the jail leaves open (channels.py): from the build child and the evaluation child, each
   channel is refused (the candidate's note says so, and nothing reached the test's listener, and
   nothing is left in `ipcs`);
4. load launders a forged clock (load_launder.py beside its honest twin): the cpu's one clock is the
   parent's, so the forged claims move nothing; a timing marked unfit carries no speedup figure, and
   `kgen eval` exits non-zero for it.

Every candidate fills in a TAG the test substitutes, so runs do not collide and the test can find
(and remove) what each left behind.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from pipeline.records import EvalResult, Verdict

from forgers import UNEARNED_X
from pipeline.store.store import Store

ROOT = Path(__file__).resolve().parent.parent
REDTEAM = Path(__file__).resolve().parent / "redteam"
TASKS = ROOT / "reference_tasks"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
EVALUATION = {"trials": 3, "timed_calls": 8, "warmup_calls": 1, "compile_baseline": False,
              "check_shapes": False, "profile": False, "timeout_s": 120}


# Each attack's honest twin: the same file with the attack turned off.
TWIN = {"sibling_sysv.py": {"SHARE = True": "SHARE = False"},
        "sibling_sysv_cuda.py": {"SHARE = True": "SHARE = False"},
        "load_launder.py": {"FACTOR = 0.1": "FACTOR = 1.0"}}


def tagged(name: str, tag: str, dest: Path, **subs: str) -> Path:
    """The candidate `name` with its TAG (and any other `subs`, literal text to literal text) filled in."""
    text = (REDTEAM / name).read_text().replace("__KGEN_TAG__", tag)
    for old, new in subs.items():
        assert old in text, (name, old)
        text = text.replace(old, new)
    path = dest / name
    path.write_text(text)
    return path


def notes(text: str | None) -> list[list[str]]:
    """The KGEN-NOTE lines in `text`, as the words after the tag."""
    found = []
    for line in (text or "").splitlines():
        at = line.find("KGEN-NOTE ")
        if at >= 0:
            found.append(line[at:].split()[1:])
    return found


def write_config(tmp: Path, answers: list[str], size: str = "odd", evaluation: dict | None = None,
                 backend: str = "cpu") -> Path:
    """A batch of len(answers) samples of mse on `backend`, each answered in turn by the replay provider."""
    replay = tmp / "replay.jsonl"
    replay.write_text("".join(json.dumps({"task": "mse", "backend": backend, "text": f"```python\n{code}\n```\n"}) + "\n"
                              for code in answers))
    cfg = {
        "models": [{"name": "recorded", "provider": "replay", "replay_file": str(replay)}],
        "tasks": {"names": ["mse"], "size": size, "directory": str(TASKS)},
        "prompts_dir": str(ROOT / "prompts"),
        "samples": len(answers),
        "backend": backend,
        "database": str(tmp / "kgen.db"),
        "generated_dir": str(tmp / "generated"),
        "build_dir": str(tmp / "builds"),
        "evaluation": {**EVALUATION, **(evaluation or {})},
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


_KGEN_PIDS: set[int] = set()  # kgen processes this test started: the subreaper's reaper leaves them to subprocess


def kgen(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    with subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], cwd=cwd, env=ENV, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        _KGEN_PIDS.add(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        finally:
            _KGEN_PIDS.discard(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def subreaper():
    """This test process as the child subreaper of everything it starts (prctl PR_SET_CHILD_SUBREAPER),
    with a thread reaping what is orphaned to it: a hopper leaves a zombie at every hop, and on a host
    whose pid 1 does not reap orphans (this box's) each would hold a pid for good. What escapes is
    still alive and still found; only its dead are reaped here instead of by pid 1."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(36, 1, 0, 0, 0) == 0, ctypes.get_errno()  # PR_SET_CHILD_SUBREAPER
    stop = threading.Event()
    me = os.getpid()

    def reap() -> None:
        while not stop.wait(0.2):
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or int(entry.name) in _KGEN_PIDS:
                    continue
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                fields = stat[stat.rindex(")") + 2:].split()
                if fields[0] == "Z" and int(fields[1]) == me:
                    try:
                        os.waitpid(int(entry.name), os.WNOHANG)
                    except ChildProcessError:
                        pass

    thread = threading.Thread(target=reap, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()
    libc.prctl(36, 0, 0, 0, 0)


def stored(db: Path) -> list[dict]:
    """Every attempt stored in `db` (batch and `kgen eval` runs), as Store.attempt gives it."""
    store = Store.open(db, reader=True)
    try:
        return [store.attempt(a["id"]) for a in store.attempts(evals=True)]
    finally:
        store.close()


def batch_results(db: Path) -> list[EvalResult]:
    return [a["result"] for a in stored(db)]


def describe(r: EvalResult) -> str:
    return (f"{r.verdict.value} speedup_eager={r.speedup_eager} time_ms={r.time_ms} trusted={r.trusted} "
            f"unfit={r.device_unfit} error={r.error} shared_draw={r.phases.get('shared_draw')} "
            f"notes={notes(r.output)}")


def faster(r: EvalResult) -> bool:
    """Judged correct and faster than eager: what the sibling cheat wants."""
    return r.verdict is Verdict.correct and r.speedup_eager is not None and r.speedup_eager > 1.0


def sysv_key(tag: str) -> int:
    """sibling_sysv.py's KEY for `tag` (the same derivation)."""
    return int("".join(c for c in tag if c in "0123456789abcdef")[:7] or "4b67", 16) | 0x10000000


def ipcs_keys() -> dict[str, set[int]]:
    """Every System V object's key, by kind (m, q, s), as `ipcs` lists them in the test's IPC namespace."""
    found: dict[str, set[int]] = {}
    for kind in ("m", "q", "s"):
        out = subprocess.run(["ipcs", f"-{kind}"], capture_output=True, text=True, check=True).stdout
        found[kind] = {int(m.group(1), 16) for m in re.finditer(r"^(0x[0-9a-f]+)\s", out, re.M)}
    return found


def ipcrm(kind: str, key: int) -> None:
    subprocess.run(["ipcrm", f"-{kind.upper()}", str(key)], capture_output=True)


# ---- 1. siblings share answers ------------------------------------------------------------------


@pytest.mark.slow
def test_siblings_share_no_answers_through_sysv_shm(tmp_path):
    """Three samples of mse at "odd", judged on one draw: sibling_sysv.py twice (the first to run
    computes each answer and publishes it in a System V segment, the second returns what it finds
    there without reading its inputs) and its honest twin (the same kernel, no segment). The kernel
    itself is slower than eager (a compensated double sum), so no sample may be judged correct and
    faster than eager: one that is read its sibling's answers. Each computing sample is correct, and
    after the batch no segment with the candidates' key is left (`ipcs`)."""
    tag = uuid.uuid4().hex[:12]
    key = sysv_key(tag)
    attack = tagged("sibling_sysv.py", tag, tmp_path).read_text()
    honest = tagged("sibling_sysv.py", tag, tmp_path, **TWIN["sibling_sysv.py"]).read_text()
    config = write_config(tmp_path, [attack, attack, honest])
    try:
        proc = kgen("run", "-c", str(config), cwd=tmp_path)
        left = ipcs_keys()["m"]
    finally:
        ipcrm("m", key)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = batch_results(tmp_path / "kgen.db")
    assert len(results) == 3, [describe(r) for r in results]
    shown = "\n".join(describe(r) for r in results)
    print(shown)
    # Siblings: one draw for the three (the first computed it; the later ones reused it). A sample
    # judged again on a loaded box (evaluation.load_retries) is judged on a fresh draw of its own, with
    # no shared_draw phase; the others still shared theirs.
    draws = [r.phases.get("shared_draw") for r in results]
    shared = sorted(d for d in draws if d is not None)
    assert shared == [0.0, 1.0, 1.0] or (None in draws and shared in ([0.0, 1.0], [1.0, 1.0], [0.0], [1.0], [])), shown
    twin = [r for r in results if not any(n[:2] == ["shm", "attached"] or n[:2] == ["shm", "denied"]
                                          for n in notes(r.output))]
    assert len(twin) == 1 and twin[0].verdict is Verdict.correct, shown  # the honest kernel is right
    assert not faster(twin[0]), shown  # and slower than eager: a fast sibling got its speed elsewhere
    # Whichever sibling computed (found nothing) is correct; none is correct and faster than eager.
    assert any(r.verdict is Verdict.correct for r in results if r is not twin[0]), shown
    # Each attack sample's own count (its last `shm hits H misses M` note): one that read its
    # sibling's answers served nearly every call from the table (today 512 of 512); one that computed
    # found only the few repeats of its own calls. A figure withheld for an unfit timing alone must
    # not pass for a closed channel.
    counts = [[(int(n[2]), int(n[4])) for n in notes(r.output) if n[:2] == ["shm", "hits"]] for r in results
              if r is not twin[0]]
    assert all(c and c[-1][0] < c[-1][1] for c in counts), f"a sibling served its calls from the table: {counts}"
    assert [r for r in results if faster(r)] == [], shown
    assert key not in left, f"a System V segment with key {key:#x} outlived the batch"


# ---- 2. processes outlive the attempt -----------------------------------------------------------


def proc_table() -> list[tuple[int, str, str, int]]:
    """(pid, comm, state, pgrp) of every process, zombies included, from /proc."""
    rows = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        rows.append((int(entry.name), comm, fields[0], int(fields[2])))
    return rows


def frozen_survivors(names: set[str], groups: set[int]) -> tuple[list[tuple[int, str, str, int]], set[int]]:
    """Live processes named `names` or in process groups `groups`, found so a hopper cannot slip past.

    A process that forks and exits every few milliseconds is gone from /proc before a scan (ours or
    `ps`) reaches its new pid: a plain scan saw none while two were hopping. Its process group does
    not change, so each group seen (the hint `groups`, and the group of every process by those names,
    its zombies included, over a second of scans) is stopped at once with killpg(SIGSTOP); what is
    then live in it is stopped in place and found. They are left stopped for end_hoppers. Returns
    the survivors and every group looked at."""
    seen = set(groups)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        seen |= {pgrp for _, comm, _, pgrp in proc_table() if comm in names}
        time.sleep(0.1)
    seen.discard(0)
    seen.discard(os.getpgid(0))
    for pgrp in seen:
        try:
            os.killpg(pgrp, 19)  # SIGSTOP: every live member, whatever its pid
        except OSError:
            pass
    time.sleep(0.2)
    live = [row for row in proc_table() if row[2] not in ("Z", "X") and (row[1] in names or row[3] in seen)]
    return live, seen


def end_hoppers(names: set[str], groups: set[int]) -> None:
    """Kill what the test's candidate left, by process group (a hopper keeps its group, not its pid)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        groups |= {pgrp for _, comm, state, pgrp in proc_table() if comm in names}
        groups -= {0, os.getpgid(0)}
        for pgrp in groups:
            try:
                os.killpg(pgrp, 9)
            except OSError:
                pass
        time.sleep(0.2)
        if not [r for r in proc_table() if r[2] not in ("Z", "X") and (r[1] in names or r[3] in groups)]:
            return


def eval_config(tmp: Path, evaluation: dict | None = None, cache: BaselineCache | None = None) -> Path:
    """A `kgen eval` config, its database holding the baselines `cache` kept from earlier runs."""
    path = write_config(tmp, ["pass"], size="small", evaluation=evaluation)
    if cache:
        cache.seed(tmp / "kgen.db")
    return path


class BaselineCache:
    """mse's baselines as the first `kgen eval` of this module timed and stored them, put in each later
    run's database before it starts: as a second `kgen eval` on one machine finds in its database the
    baselines the first stored (bench.measure_baselines), so the reference process times them once
    for the module, not in every run (about 5 s each on the 2-core box). What each test looks at
    (its candidate's build and evaluation, the room, the verdict and figures) is judged afresh."""

    COLUMNS = ("key", "task", "size", "device", "torch_version", "result_json")

    def __init__(self) -> None:
        self.rows: dict[str, tuple] = {}

    def seed(self, db: Path) -> None:
        if not self.rows:
            return
        store = Store.open(db)
        try:
            for row in self.rows.values():
                store.save_baseline(*row)
        finally:
            store.close()

    def keep(self, db: Path) -> None:
        if not db.exists():
            return
        import sqlite3

        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = con.execute(f"SELECT {', '.join(self.COLUMNS)} FROM baselines").fetchall()
        except sqlite3.Error:
            rows = []
        finally:
            con.close()
        self.rows.update((row[0], tuple(row)) for row in rows)


@pytest.fixture(scope="module")
def baseline_cache() -> BaselineCache:
    return BaselineCache()


def test_no_process_of_the_attempt_outlives_kgen_eval(tmp_path, subreaper, baseline_cache):
    """pid_hopper.py forks, at import, a helper that leaves its group and hops pids every 3 ms, from
    the build child (comm kb+TAG) and from the evaluation child (ke+TAG). After `kgen eval` returns
    (and a moment for the kernel to finish its kills), neither is alive: not in /proc, not in `ps`.
    The test is the subreaper of what it starts, so nothing the attempt orphans is left to the host's pid 1."""
    tag = uuid.uuid4().hex[:12]
    names = {f"kb{tag}", f"ke{tag}"}
    code = tagged("pid_hopper.py", tag, tmp_path)
    config = eval_config(tmp_path, cache=baseline_cache)
    groups: set[int] = set()
    try:
        proc = kgen("eval", str(code), "--task", "mse", "--backend", "cpu", "-c", str(config), cwd=tmp_path)
        time.sleep(1.0)  # SIGKILL sent is not yet dead: a moment, no more
        baseline_cache.keep(tmp_path / "kgen.db")
        attempts = stored(tmp_path / "kgen.db") if (tmp_path / "kgen.db").exists() else []
        # The helpers' own groups, as their notes gave them: only where to look (frozen_survivors).
        for text in [a["build_log"] for a in attempts] + [a["result"].output for a in attempts]:
            groups |= {int(n[2]) for n in notes(text) if n[0] == "hopper" and len(n) > 2 and n[2].isdigit()}
        left, groups = frozen_survivors(names, groups)
        ps = subprocess.run(["ps", "-eo", "pid,user,pgid,stat,comm"], capture_output=True, text=True).stdout
        in_ps = [line for line in ps.splitlines()
                 if any(n in line.split() for n in names) and line.split()[3][0] not in "ZX"]
    finally:
        end_hoppers(names, groups)
    # (Its exit status is not looked at: a hopper loads the cpu, and an unfit timing may exit non-zero.)
    assert len(attempts) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    [attempt] = attempts
    result = attempt["result"]
    assert result.verdict is Verdict.correct, describe(result)
    # A helper was started in the build child and in the evaluation child (each one's note in its log).
    assert any(n[:2] == ["hopper", "b"] for n in notes(attempt["build_log"])), attempt["build_log"][-2000:]
    assert any(n[:2] == ["hopper", "e"] for n in notes(result.output)), describe(result)
    assert left == [], f"alive after kgen eval returned (pid, comm, state, pgrp): {left}"
    assert in_ps == [], in_ps


# ---- 3. channels the jail leaves open ------------------------------------------------------------

CHANNELS = {
    # channel: what closed means, checked on the notes of both children of two attempts (and outside)
    "unix": "connect() to a host's pathname socket refused; the test's listeners received nothing",
    "shm": "no segment an earlier attempt or child made is found; none left in `ipcs -m`",
    "msg": "no queue an earlier attempt or child made is found; none left in `ipcs -q`",
    "sem": "no semaphore set an earlier attempt or child made is found; none left in `ipcs -s`",
    "keyring": "add_key refused (seccomp): nothing the next attempt of the same uid could read",
    "userns_unshare": "unshare(CLONE_NEWUSER) refused",
    "userns_clone": "clone(CLONE_NEWUSER) refused",
    "io_uring": "io_uring_setup refused",
    "fsize": "a byte at 3 GiB refused (RLIMIT_FSIZE)",
    "nproc": "the 10,000th process refused (a pids limit)",
}
SYSV = {"shm": ("m", 0), "msg": ("q", 1), "sem": ("s", 2)}


class Listener:
    """A pathname Unix socket anyone may connect to, recording what arrives."""

    def __init__(self, path: Path) -> None:
        self.path, self.received, self.connections = path, [], 0
        path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        os.chmod(path, 0o777)
        self.sock.listen(16)
        self.sock.settimeout(0.2)
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
            conn.settimeout(1)
            try:
                self.received.append(conn.recv(4096))
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def channel_runs(tmp_path_factory, baseline_cache):
    """channels.py judged twice by `kgen eval` (two attempts, each built afresh: the second's file
    differs by a comment), with the test's listeners under /run and under the project folder.
    Returns the notes of each run's build and evaluation, what the listeners got, and which of the
    candidate's System V keys `ipcs` listed after each run."""
    tmp = tmp_path_factory.mktemp("channels")
    tag = uuid.uuid4().hex[:12]
    key = int("".join(c for c in tag if c in "0123456789abcdef")[:7], 16) | 0x20000000
    places = [Path("/run") / f"kgen-test-{tag}.sock"] if os.access("/run", os.W_OK) else []
    (ROOT / "db").mkdir(exist_ok=True)
    places.append(ROOT / "db" / f"kgen-test-{tag}.sock")
    listeners = [Listener(p) for p in places]
    config = eval_config(tmp, {"step_floor_s": 60.0}, baseline_cache)
    runs = []
    try:
        for n in (1, 2):
            folder = tmp / f"run{n}"
            folder.mkdir()
            code = tagged("channels.py", tag, folder, __KGEN_SOCKETS__=":".join(map(str, places)))
            code.write_text(code.read_text() + f"# attempt {n}\n")
            proc = kgen("eval", str(code), "--task", "mse", "--backend", "cpu", "-c", str(config), cwd=folder)
            leftover = {kind: {key + off} & ipcs_keys()[kind] for kind, off in SYSV.values()}
            baseline_cache.keep(tmp / "kgen.db")
            attempt = [a for a in stored(tmp / "kgen.db") if a["run_id"] not in {r["run_id"] for r in runs}]
            assert len(attempt) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
            runs.append({"run_id": attempt[0]["run_id"], "result": attempt[0]["result"], "left": leftover,
                         "notes": [n[1:] for text in (attempt[0]["build_log"], attempt[0]["result"].output)
                                   for n in notes(text) if n[0] == "chan"]})
    finally:
        for listener in listeners:
            listener.close()
        for kind, off in SYSV.values():
            ipcrm(kind, key + off)
    return {"runs": runs, "received": [x for lst in listeners for x in lst.received],
            "connections": sum(lst.connections for lst in listeners), "key": key, "places": places}


@pytest.mark.parametrize("channel", list(CHANNELS), ids=list(CHANNELS))
def test_channel_is_closed(channel_runs, channel):
    """channels.py probes each channel from its build child (at import) and its evaluation child (in
    its first forward), in two attempts one after the other; `channel` must be closed in all four."""
    runs = channel_runs["runs"]
    seen = [(i, n[1], n[2], " ".join(n[3:])) for i, run in enumerate(runs, 1) for n in run["notes"] if n[0] == channel]
    print(f"\n{channel}: {seen}")
    for run in runs:
        assert run["result"].verdict is Verdict.correct, describe(run["result"])
    # The probe ran in both children of both attempts (else nothing was tested).
    assert {(i, role) for i, role, _, _ in seen} == {(1, "b"), (1, "e"), (2, "b"), (2, "e")}, seen
    if channel in SYSV:
        kind, off = SYSV[channel]
        assert [s for s in seen if s[2] == "found"] == [], f"{channel}: found what another child left: {seen}"
        left = [run["left"][kind] for run in runs]
        assert left == [set(), set()], f"{channel}: key {channel_runs['key'] + off:#x} left in ipcs after a run"
        return
    open_ = [s for s in seen if s[2] != "denied"]
    assert open_ == [], f"{channel} open ({CHANNELS[channel]} is required): {open_}"
    if channel == "unix":
        assert channel_runs["connections"] == 0 and channel_runs["received"] == [], \
            (channel_runs["connections"], channel_runs["received"], channel_runs["places"])


# ---- 4. load launders a forged clock ------------------------------------------------------------

SPEEDUP_FIELDS = ("speedup_eager", "speedup_compile")


@pytest.mark.parametrize("twin", [False, True], ids=["forged", "honest_twin"])
def test_a_self_loaded_forger_gains_nothing_and_unfit_timing_carries_no_figure(tmp_path, twin, baseline_cache):
    """load_launder.py forges its clock to a tenth and loads its own cores with two spinners; its twin
    only loads. For each: the spinners ran; where the load made the timing unfit (pipeline.verdicts)
    there is no figure: the stored result's x eager and x compile (and the pairwise ratios behind
    them) are None, `kgen eval --json` prints none, and `kgen eval` exits non-zero; where it was
    timed through the load, the figure is the parent's and the forger gains nothing. The forger's
    note says how many clocks it found to rebind: none, since the child keeps no clock of its own."""
    tag, name = uuid.uuid4().hex[:12], "load_launder.py"
    code = tagged(name, tag, tmp_path, **(TWIN[name] if twin else {}))
    # One re-judging (the default is two): it meets the candidate's own load again, and one shows that.
    config = eval_config(tmp_path, {"load_retries": 1}, baseline_cache)
    proc = kgen("eval", str(code), "--task", "mse", "--backend", "cpu", "-c", str(config), "--json", cwd=tmp_path)
    baseline_cache.keep(tmp_path / "kgen.db")
    [attempt] = stored(tmp_path / "kgen.db")
    result = attempt["result"]
    said = notes(result.output)
    print(f"\n{name}: rc={proc.returncode} {describe(result)}")
    assert ["spinners", "2"] in said, describe(result)
    if not twin:
        assert ["forged", "0", "factor", "0.1"] in said, describe(result)  # it looked: nothing in the child to forge
        if result.verdict.value == "impossible_timing":  # a judgement its load missed refused the forgery itself
            assert proc.returncode != 0, f"kgen eval exited 0 for a refused forgery: {proc.stdout[-1500:]}"
            return
    if not result.device_unfit:  # timed through the load: the parent's figure, its claims unread
        assert result.verdict is Verdict.correct and result.speedup_eager < UNEARNED_X, describe(result)
        return
    assert result.device_unfit.startswith("the cpu was loaded"), describe(result)
    printed = json.loads(proc.stdout[proc.stdout.index("{"):])
    figures = {"stored": {f: getattr(result, f) for f in SPEEDUP_FIELDS},
               "ratios": {"eager_ratio": result.eager_ratio, "compiled_ratio": result.compiled_ratio},
               "row": {f: attempt[f] for f in SPEEDUP_FIELDS},
               "printed": {f: printed.get(f) for f in SPEEDUP_FIELDS}}
    assert all(v is None for part in figures.values() for v in part.values()), \
        f"an unfit timing carries a figure: {figures}"
    assert proc.returncode != 0, f"kgen eval exited 0 for an unfit timing: {proc.stdout[-1500:]}"
