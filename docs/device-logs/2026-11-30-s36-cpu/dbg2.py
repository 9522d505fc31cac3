import sys, runpy, os
sys.argv = ["cpu_judge_probe.py", sys.argv[1], "--task", "big_add", "--size", os.environ.get("SIZE", "small"), "--runs", sys.argv[2]] + sys.argv[3:]
sys.path.insert(0, ".")
from pipeline.judge import judge, evaluate
orig = judge.net_per_call
def npc(cal, bounds, device="cuda", threads=1):
    print("CAL", [f"{w.ms:.3f}/{w.calls}" for w in cal], "BOUNDS", [f"{w.ms:.3f}/{w.calls}" for w in bounds], flush=True)
    return orig(cal, bounds, device, threads)
judge.net_per_call = npc
orig_eval = evaluate.evaluate
def ev(*a, **k):
    r = orig_eval(*a, **k)
    for line in (r.output or "").splitlines():
        if "KGEN-PROBE" in line:
            print(line[:400])
    return r
evaluate.evaluate = ev
runpy.run_path("bench/cpu_judge_probe.py", run_name="__main__")
