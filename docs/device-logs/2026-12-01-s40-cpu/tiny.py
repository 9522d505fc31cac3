"""Run test_run's too-big scenario N times; print each tiny attempt's verdict and error."""
import sys, tempfile, pathlib, time
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
import test_run as t
from pipeline.store.store import Store
n = int(sys.argv[1])
for i in range(n):
    d = pathlib.Path(tempfile.mkdtemp(prefix="tiny", dir="/tmp/s40"))
    t0 = time.time()
    try:
        t.test_a_task_too_big_for_the_machine_fails_in_one_line_after_the_others_are_stored(d)
        ok = "pass"
    except AssertionError as e:
        ok = "FAIL"
    store = Store.open(d / "db" / "kgen.db")
    for a in store.attempts():
        if a["task"] == "tiny":
            print(i, ok, a["verdict"], (a.get("error") or "")[:400], flush=True)
    print(i, "took", round(time.time() - t0), flush=True)
