import sys, time, os, statistics, ctypes
sys.path.insert(0, "/work/main")
import torch
torch.set_num_threads(1)
from pipeline.child import memfd, protocol as P
from pipeline.child.timing import Clock
fd = memfd.Outbox.create(1 << 24)
out = memfd.Outbox(fd, 1 << 10, 256)
buf = torch.randn(128, 2, 64, 64)
sets = [[buf[i, 0], buf[i, 1]] for i in range(128)]
class M(torch.nn.Module):
    def forward(self, a, b):
        return ((a - b) ** 2).mean()
class Null(torch.nn.Module):
    def forward(self, a, b):
        a.max(); b.max()
        return torch.zeros(())
memmove = ctypes.memmove
first = torch.frombuffer(out.map, dtype=torch.uint8, count=1); base = first.data_ptr(); del first
def tight(m):
    ns = time.perf_counter_ns
    stamps, meta = [], []
    for i, inputs in enumerate(sets):
        t0 = ns(); o = m(*inputs); t1 = ns()
        stamps.append(t1 - t0)
        if type(o) is torch.Tensor and o.is_contiguous():
            n = o.numel() * o.element_size()
            memmove(base + i * 8192, o.data_ptr(), n)
            meta.append((o.shape, o.dtype))
        del o
    return [s / 1e6 for s in stamps]
for name, m in (("mse", M()), ("null", Null()), ("mse", M()), ("null", Null())):
    for rep in range(5):
        t0 = time.perf_counter_ns()
        times = tight(m)
        w = (time.perf_counter_ns() - t0) / 1e6
        print(name, f"window {w:.3f} calls {sum(times):.3f} outside/call {(w - sum(times)) / 128 * 1000:.1f} us")
