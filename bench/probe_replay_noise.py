"""Where a replayed Bound request's jitter comes from (issue 27 item 3): null and reference-model
requests of mse "small", in one process (no IPC), each timed three ways: the whole play on the host
clock, its factor table (Python) alone, and CUDA events around the graph launches."""
import statistics as st
import sys
import time
from pathlib import Path

import torch

from pipeline.child import replays, tasks

task = tasks.discover(Path("reference_tasks"), ["mse"])[0]
module = tasks.load_module(task, sys.argv[1] if len(sys.argv) > 1 else "small", "float32")
model = module.Model(*module.get_init_inputs()).cuda()
first = tasks.make_inputs(module, 1, "base", "cuda")
out_shape = list(model(*first).shape)
reqs = {}
for n in (512, 2048):
    reqs[f"null{n}"] = replays.null_request(module, 4, n, out_shape, "cuda")
    reqs[f"cand{n}"] = replays.Captured(model, module, [1, 2, 3, 4], n, 7, "cuda")


def play(c, seed):
    t0 = time.perf_counter()
    tab = replays.table(seed, c.replays + c.ahead, c.device)
    t1 = time.perf_counter()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    c.table.copy_(tab); c.count.zero_()
    a.record()
    if c.prologue is not None:
        c.prologue.replay()
    done = 0
    while c.round is not None and c.replays - done >= c.round_replays:
        c.round.replay(); done += c.round_replays
    for r in range(done, c.replays):
        c.graphs[r % len(c.graphs)].replay()
    b.record()
    torch.cuda.synchronize()
    c.digests.tolist()
    t2 = time.perf_counter()
    return (t2 - t0) * 1e3, (t1 - t0) * 1e3, a.elapsed_time(b)


rows = {k: [] for k in reqs}
for it in range(24):
    for k, c in reqs.items():
        rows[k].append(play(c, it * 10 + len(k)))
for k, v in rows.items():
    v = v[2:]
    for i, what in enumerate(("wall", "table", "events")):
        xs = [r[i] for r in v]
        print(f"NOISE {k} {what}: median {st.median(xs):.3f} ms sd {st.stdev(xs):.3f} min {min(xs):.3f} max {max(xs):.3f}")
for n in (512, 2048):
    for i, what in enumerate(("wall", "table", "events")):
        est = [(c[i] - z[i]) / n * 1e3 for c, z in zip(rows[f"cand{n}"][2:], rows[f"null{n}"][2:])]
        print(f"ESTIMATE {n} {what} (cand - adjacent null) us a call: median {st.median(est):.2f} sd {st.stdev(est):.2f} "
              f"min {min(est):.2f} max {max(est):.2f}")
for i, what in enumerate(("wall", "events")):
    ii = 0 if what == "wall" else 2
    est = [((c2[ii] - c1[ii]) - (z2[ii] - z1[ii])) / 1536 * 1e3 for c1, c2, z1, z2 in
           zip(rows["cand512"][2:], rows["cand2048"][2:], rows["null512"][2:], rows["null2048"][2:])]
    print(f"ESTIMATE two-length {what} us a call: median {st.median(est):.2f} sd {st.stdev(est):.2f} "
          f"min {min(est):.2f} max {max(est):.2f}")
