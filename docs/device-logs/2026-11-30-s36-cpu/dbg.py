import sys, runpy
sys.argv = ["cpu_judge_probe.py", sys.argv[1], "--task", "big_add", "--size", __import__("os").environ.get("SIZE", "small"), "--runs", sys.argv[2]] + sys.argv[3:]
sys.path.insert(0, ".")
from pipeline.judge import judge, session
orig = judge.check_estimate
def ce(kind, median, est, null=None):
    r = orig(kind, median, est, null)
    print("CHECK", kind, median, est, null, "->", r and r[0], flush=True)
    return r
judge.check_estimate = ce
origl = judge.loaded
def ld(ev, dev):
    r = origl(ev, dev); print("LOADED", ev.load_share, r is not None, "per_call", [round(x,4) for x in ev.per_call], "means", [round(x,4) for x in ev.means]); return r
judge.loaded = ld
runpy.run_path("bench/cpu_judge_probe.py", run_name="__main__")
