"""A step's limit counts the time the child could run (pipeline.judge.session.Session.ask): what its
main thread waited on a run queue is added, up to the ceiling. An honest child slowed by other
processes on its core is not timed out at the floor, and a candidate that crowds its own core to buy
time gets the ceiling, not the child's whole timeout. (A hang waits on no run queue: the red team's
hang.py still ends at its step's limit, tests/test_redteam.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from pipeline import sandbox
from pipeline.config import EvalConfig
from pipeline.judge import evaluate
from pipeline.records import Verdict

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = EvalConfig(compile_baseline=False, trials=2, timed_calls=4, timed_ms=0, warmup_calls=1, check_shapes=False,
                      profile=False, timeout_s=120, step_floor_s=2.0, step_ceiling_s=10.0)
# 1.5 s of the child's own cpu time at import (the import step gets the floor, 2 s): idle it fits;
# with two processes spinning on its core, each in a session of its own (the scheduler shares a core
# between sessions: spinners of one session took only half of it), about 4.5 s of wall time.
SLOW_IMPORT = '''
import time

import torch

_t = time.process_time()
while time.process_time() - _t < 1.5:
    pass


class ModelNew(torch.nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
'''
_SPIN = "import os, sys\nos.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})\nwhile True: pass\n"


def test_an_honest_import_slowed_by_processes_on_its_core_is_not_a_timeout(mse_bench, tmp_path):
    code = tmp_path / "slow_import.py"
    code.write_text(SLOW_IMPORT)
    (tmp_path / "build").mkdir()
    cores = sandbox.cpu_cores(SETTINGS.cpu_threads)
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN, cores], start_new_session=True) for _ in range(2)]
    try:
        # A ceiling far above the floor: on a box already loaded, the child's share of its core may be
        # a fifth, and the import then takes several times its 1.5 s. What is under test is the import's
        # limit, not the timing: a timing the load made unfit is not taken again.
        patient = SETTINGS.model_copy(update={"step_ceiling_s": 60.0, "load_retries": 0})
        result = evaluate.evaluate(mse_bench, code, tmp_path / "build", patient)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert result.verdict is Verdict.correct, f"{result.verdict.value}: {result.error}"
    # The import took more wall time than its floor: only the waits added to the limit let it finish.
    assert result.phases["import"] > SETTINGS.step_floor_s, result.phases


def test_crowding_its_own_core_buys_the_ceiling_and_no_more(mse_bench, tmp_path):
    (tmp_path / "build").mkdir()
    started = time.monotonic()
    result = evaluate.evaluate(mse_bench, ROOT / "tests" / "redteam" / "crowd_own_core.py", tmp_path / "build", SETTINGS)
    took = time.monotonic() - started
    assert result.verdict is Verdict.timeout, f"{result.verdict.value}: {result.error}"
    waited = float(re.search(r"no reply in ([0-9.]+) s while waiting for building ModelNew", result.error).group(1))
    limit = float(re.search(r"that step, ([0-9.]+) s", result.error).group(1))
    # The first calls' limit (three floors and the warm-up) was moved by the waits, and stopped at the ceiling.
    assert limit < waited <= SETTINGS.step_ceiling_s + 0.05, result.error
    assert took < SETTINGS.timeout_s / 2, f"{took:.1f} s"
