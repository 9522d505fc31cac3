import sys, runpy, os, statistics
sys.argv = ["cpu_judge_probe.py", sys.argv[1], "--task", os.environ.get("TASK", "big_add"), "--size", os.environ.get("SIZE", "small"), "--runs", sys.argv[2]] + sys.argv[3:]
sys.path.insert(0, ".")
from pipeline.judge import session as S, clocks
orig = S.Session.cpu_clock
def cpu_clock(self):
    r = orig(self)
    th = self.settings.cpu_threads
    cal = [round(clocks.unloaded_ms(w, th), 3) for w in self.calibration]
    base = statistics.median(cal)
    print("CAL", sorted(cal), "base", base, "calls", self.calibration[0].calls, flush=True)
    for c, w in zip(self.bound_claims, self.bound_windows):
        u = clocks.unloaded_ms(w, th)
        print(f"  REQ ms {w.ms:.3f} unl {u:.3f} cpu {w.load.cpu_ms:.3f} wait {w.load.wait_ms:.3f} net {u-base:.3f} sumclaims {sum(c):.3f} n {len(c)} ratio {sum(c)/(u-base) if u>base else 0:.2f}", flush=True)
    return r
S.Session.cpu_clock = cpu_clock
runpy.run_path("bench/cpu_judge_probe.py", run_name="__main__")
