"""In-process: gradient mode's add at 512 x 512, a timed block's pattern against a Bound request's.
    python gradprobe.py ROOT [ROUNDS]"""
import sys, time, os, statistics
ROOT = sys.argv[1]; sys.path.insert(0, ROOT)
import torch
torch.set_num_threads(1)
from pathlib import Path
from pipeline.child.grad import ForwardBackward, null_model
from pipeline.child import tasks, memfd, protocol as P
from pipeline.child.timing import time_blocks, Clock

class Add(torch.nn.Module):
    def forward(self, a, b):
        return a + b

task = tasks.discover(Path(ROOT) / "tests" / "tasks", ["big_add"])[0]
module = tasks.load_module(task, "small")
clock = Clock("cpu")
N = 16
slot_values = 3 * 512 * 512
at = memfd.inbox_offset(slot_values * 8 * N)
set_bytes = 2 * 512 * 512 * 4
fd = memfd.Outbox.create(at + set_bytes * N)
outbox = memfd.Outbox(fd, slot_values, N)
inbox = memfd.Inbox(fd, at, set_bytes, N)
cand = ForwardBackward(Add(), 1)
null = null_model(module, (512, 512), torch.float32, "cpu", True)
like = tasks.make_inputs(module, 0, "base", "cpu")
cand(*like)  # tells it the output's shape
seed = [100]

def nextseed():
    seed[0] += 1
    return seed[0]

def timed(rounds=40):
    sets = [tasks.make_inputs(module, 0, "base", "cpu") for _ in range(4)]
    def refill(x, s):
        tasks.refill_inputs(x, module, s, "cpu")
        cand.reseed(x, s)
    with torch.no_grad():
        return time_blocks(clock, lambda x: cand(*x), sets, rounds, lambda f, c: [nextseed() for _ in range(c)], refill,
                           lambda out: P.put(outbox, 0, out))

def bound(model, per_call=False):
    packs = [memfd.pack_set(tasks.make_inputs(module, nextseed(), "base", "cpu")) for _ in range(N)]
    sets = [inbox.inputs(i, like) for i in range(N)]
    if isinstance(model, ForwardBackward):
        for s in sets:
            model.reseed(s, nextseed())
    inbox.reveal(packs, {0})
    ts = []
    t0 = time.perf_counter_ns()
    with torch.no_grad():
        for i, s in enumerate(sets):
            a = time.perf_counter_ns()
            P.put(outbox, i, model(*s))
            ts.append((time.perf_counter_ns() - a) / 1e6)
    return (time.perf_counter_ns() - t0) / 1e6, ts

os.sched_setaffinity(0, {0})
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
for r in range(rounds):
    t = timed()
    nw = sorted(bound(null)[0] for _ in range(5))
    bw = [bound(cand) for _ in range(5)]
    per = sorted((w - nw[0]) / N for w, _ in bw)
    calls = [x for _, ts in bw for x in ts]
    print(f"round {r}: timed median {statistics.median(t):.4f} (block means {[round(statistics.fmean(t[i:i+4]),4) for i in range(0, len(t), 4)][:5]}) | "
          f"bound per call {per[0]:.4f}-{per[-1]:.4f} (null {nw[0]/N:.4f}); in-window call+put median {statistics.median(calls):.4f}", flush=True)
