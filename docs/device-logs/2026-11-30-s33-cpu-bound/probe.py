"""Instrumented probe: honest / forged mse at a size; prints verdict, claim/est and the windows."""
import sys, tempfile, statistics, os
from pathlib import Path
ROOT = Path(os.environ.get("ROOT", "/tmp/cpuwork")); sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from pipeline.judge import evaluate, judge as J, session as S
from pipeline.judge.bench import prepare
from pipeline.child import tasks
import test_redteam as R

SESS = []
_orig = S.Session.timing
def timing(self):
    SESS.append(self)
    return _orig(self)
S.Session.timing = timing

BUILT = {}
def judge_built(bench, name):
    import hashlib
    code = R.REDTEAM / name
    if name not in BUILT:
        d = Path(tempfile.mkdtemp())
        b = R.build.build(code, hashlib.sha256(code.read_bytes()).hexdigest()[:16], d / "builds", R.build.BuildOptions(timeout_s=600))
        assert b.ok, b.log[-2000:]
        BUILT[name] = Path(b.build_dir)
    return evaluate.evaluate(bench, code, BUILT[name], R.SETTINGS)
def judge_it(bench, text):
    if text.startswith("BUILT:"):
        return judge_built(bench, text[6:])
    d = Path(tempfile.mkdtemp()); (d / "build").mkdir()
    p = d / "cand.py"; p.write_text(text)
    return evaluate.evaluate(bench, p, d / "build", R.SETTINGS)

def f(x): return f"{x:.3f}"
import json
DUMP = open(os.environ.get("DUMP", "/dev/null"), "a")
def w2d(w): return {"ms": w.ms, "calls": w.calls, "wait": w.load.wait_ms if w.load else 0, "cpu": w.load.cpu_ms if w.load else 0}
def dump(label, size, r, sessions):
    for i, s in enumerate(sessions):
        DUMP.write(json.dumps({"label": label, "size": size, "eval": i, "verdict": r.verdict.value, "claim": r.time_ms, "est": r.wall_ms_per_call,
            "timed": [[c, w2d(w)] for c, w in s.timed], "bound": [w2d(w) for w in s.bound_windows],
            "cal": [w2d(w) for w in s.calibration], "eager": s.eager, "load": os.getloadavg()[0]}) + "\n")
    DUMP.flush()
def show(s):
    th = 1
    tb = [(statistics.fmean(c), w.ms, w.calls, J.unloaded_ms(w), w.load.cpu_ms if w.load else 0) for c, w in s.timed]
    print("   timed  mean/win/calls/unl/cpu:", "; ".join(f"{m:.3f}/{a:.2f}/{n}/{u:.2f}/{c:.2f}" for m, a, n, u, c in tb))
    print("   bound  win/calls/unl:", "; ".join(f"{w.ms:.2f}/{w.calls}/{J.unloaded_ms(w):.2f}" for w in s.bound_windows))
    cal = sorted(J.unloaded_ms(w) for w in s.calibration)
    print("   calib  unl sorted:", " ".join(f"{x:.2f}" for x in cal), "calls", s.calibration[0].calls if s.calibration else None)
    if not hasattr(s, "timed_calibration"): s.timed_calibration = []
    tc = sorted(J.unloaded_ms(w)/w.calls for w in s.timed_calibration)
    print("   tcal per call unl sorted:", " ".join(f"{x:.2f}" for x in tc), "calls", [w.calls for w in s.timed_calibration])
    wp = J.window_per_call(s.calibration, s.timed_calibration, s.timed) if s.timed_calibration else []
    if wp:
        print("   window claimed/parent per block:", "; ".join(f"{a:.3f}/{b:.3f}" for a, b in wp),
              f"WINRATIO {sum(a for a,_ in wp)/max(1e-9,sum(b for _,b in wp)):.2f} WINRATIO_NO1 {sum(a for a,_ in wp[1:])/max(1e-9,sum(b for _,b in wp[1:])):.2f}")
    pc = J.net_per_call(s.calibration, s.bound_windows, "cpu", th)
    print("   net per call:", " ".join(f"{x:.4f}" for x in pc), " eager med", f(statistics.median(s.eager)) if s.eager else None)

runs, size = int(sys.argv[1]), sys.argv[2]
if os.environ.get("BOUND_MS"):
    evaluate.CPU_BOUND_MS = float(os.environ["BOUND_MS"])
if os.environ.get("REL"):
    J.BOUND_SLACK["cpu"] = (float(os.environ["REL"]), J.BOUND_SLACK["cpu"][1])
print("PATCH", evaluate.CPU_BOUND_MS, J.BOUND_SLACK["cpu"], flush=True)
labels = sys.argv[3].split(",") if len(sys.argv) > 3 else ["honest", "forged-0.6"]
task = tasks.discover(R.TASKS, ["mse"])[0]
bench = prepare(task, size, "cpu", R.SETTINGS)
print("eager baseline", bench.baselines.eager.median_ms, "bound calls", evaluate.cpu_bound_calls(bench.baselines.eager.median_ms, bench.baselines.input_bytes, bench.output_bytes), flush=True)
forged = (R.REDTEAM / "forged_time_blocks.py").read_text()
honest = task.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n"
CFGS = [float(x) for x in os.environ.get("CFGS", str(evaluate.CPU_BOUND_MS)).split(",")]
try:
  for _ in range(runs):
    for cfg in CFGS:
      evaluate.CPU_BOUND_MS = cfg
      for label in labels:
            text = honest if label == "honest" else ("BUILT:" + label[5:]) if label.startswith("file:") else forged.replace("FACTOR = 0.1\n", f"FACTOR = {label.split('-')[1]}\n")
            n0 = len(SESS)
            r = judge_it(bench, text)
            ce = r.time_ms / r.wall_ms_per_call if r.time_ms and r.wall_ms_per_call else float("nan")
            if len(SESS) == n0:
                print("NOSESSION", r.verdict.value, (r.error or "")[:300], flush=True); continue
            ev = SESS[n0].evidence
            r1 = (statistics.median(ev.means) / min(ev.per_call)) if ev and ev.per_call and min(ev.per_call) > 0 else float("nan")
            print(f"JUDGE {size} cfg {cfg} {label:10} {r.verdict.value:18} first_r {r1:.2f} claim {r.time_ms:.4f} est {r.wall_ms_per_call or 0:.4f} "
                  f"claim/est {ce:.2f} evals {len(SESS)-n0} unfit {bool(r.device_unfit)} x_eager {r.speedup_eager} load {os.getloadavg()[0]:.2f}", flush=True)
            dump(f"{label}@{cfg}", size, r, SESS[n0:])
            if os.environ.get("SHOW"):
                for s in SESS[n0:]:
                    show(s)
finally:
    bench.close()
