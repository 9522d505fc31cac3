"""Probe (twenty-ninth session): claims against the parent's clock in the same Bound windows. Needs
2026-11-29f-same-window.patch applied (git apply); prints one row per judgement (see the log)."""
import re, statistics, sys, tempfile
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]; sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.child import tasks
import test_redteam as R

def judge(bench, text):
    d = Path(tempfile.mkdtemp()); (d / "build").mkdir()
    p = d / "cand.py"; p.write_text(text)
    return evaluate.evaluate(bench, p, d / "build", R.SETTINGS)

def show(label, r):
    m = re.search(r" r=([0-9.,]+)", r.bound_note or "")
    rs = [float(x) for x in m.group(1).split(",")] if m else []
    med = statistics.median(rs) if rs else float("nan")
    tb = re.search(r"tb=([0-9.]+)", r.bound_note or ""); tb = tb.group(1) if tb else "-"
    claim = r.time_ms; est = r.wall_ms_per_call
    ce = f"{claim/est:.2f}" if claim and est else "-"
    print(f"{label:34} {r.verdict.value[:10]:10} claim/est {ce:5} r med {med:.2f} [{min(rs or [0]):.2f}-{max(rs or [0]):.2f}] n{len(rs)} tb {tb} t={claim}", flush=True)

runs = int(sys.argv[1]); sizes = sys.argv[2].split(","); names = sys.argv[3].split(",")
forged = (R.REDTEAM / "forged_time_blocks.py").read_text()
for size in sizes:
    for name in names:
        task = tasks.discover(R.TASKS, [name])[0]
        bench = prepare(task, size, "cpu", R.SETTINGS)
        try:
            honest = task.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n"
            for _ in range(runs):
                show(f"honest {name} {size}", judge(bench, honest))
            if name == "mse":
                for f in ("0.5", "0.6", "0.85"):
                    for _ in range(runs):
                        show(f"forged-{f} {name} {size}", judge(bench, forged.replace("FACTOR = 0.1\n", f"FACTOR = {f}\n")))
                fast = (R.REDTEAM / "honest_fast_mse.py").read_text()
                for _ in range(runs):
                    show(f"honest_fast_mse {size}", judge(bench, fast))
        finally:
            bench.close()
