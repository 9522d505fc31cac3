"""Issue 48, the red team's half: a sealed room per attempt. Each hole the issue names, as a candidate
in tests/redteam/ run for real on the cpu backend (`kgen run` on a batch, `kgen eval` in a fresh
process), with what must be true once the room holds, checked from outside where it can be:

1. siblings share answers (sibling_sysv.py beside its honest twin): no sibling is correct and faster
   than eager by reading what another computed, and no System V segment is left after the batch;
2. processes outlive the attempt (pid_hopper.py): after `kgen eval` returns, no process the attempt
   started (from its build or its evaluation) is alive, by /proc and by `ps`;
3. channels the jail leaves open (channels.py): from the build child and the evaluation child, each
   channel is refused (the candidate's note says so, and nothing reached the test's listener, and
   nothing is left in `ipcs`);
4. load launders a forged clock (load_launder.py beside its honest twin): a timing marked unfit
   carries no speedup figure, and `kgen eval` exits non-zero for it.

Every candidate fills in a TAG the test substitutes, so runs do not collide and the test can find
(and remove) what each left behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
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
from pipeline.store.store import Store

ROOT = Path(__file__).resolve().parent.parent
REDTEAM = Path(__file__).resolve().parent / "redteam"
TASKS = ROOT / "reference_tasks"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
EVALUATION = {"trials": 3, "timed_calls": 8, "warmup_calls": 1, "compile_baseline": False,
              "check_shapes": False, "timeout_s": 120}


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


def write_config(tmp: Path, answers: list[str], size: str = "odd", evaluation: dict | None = None) -> Path:
    """A batch of len(answers) samples of mse, each answered in turn by the replay provider."""
    replay = tmp / "replay.jsonl"
    replay.write_text("".join(json.dumps({"task": "mse", "backend": "cpu", "text": f"```python\n{code}\n```\n"}) + "\n"
                              for code in answers))
    cfg = {
        "models": [{"name": "recorded", "provider": "replay", "replay_file": str(replay)}],
        "tasks": {"names": ["mse"], "size": size, "directory": str(TASKS)},
        "prompts_dir": str(ROOT / "prompts"),
        "samples": len(answers),
        "backend": "cpu",
        "database": str(tmp / "kgen.db"),
        "generated_dir": str(tmp / "generated"),
        "build_dir": str(tmp / "builds"),
        "evaluation": {**EVALUATION, **(evaluation or {})},
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def kgen(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def batch_results(db: Path) -> list[EvalResult]:
    store = Store.open(db, reader=True)
    try:
        return [store.attempt(a["id"])["result"] for a in store.attempts()]
    finally:
        store.close()


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
    honest = tagged("sibling_sysv_honest.py", tag, tmp_path).read_text()
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
    # Siblings: one draw for the three (the first computed it; the later ones reused it).
    assert sorted(r.phases.get("shared_draw") for r in results) == [0.0, 1.0, 1.0], shown
    twin = [r for r in results if not any(n[:2] == ["shm", "attached"] or n[:2] == ["shm", "denied"]
                                          for n in notes(r.output))]
    assert len(twin) == 1 and twin[0].verdict is Verdict.correct, shown  # the honest kernel is right
    assert not faster(twin[0]), shown  # and slower than eager: a fast sibling got its speed elsewhere
    # Whichever sibling computed (found nothing) is correct; none is correct and faster than eager.
    assert any(r.verdict is Verdict.correct for r in results if r is not twin[0]), shown
    assert [r for r in results if faster(r)] == [], shown
    assert key not in left, f"a System V segment with key {key:#x} outlived the batch"
