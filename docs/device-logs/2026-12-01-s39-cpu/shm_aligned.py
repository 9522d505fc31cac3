"""Is a call on inputs in a shared memfd map slower than on private memory? (cpu judge fairness probe)"""
import os, sys, time, mmap, statistics, torch
torch.set_num_threads(1)
os.sched_setaffinity(0, {0})
import torch.nn.functional as F
rows, cols = (int(x) for x in sys.argv[1:3])
n = -(-rows * cols * 4 // 64) * 64
src = [torch.randn(rows, cols) for _ in range(2)]
fd = os.memfd_create("x")
os.ftruncate(fd, 2 * n + 4096)
m = mmap.mmap(fd, 2 * n, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
shared = [torch.frombuffer(m, dtype=torch.float32, count=rows * cols, offset=i * n).view(rows, cols) for i in range(2)]
anon = [torch.empty(rows, cols) for _ in range(2)]
res = {"anon": [], "shared": []}
for i in range(400):
    for case, dst in (("anon", anon), ("shared", shared)):
        for d, s in zip(dst, src):
            d.copy_(s)
        t = time.perf_counter(); F.mse_loss(dst[0], dst[1]); res[case].append((time.perf_counter() - t) * 1e3)
for k, v in res.items():
    print(rows, cols, k, "median %.4f ms" % statistics.median(v))
