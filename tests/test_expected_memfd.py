"""An attempt's expected values (and the cpu's inbox inputs) never exist where a
child could open them. The reference hands them to the parent as sealed memfds over a Unix socket
(pipeline.judge.reference.sealed_memfd, sandbox.Child.fd_socket); no path names them, and a candidate's
child inherits no descriptor of them. A child that escaped its sandbox once read them from the
kgen-expected-* folder under /tmp and returned them as its answers."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.sandbox.zygote import MODULE as ZYGOTE
from pipeline.child import tasks
from pipeline.config import EvalConfig
from pipeline.records import Verdict

TEST_TASKS = Path(__file__).resolve().parent / "tasks"
SETTINGS = EvalConfig(compile_baseline=False, trials=5, timed_calls=10, timed_ms=0, warmup_calls=2, timeout_s=60)
HONEST_ADD = """
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return a + b
"""
SECRET_NAMES = ("/memfd:kgen-expected", "/memfd:kgen-inputs")
NEEDLE = 64  # bytes of each secret looked for in every file: random doubles, never there by chance


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _candidate_processes() -> list[int]:
    """The processes of this process's candidates, read from /proc: the candidates' zygote (whose
    forks they are) and every process in a room (a pid namespace not ours) below it; not the
    reference process, which makes the memfds and hands them over."""
    parents, rooms, zygotes = {}, set(), set()
    ours = os.readlink("/proc/self/ns/pid")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read()
            namespace = os.readlink(f"/proc/{entry.name}/ns/pid")
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(stat[stat.rindex(")") + 2:].split()[1])
        if namespace != ours:
            rooms.add(pid)
        elif ZYGOTE.encode() in cmdline.split(b"\0") and b"pipeline.judge.reference" not in cmdline:
            zygotes.add(pid)

    def ours_below(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return sorted(pid for pid in rooms | zygotes if ours_below(pid))


def _our_secrets(needles: set[bytes]) -> set[tuple[int, int]]:
    """(device, inode) of every expected-values or inputs memfd this process holds now; the first
    NEEDLE bytes of each go into `needles`, read through a descriptor of our own."""
    held = set()
    for name in os.listdir("/proc/self/fd"):
        if not _link(f"/proc/self/fd/{name}").startswith(SECRET_NAMES):
            continue
        try:
            fd = os.open(f"/proc/self/fd/{name}", os.O_RDONLY)
        except OSError:
            continue  # closed as we looked
        try:
            st = os.fstat(fd)
            if _link(f"/proc/self/fd/{fd}").startswith(SECRET_NAMES):
                held.add((st.st_dev, st.st_ino))
                if st.st_size >= NEEDLE:
                    needles.add(os.pread(fd, NEEDLE, 0))
        finally:
            os.close(fd)
    return held


def _child_holds(pid: int, secrets: set[tuple[int, int]]) -> list[str]:
    """The child's descriptors that name one of `secrets` or any expected-values memfd."""
    bad = []
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return bad  # gone
    for name in names:
        link = _link(f"/proc/{pid}/fd/{name}")
        try:
            st = os.stat(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in secrets or link.startswith(SECRET_NAMES):
            bad.append(f"fd {name} -> {link}")
    return bad


def _walk(root: Path) -> list[Path]:
    """Every path under `root`, folders that vanish meanwhile skipped (os.walk's default)."""
    return [Path(top) / name for top, dirs, files in os.walk(root) for name in dirs + files]


def test_expected_values_are_in_no_file_and_no_childs_descriptor(tmp_path, monkeypatch):
    """A real evaluation (cpu, a task with a 2 MB output, so the inbox path too) watched from this
    process while it runs: whenever a candidate's child is alive, no kgen-expected-* path exists
    under the temp folder, none of the child's descriptors is one of the expected-values or inputs
    memfds this process holds, and no file under the temp folder holds their bytes."""
    private = tmp_path / "tmp"  # the temp folder of this test alone: other evaluations on the box stay out
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    monkeypatch.setenv("TMPDIR", str(private))
    code = tmp_path / "honest_add.py"
    code.write_text(HONEST_ADD)
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    task = tasks.discover(TEST_TASKS, ["big_add"])[0]
    bench = prepare(task, "small", "cpu", SETTINGS)
    # Secrets this process held before (a draw an earlier test's bench keeps for siblings): not this
    # attempt's to close.
    held_before = _our_secrets(set())
    results = []
    try:
        worker = threading.Thread(target=lambda: results.append(evaluate.evaluate(bench, code, build_dir, SETTINGS)))
        worker.start()
        on_disk, leaked, watched, secrets_seen = set(), [], 0, 0
        needles: set[bytes] = set()
        while worker.is_alive():
            secrets = _our_secrets(needles)
            for pid in _candidate_processes():  # every process of a candidate, and the zygote it is forked from
                watched += 1
                secrets_seen += bool(secrets)
                leaked += _child_holds(pid, secrets)
                for path in _walk(private):  # not rglob: a child's folder may go while it is read
                    if path.name.startswith("kgen-expected"):
                        on_disk.add(str(path))
                    try:
                        data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
                    except OSError:
                        continue
                    on_disk |= {f"{path} holds a secret" for n in needles if n in data}
            time.sleep(0.02)
        worker.join()
    finally:
        bench.close()
    print(f"watched {watched} times, {secrets_seen} beside our memfds, {len(needles)} needles")
    assert not on_disk, f"expected values on disk while a child lived: {sorted(on_disk)[:5]}"
    assert watched and secrets_seen, f"never saw a child ({watched}) beside the parent's memfds ({secrets_seen})"
    assert needles, "the memfds' contents were never read: the file scan looked for nothing"
    assert not leaked, f"a candidate's child held the parent's secrets: {leaked[:5]}"
    assert not _our_secrets(set()) - held_before, \
        "the parent kept an attempt's memfds after it ended"
    # An honest add: correct, on a busy box too (a floor refusal would be load moving a verdict).
    assert results and results[0].verdict is Verdict.correct, results and results[0].error
