"""Probe: each evaluation's inside ratios (the child's times of each Bound request's calls over the parent's window less the null's)."""
import sys, runpy, os, statistics
sys.argv = ["cpu_judge_probe.py", sys.argv[1], "--task", os.environ.get("TASK", "big_add"), "--size", os.environ.get("SIZE", "small"), "--runs", sys.argv[2]] + sys.argv[3:]
sys.path.insert(0, ".")
from pipeline.judge import session as S
orig = S.Session.cpu_clock
def cpu_clock(self):
    r = orig(self)
    ev = self.evidence
    claims = [t for c in self.bound_claims for t in c]
    print(f"IN prior={len(self.prior)} inside med {statistics.median(ev.inside):.2f} [{min(ev.inside):.2f}-{max(ev.inside):.2f}] claim_med {statistics.median(claims):.4f} "
          f"eager_med {statistics.median(self.eager) if self.eager else 0:.4f} share {ev.load_share:.3f} result {r and r[0]}", flush=True)
    return r
S.Session.cpu_clock = cpu_clock
runpy.run_path("bench/cpu_judge_probe.py", run_name="__main__")
