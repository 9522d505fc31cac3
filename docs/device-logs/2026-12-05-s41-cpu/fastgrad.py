"""Probe: tests/redteam/grad_honest_fast_mse.py (an honest fused mse forward and backward) judged N
times on mse "small" in gradient mode with test_grad's settings: each evaluation's (and look's) inside
median with and without INSIDE_ABS_MS, and the verdict. Usage: python fastgrad.py N"""
import hashlib, os, statistics, sys, tempfile
from pathlib import Path
ROOT = Path(os.environ.get("TREE", ".")).resolve()
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import test_grad as G
from pipeline.build import build
from pipeline.child import tasks
from pipeline.judge import evaluate, session as S
from pipeline.judge.bench import prepare
orig = S.Session.cpu_clock
def cpu_clock(self):
    r = orig(self)
    ev = self.evidence
    print(f"  look prior={len(self.prior)} med {statistics.median(ev.inside):.2f} bare {statistics.median(ev.bare):.2f} "
          f"[{min(ev.inside):.2f}-{max(ev.inside):.2f}] calls {len(self.bound_claims[0])} share {ev.load_share:.3f} -> {r and r[0].value}", flush=True)
    return r
S.Session.cpu_clock = cpu_clock
work = Path(tempfile.mkdtemp(dir=os.environ.get("WORK", "/tmp")))
code = ROOT / "tests" / "redteam" / "grad_honest_fast_mse.py"
built = build.build(code, hashlib.sha256(code.read_bytes()).hexdigest()[:16], work / "builds", build.BuildOptions(timeout_s=600))
assert built.ok, built.log[-2000:]
bench = prepare(tasks.discover(ROOT / "reference_tasks", ["mse"])[0], "small", "cpu", G.GRAD)
print("eager", bench.baselines.eager.median_ms, flush=True)
try:
    for i in range(int(sys.argv[1])):
        r = evaluate.evaluate(bench, code, Path(built.build_dir), G.GRAD)
        print(i, r.verdict.value, "x eager", r.speedup_eager and round(r.speedup_eager, 2), "trusted", r.trusted, flush=True)
finally:
    bench.close()
