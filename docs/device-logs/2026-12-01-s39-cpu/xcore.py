"""Does an input written on another core make the next call on this core slower? (cpu judge fairness probe)"""
import os, sys, time, statistics, torch
torch.set_num_threads(1)
import torch.nn.functional as F
rows, cols = (int(x) for x in sys.argv[1:3])
src = [torch.randn(rows, cols) for _ in range(2)]
dst = [torch.empty(rows, cols) for _ in range(2)]
def call():
    t = time.perf_counter(); F.mse_loss(dst[0], dst[1]); return (time.perf_counter() - t) * 1e3
res = {"own": [], "other": []}
for i in range(400):
    for case in ("own", "other"):
        os.sched_setaffinity(0, {0 if case == "own" else 1})
        for d, s in zip(dst, src):
            d.copy_(s)
        os.sched_setaffinity(0, {0})
        res[case].append(call())
for k, v in res.items():
    print(rows, cols, k, "median %.4f ms" % statistics.median(v), "p25 %.4f" % statistics.quantiles(v, n=4)[0])
