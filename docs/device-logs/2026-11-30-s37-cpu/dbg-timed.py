import sys, runpy
sys.argv = ["cpu_judge_probe.py", sys.argv[1], "--task", "big_add", "--size", __import__("os").environ.get("SIZE", "small"), "--runs", sys.argv[2]] + sys.argv[3:]
sys.path.insert(0, ".")
from pipeline.judge import clocks
orig = clocks.check_timed
def ct(ratios):
    r = orig(ratios); print("TIMED", [round(x, 2) for x in ratios], "->", r and r[0], flush=True); return r
clocks.check_timed = ct
origr = clocks.timed_ratios
def tr(blocks, cal, threads=1):
    print("CAL", [round(clocks.unloaded_ms(w, threads), 3) for w in cal], "BLOCKS", [(round(sum(c), 3), round(w.ms, 3), round(clocks.unloaded_ms(w, threads), 3), round(w.load.cpu_ms, 3) if w.load else None) for c, w in blocks], flush=True)
    return origr(blocks, cal, threads)
clocks.timed_ratios = tr
orige = clocks.check_estimate
def ce(kind, median, est, null=None):
    r = orige(kind, median, est, null); print("CHECK", kind, round(median, 4), est and round(est, 4), "->", r and r[0], flush=True); return r
clocks.check_estimate = ce
runpy.run_path("bench/cpu_judge_probe.py", run_name="__main__")
