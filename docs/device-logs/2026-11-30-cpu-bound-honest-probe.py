"""Probe (thirtieth session, cpu): each bundled reference as its own candidate, one evaluation (no second), N times at each size: claim over the parent's estimate."""
import sys, tempfile
from pathlib import Path
ROOT = Path("/work/main"); sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.child import tasks
import test_redteam as R
runs = int(sys.argv[1])
for size in sys.argv[2].split(","):
    for name in ["cosine", "cross_entropy", "hinge", "huber", "kl_div", "mse", "triplet"]:
        task = tasks.discover(R.TASKS, [name])[0]
        bench = prepare(task, size, "cpu", R.SETTINGS)
        try:
            for _ in range(runs):
                d = Path(tempfile.mkdtemp()); (d / "build").mkdir(); p = d / "c.py"
                p.write_text(task.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n")
                r = evaluate._judge(bench, p, d / "build", R.SETTINGS, None, None, None)
                r = r[0] if isinstance(r, tuple) else r
                ce = r.time_ms / r.wall_ms_per_call if r.time_ms and r.wall_ms_per_call else float("nan")
                print(f"HON {size} {name:14} {r.verdict.value:18} claim {r.time_ms:.4f} est {r.wall_ms_per_call or 0:.4f} r {ce:.2f} unfit {bool(r.device_unfit)}", flush=True)
        finally:
            bench.close()
