"""Probe: each evaluation's checked claim against the median of its Bound requests' per-call (c/m) and their fastest (c/e)."""
import sys, runpy, os, statistics
sys.argv = ["cpu_judge_probe.py", sys.argv[1], "--task", os.environ.get("TASK", "big_add"), "--size", os.environ.get("SIZE", "small"), "--runs", sys.argv[2]] + sys.argv[3:]
sys.path.insert(0, ".")
from pipeline.judge import session as S, clocks
orig = S.Session.timing
def timing(self):
    r = orig(self)
    ev = self.evidence
    if ev and ev.per_call:
        claims = [t for c, _ in self.timed for t in c]
        med = statistics.median(claims)
        claim = statistics.median(ev.means) if ev.means else med
        checked = min(claim, med)
        if ev.mixed: checked = min(checked, statistics.median(ev.mixed))
        m = statistics.median(ev.per_call); e = min(ev.per_call)
        print(f"CM prior={len(self.prior)} checked {checked:.4f} med_pc {m:.4f} min_pc {e:.4f} c/m {checked/m:.2f} c/e {checked/e:.2f} share {ev.load_share:.3f} result {r and r[0]}", flush=True)
    return r
S.Session.timing = timing
runpy.run_path("bench/cpu_judge_probe.py", run_name="__main__")
