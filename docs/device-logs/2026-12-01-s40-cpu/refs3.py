"""Each bundled reference as its own candidate on the cpu, N times, with each evaluation's inside median.
    python refs3.py ROOT RUNS [SIZE] [grad]"""
import sys, tempfile, os, statistics
from pathlib import Path
ROOT = Path(sys.argv[1]); sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import test_honest as H
from pipeline.judge import session as S
orig = S.Session.cpu_clock
def cpu_clock(self):
    r = orig(self)
    ev = self.evidence
    print(f"  IN prior={len(self.prior)} inside med {statistics.median(ev.inside):.2f} [{min(ev.inside):.2f}-{max(ev.inside):.2f}] n={len(ev.inside)} share {ev.load_share:.3f} result {r and r[0]}", flush=True)
    return r
S.Session.cpu_clock = cpu_clock
runs = int(sys.argv[2]); size = sys.argv[3] if len(sys.argv) > 3 else "odd"
grad = len(sys.argv) > 4 and sys.argv[4] == "grad"
for name in (os.environ["TASKS"].split(",") if os.environ.get("TASKS") else H.TASKS):
    for i in range(runs):
        r = H.judge_the_reference(name, size, "cpu", Path(tempfile.mkdtemp()), H.SETTINGS.model_copy(update={"grad": grad}))
        print(f"{name} {size} {'grad' if grad else 'fwd'} {i} {r.verdict.value}{'*' if r.first_refusal else ''} time {r.time_ms} "
              f"x_eager {r.speedup_eager} unfit {bool(r.device_unfit)} {(r.error or '')[:120]}", flush=True)
