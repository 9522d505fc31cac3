"""Probe (thirtieth session, cpu): honest and forged mse (forged_time_blocks at 0.5 and 0.6) judged at a size, N times each; verdict, claim, estimate, claim/estimate. Optional BOUND_MS,MAX_CALLS,ABS_SLACK patches the constants in-process."""
import sys, tempfile
from pathlib import Path
ROOT = Path("/work/main"); sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.child import tasks
import test_redteam as R

def judge(bench, text):
    d = Path(tempfile.mkdtemp()); (d / "build").mkdir()
    p = d / "cand.py"; p.write_text(text)
    return evaluate.evaluate(bench, p, d / "build", R.SETTINGS)

runs, size = int(sys.argv[1]), sys.argv[2]
if len(sys.argv) > 3:  # BOUND_MS,MAX_CALLS,ABS_SLACK
    from pipeline.judge import judge as J
    ms, most, slack = sys.argv[3].split(",")
    evaluate.CPU_BOUND_MS, evaluate.CPU_BOUND_MAX_CALLS = float(ms), int(most)
    J.BOUND_SLACK["cpu"] = (J.BOUND_SLACK["cpu"][0], float(slack))
    print("PATCHED", ms, most, slack, flush=True)
task = tasks.discover(R.TASKS, ["mse"])[0]
bench = prepare(task, size, "cpu", R.SETTINGS)
forged = (R.REDTEAM / "forged_time_blocks.py").read_text()
honest = task.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n"
try:
    for label, text in [("honest", honest)] + [(f"forged-{f}", forged.replace("FACTOR = 0.1\n", f"FACTOR = {f}\n")) for f in ("0.5", "0.6")]:
        for _ in range(runs):
            r = judge(bench, text)
            ce = r.time_ms / r.wall_ms_per_call if r.time_ms and r.wall_ms_per_call else float("nan")
            print(f"JUDGE {size} {label:10} {r.verdict.value:18} claim {r.time_ms} est {r.wall_ms_per_call} "
                  f"claim/est {ce:.2f} unfit {r.device_unfit} x_eager {r.speedup_eager}", flush=True)
finally:
    bench.close()
