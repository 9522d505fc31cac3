import sys, time
sys.path.insert(0, "/work/main")
import torch
torch.set_num_threads(1)
from pipeline.child import memfd
from pipeline.child.timing import Clock
fd = memfd.Outbox.create(1 << 24)
out = memfd.Outbox(fd, 1 << 10, 600)
buf = torch.randn(512, 2, 16, 16)
sets = [[buf[i, 0], buf[i, 1]] for i in range(512)]
class M(torch.nn.Module):
    def forward(self, a, b):
        return a + b
clock = Clock("cpu")
m = M()
T = torch.Tensor
def now_copy():
    kept, times = [], []
    for i, inputs in enumerate(sets):
        ms, o = clock.time_call(lambda: m(*inputs))
        times.append(ms); kept.append(memfd.copy_quick(out, i, o)); del o
    return times
def hold():
    held, times = [], []
    for i, inputs in enumerate(sets):
        ms, o = clock.time_call(lambda: m(*inputs))
        times.append(ms); held.append(o); del o
    kept = [memfd.copy_quick(out, i, o) for i, o in enumerate(held)]
    return times
for rep in range(5):
    for name, f in (("now", now_copy), ("hold", hold)):
        t0 = time.perf_counter_ns(); times = f(); w = (time.perf_counter_ns() - t0) / 1e6
        print(f"{name:6s} window {w:.3f} calls {sum(times):.3f} outside/call {(w - sum(times)) / 512 * 1000:.1f} us  call {sum(times)/512*1000:.1f} us")
