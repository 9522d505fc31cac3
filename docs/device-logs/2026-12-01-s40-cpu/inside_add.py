"""Probe: the honest pure-torch squared mean at 64x64 (test_run's tiny task), judged N times; each
evaluation's Bound windows, claims, base and ratios."""
import sys, os, statistics, tempfile, pathlib
ROOT = pathlib.Path(os.environ.get("TREE", "/work/main"))
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import test_run as T
from pipeline.config import load_config
from pipeline.judge import session as S, clocks, evaluate
from pipeline.judge.bench import prepare
from pipeline.child import tasks
orig = S.Session.cpu_clock
def cpu_clock(self):
    r = orig(self)
    th = self.settings.cpu_threads
    base = clocks.outside_ms(self.calibration, self.calibration_claims, th)
    cal = [(round(clocks.unloaded_ms(w, th), 3), round(c, 3), w.calls) for w, c in zip(self.calibration, self.calibration_claims)]
    print(f"  prior={len(self.prior)} base={base:.3f} cal(unloaded,claims,calls)={cal}", flush=True)
    for cl, w in zip(self.bound_claims, self.bound_windows):
        u = clocks.unloaded_ms(w, th)
        print(f"    win {w.ms:.3f} unl {u:.3f} wait {w.load.wait_ms if w.load else 0:.3f} cpu {w.load.cpu_ms if w.load else 0:.3f} calls {len(cl)} sum {sum(cl):.3f} ratio {(sum(cl)+0.003*len(cl))/(u-base):.2f} r0 {sum(cl)/(u-base):.2f}", flush=True)
    print(f"  inside med {statistics.median(self.evidence.inside):.2f} result {r and r[0]}", flush=True)
    return r
S.Session.cpu_clock = cpu_clock
evaluate.CPU_BOUND_MAX_CALLS = int(os.environ.get("MAXC", "128"))
work = pathlib.Path(tempfile.mkdtemp(prefix="inside", dir="/tmp/s40"))
folder = work / "tasks"; folder.mkdir()
shape = os.environ.get("SHAPE", "64, 64")
(folder / "tiny.py").write_text(T.SQUARED.format(shape=shape).replace("return ((a - b) ** 2).mean()", "return a + b"))
cfg = load_config(T._squared_config(work, folder, ("tiny",)))
code = work / "new.py"
code.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, a, b):\n        return a + b\n")
build_dir = work / "build"; build_dir.mkdir()
task = tasks.discover(folder, ["tiny"])[0]
bench = prepare(task, "default", "cpu", cfg.evaluation)
print("eager", bench.baselines.eager.median_ms, flush=True)
try:
    for i in range(int(sys.argv[1])):
        r = evaluate.evaluate(bench, code, build_dir, cfg.evaluation)
        print(i, r.verdict.value, r.time_ms, r.eager_ratio and round(r.eager_ratio.median, 2), (r.first_refusal or "")[:60], flush=True)
finally:
    bench.close()
