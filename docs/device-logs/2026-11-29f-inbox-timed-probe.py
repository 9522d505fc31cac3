"""Probe (twenty-ninth session): honest mse and forged clocks, with the timed blocks' window ratios where
the tree has them (2026-11-29f-inbox-timed.patch). ROOT=<a tree> judges with that tree; see the log."""
import re, statistics, sys, tempfile
from pathlib import Path
import os; ROOT = Path(os.environ.get("ROOT", Path(__file__).resolve().parents[2])); sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.child import tasks
import test_redteam as R

def judge(bench, text, settings):
    d = Path(tempfile.mkdtemp()); (d / "build").mkdir()
    p = d / "cand.py"; p.write_text(text)
    return evaluate.evaluate(bench, p, d / "build", settings)

def show(label, r):
    m = re.search(r"windows: ([0-9.,inf ]+)", r.bound_note or "")
    rs = [float(x) for x in m.group(1).split(",")] if m else []
    med = statistics.median(rs) if rs else float("nan")
    claim = r.time_ms; est = r.wall_ms_per_call
    ce = f"{claim/est:.2f}" if claim and est else "-"
    print(f"{label:30} {r.verdict.value[:10]:10}{'*' if r.first_refusal else ' '} claim/est {ce:5} r {med:.2f} [{min(rs or [0]):.2f}-{max(rs or [0]):.2f}] n{len(rs)} t={claim and round(claim, 4)} x{r.speedup_eager and round(r.speedup_eager, 2)} {'' if r.verdict.value == 'correct' else (r.error or '')[:90]}", flush=True)

runs = int(sys.argv[1]); sizes = sys.argv[2].split(","); names = sys.argv[3].split(","); cheats = sys.argv[4].split(",") if len(sys.argv) > 4 else []
settings = R.SETTINGS
forged = (R.REDTEAM / "forged_time_blocks.py").read_text()
for size in sizes:
    for name in names:
        task = tasks.discover(R.TASKS, [name])[0]
        bench = prepare(task, size, "cpu", settings)
        try:
            honest = task.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n"
            for _ in range(runs):
                show(f"honest {name} {size}", judge(bench, honest, settings))
            if name == "mse":
                for f in cheats:
                    text = forged.replace("FACTOR = 0.1\n", f"FACTOR = {f}\n") if f[0].isdigit() else (R.REDTEAM / f).read_text()
                    for _ in range(runs):
                        show(f"{f} {size}", judge(bench, text, settings))
        finally:
            bench.close()
