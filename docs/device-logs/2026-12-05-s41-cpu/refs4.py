"""Each bundled reference as its own candidate on the cpu, N times: verdict, trusted (and why not),
each evaluation's inside median with and without INSIDE_ABS_MS, and the call's time.
    python refs4.py ROOT RUNS [SIZE] [grad]   (the 40th session's refs3.py, with `bare` and `trusted`)"""
import sys, tempfile, os, statistics
from pathlib import Path
ROOT = Path(sys.argv[1]); sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import test_honest as H
from pipeline.judge import session as S
seen = {}
orig = S.Session.cpu_clock
def cpu_clock(self):
    r = orig(self)
    ev = self.evidence
    seen.update(med=statistics.median(ev.inside), bare=statistics.median(ev.bare), prior=len(self.prior))
    return r
S.Session.cpu_clock = cpu_clock
runs = int(sys.argv[2]); size = sys.argv[3] if len(sys.argv) > 3 else "odd"
grad = len(sys.argv) > 4 and sys.argv[4] == "grad"
for name in (os.environ["TASKS"].split(",") if os.environ.get("TASKS") else H.TASKS):
    for i in range(runs):
        seen.clear()
        r = H.judge_the_reference(name, size, "cpu", Path(tempfile.mkdtemp(dir=os.environ.get("WORK", "/tmp"))),
                                  H.SETTINGS.model_copy(update={"grad": grad}))
        print(f"{name} {size} {'grad' if grad else 'fwd'} {i} {r.verdict.value}{'*' if r.first_refusal else ''} "
              f"trusted {r.trusted} time {r.time_ms and round(r.time_ms * 1e3, 1)} us med {seen.get('med', 0):.2f} "
              f"bare {seen.get('bare', 0):.2f} x_eager {r.speedup_eager and round(r.speedup_eager, 2)} unfit {bool(r.device_unfit)} "
              f"{(r.untrusted_reason or '')[:60]} {(r.error or '')[:100]}", flush=True)
