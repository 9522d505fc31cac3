"""Two `kgen run` on one database: the second is refused with one line naming the first (its pid and
run), before it opens the database; the lock goes with the process that held it, however it ends.

Real parts: the holder is a process of its own holding the real flock (pipeline.store.runlock), the
refused run is `python -m pipeline.cli run --demo` in a subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.store.runlock import RunLock, lock_path

ROOT = Path(__file__).resolve().parent.parent

HOLD = """import sys, time
from pathlib import Path
from pipeline.store.runlock import RunLock
lock = RunLock(Path(sys.argv[1]))
lock.acquire()
lock.note("01TESTRUN")
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_run_on_one_database_is_refused_naming_the_first(tmp_path):
    db = tmp_path / "db" / "kgen.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline() == "held\n"
        second = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "--demo", "--db", str(db)], cwd=tmp_path,
                                capture_output=True, text=True, timeout=120, env=env)
        assert second.returncode == 1 and second.stdout == ""
        assert second.stderr == (f"Error: another `kgen run` (pid {holder.pid}, run 01TESTRUN) is running on {db}: a "
                                 "second would do its work again; wait for it to end, or pass --force to run beside "
                                 "it\n")
        assert not db.exists()  # refused before it opened (or made) the database
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up of its own: the kernel drops the lock
        holder.wait()
    assert lock_path(db).exists()
    started = time.monotonic()
    with RunLock(db):  # free again at once, the stale file notwithstanding
        assert time.monotonic() - started < 1
