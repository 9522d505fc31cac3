import sys, time
sys.path.insert(0, "/work/main")
import torch
torch.set_num_threads(1)
from pipeline.child import memfd
from pipeline.child.timing import Clock
fd = memfd.Outbox.create(1 << 24)
out = memfd.Outbox(fd, 1 << 10, 256)
buf = torch.randn(128, 2, 64, 64)
sets = [[buf[i, 0], buf[i, 1]] for i in range(128)]
class M(torch.nn.Module):
    def forward(self, a, b):
        return ((a - b) ** 2).mean()
clock = Clock("cpu")
m = M()
def via_time_call():
    kept, times = [], []
    for i, inputs in enumerate(sets):
        ms, o = clock.time_call(lambda: m(*inputs))
        times.append(ms); kept.append(memfd.copy_quick(out, i, o)); del o
    return times
def via_ns():
    kept, st, now = [], [], clock._ns
    for i, inputs in enumerate(sets):
        s = now(); o = m(*inputs); st.append(now() - s)
        kept.append(memfd.copy_quick(out, i, o)); del o
    return [t / 1e6 for t in st]
for rep in range(6):
    for name, f in (("time_call", via_time_call), ("ns", via_ns)):
        t0 = time.perf_counter_ns(); times = f(); w = (time.perf_counter_ns() - t0) / 1e6
        print(f"{name:10s} window {w:.3f} calls {sum(times):.3f} outside/call {(w - sum(times)) / 128 * 1000:.1f} us")
