import sys, runpy, os, statistics
sys.argv = ["cpu_judge_probe.py", sys.argv[1], "--task", os.environ.get("TASK", "big_add"), "--size", os.environ.get("SIZE", "small"), "--runs", sys.argv[2]] + sys.argv[3:]
sys.path.insert(0, ".")
from pipeline.judge import session as S
orig = S.Session.cpu_clock
def cpu_clock(self):
    r = orig(self)
    n = [len(c) for c in self.bound_claims]
    e, at = [], 0
    for k in n:
        e.append(self.eager[at:at + k]); at += k
    print("PAIRS", len(self.eager), sum(n), [(round(statistics.fmean(c), 3), round(statistics.fmean(x), 3) if x else None) for c, x in zip(self.bound_claims, e)], flush=True)
    [print("REQ", k, "claims", [round(x, 3) for x in c], "eager", [round(x, 3) for x in x_]) for k, (c, x_) in enumerate(zip(self.bound_claims, e))]
    return r
S.Session.cpu_clock = cpu_clock
runpy.run_path("bench/cpu_judge_probe.py", run_name="__main__")
