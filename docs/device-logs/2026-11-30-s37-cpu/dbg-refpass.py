import sys, runpy
sys.argv = ["cpu_judge_probe.py", sys.argv[1], "--task", __import__("os").environ.get("TASK", "big_add"), "--size", __import__("os").environ.get("SIZE", "small"), "--runs", sys.argv[2]] + sys.argv[3:]
sys.path.insert(0, ".")
from pipeline.judge import clocks
orige = clocks.check_estimate
def ce(kind, median, est, null=None, scale=1.0):
    r = orige(kind, median, est, null, scale)
    print("CHECK", kind, "claim", round(median, 4), "est", est and round(est, 4), "scale", round(scale, 3), "claim/(est*scale)", est and round(median / (est * scale), 3), "->", r and r[0], flush=True)
    return r
clocks.check_estimate = ce
origr = clocks.reference_ratio
def rr(cal, windows, blocks, threads=1, grad=False):
    r = origr(cal, windows, blocks, threads, grad)
    pc = clocks.net_per_call(cal, windows, "cpu", threads)
    print("REFRATIO", r and round(r, 3), "per_call", [round(x, 4) for x in pc], "calls", [w.calls for w in windows], "blocks", [[round(x, 4) for x in b] for b, _ in blocks], flush=True); return r
clocks.reference_ratio = rr
origl = clocks.loaded
def ld(ev, dev):
    r = origl(ev, dev); print("CAND share", round(ev.load_share, 3), "per_call", [round(x, 4) for x in ev.per_call], "means", [round(x, 4) for x in ev.means], flush=True); return r
clocks.loaded = ld
runpy.run_path("bench/cpu_judge_probe.py", run_name="__main__")
