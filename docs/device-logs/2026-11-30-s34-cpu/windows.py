"""Where the cpu gradient-mode estimate scatters: every calibration and Bound window of an evaluation."""
import sys, hashlib, tempfile
from pathlib import Path
ROOT = Path(sys.argv[1]); sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from pipeline.build import build
from pipeline.judge import evaluate, judge
from pipeline.judge.bench import prepare
from pipeline.child import tasks
import test_redteam as R
name, runs, grad = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "grad"
real = judge.net_per_call
def logged(cal, bounds, device="cuda", threads=1):
    out = real(cal, bounds, device, threads)
    print("  cal", [round(judge.unloaded_ms(w, threads) / w.calls, 3) for w in cal], "calls", cal[0].calls if cal else None)
    print("  bnd", [round(judge.unloaded_ms(w, threads) / w.calls, 3) for w in bounds])
    print("  net", [round(x, 3) for x in out])
    return out
judge.net_per_call = logged
code = R.REDTEAM / name
res = build.build(code, hashlib.sha256(code.read_bytes()).hexdigest()[:16], Path(tempfile.mkdtemp()), build.BuildOptions(timeout_s=600))
settings = R.SETTINGS.model_copy(update={"grad": grad})
bench = prepare(tasks.discover(R.TASKS, ["mse"])[0], "small", "cpu", settings)
for i in range(runs):
    r = evaluate.evaluate(bench, code, Path(res.build_dir), settings)
    print(i, r.verdict.value, "time", r.time_ms, "est", r.wall_ms_per_call, flush=True)
bench.close()
