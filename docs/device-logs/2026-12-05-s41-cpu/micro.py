"""Probe: the cpu's clock check at microseconds a call. An honest `a + b` and the red team's clock
forged to FACTOR (tests/forgers.forged_clock) on a tiny two-input task of SHAPE, judged N times each,
in turn; per evaluation the median ratio of claims over the parent's window less the null's, with the
INSIDE_ABS_MS slack (med) and without it (r0), and the verdict. Usage: SHAPE="64, 64" FACTOR=0.5 micro.py N"""
import os, pathlib, statistics, sys, tempfile
ROOT = pathlib.Path(os.environ.get("TREE", "/work/main"))
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import test_run as T
from forgers import forged_clock
from pipeline.config import load_config
from pipeline.judge import session as S, clocks, evaluate
from pipeline.judge.bench import prepare
from pipeline.child import tasks
seen = {}
orig = S.Session.cpu_clock
def cpu_clock(self):
    r = orig(self)
    th = self.settings.cpu_threads
    base = clocks.outside_ms(self.calibration, self.calibration_claims, th)
    r0 = [sum(cl) / (clocks.unloaded_ms(w, th) - base) for cl, w in zip(self.bound_claims, self.bound_windows)]
    seen.update(med=statistics.median(self.evidence.inside), r0=statistics.median(r0), calls=len(self.bound_claims[0]),
                per=statistics.median(sum(cl) / len(cl) for cl in self.bound_claims) * 1e3)
    return r
S.Session.cpu_clock = cpu_clock
work = pathlib.Path(tempfile.mkdtemp(prefix="micro", dir=os.environ.get("WORK", "/tmp")))
folder = work / "tasks"; folder.mkdir()
shape = os.environ.get("SHAPE", "64, 64")
(folder / "tiny.py").write_text(T.SQUARED.format(shape=shape).replace("return ((a - b) ** 2).mean()", "return a + b"))
cfg = load_config(T._squared_config(work, folder, ("tiny",)))
add = "def forward(self, a, b):\n        return a + b"
codes = {"honest": "import torch\nclass ModelNew(torch.nn.Module):\n    " + add + "\n",
         "forged": forged_clock(float(os.environ.get("FACTOR", "0.5")), add)}
if os.environ.get("LEAN"):  # the forger without its own bookkeeping (a list and a median every 8 calls)
    lean = codes["forged"].replace("        _REAL.append(ms)\n", "").replace(
        "        if len(_REAL) % 8 == 0:\n", "").replace(
        '            print(f"KGEN-NOTE real_ms {statistics.median(_REAL):.6f} n {len(_REAL)}", flush=True)\n', "")
    assert "_REAL.append" not in lean and "median(_REAL)" not in lean
    codes["forged"] = lean
paths = {}
for name, text in codes.items():
    paths[name] = work / f"{name}.py"
    paths[name].write_text(text)
build_dir = work / "build"; build_dir.mkdir()
bench = prepare(tasks.discover(folder, ["tiny"])[0], "default", "cpu", cfg.evaluation)
print(f"shape ({shape}) eager {bench.baselines.eager.median_ms * 1e3:.1f} us", flush=True)
try:
    for i in range(int(sys.argv[1])):
        for name, path in paths.items():
            seen.clear()
            r = evaluate.evaluate(bench, path, build_dir, cfg.evaluation)
            print(f"{i} {name:6s} {r.verdict.value:17s} calls {seen.get('calls')} claim/call {seen.get('per', 0):.1f} us "
                  f"med {seen.get('med', 0):.2f} r0 {seen.get('r0', 0):.2f} x eager {r.speedup_eager and round(r.speedup_eager, 2)} "
                  f"unfit {bool(r.device_unfit)} trusted {r.trusted}", flush=True)
finally:
    bench.close()
