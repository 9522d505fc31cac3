"""Probe (thirtieth session, cpu): what reading a Bound request's inputs from the inbox costs the
child, against the same values in its own tensors. The parent (this process, core 0) writes each
request's sets into a shared memfd mapping; the child (core 1, one thread) runs mse's forward on
them as views (as pipeline.child.memfd.Inbox.inputs makes them), then on copies it made into its own
tensors, then on the views again. Usage: python probe.py ROWS COLS SETS REQUESTS [MODE]; MODE
"evict": the parent reads a 64 MB scratch buffer after each write, "pwrite": it writes with os.pwrite,
"samecore": it writes from the child's core (its affinity moved there for the write, then back);
a MODE ending "+warm": the child first runs its own sets after each wake-up, then the inbox's;
"+spin" in MODE: the child polls the pipe (non-blocking) rather than sleeping in read()."""
import mmap, os, statistics, sys, time
import numpy as np
import torch

rows, cols, sets, requests = (int(a) for a in sys.argv[1:5])
mode = sys.argv[5] if len(sys.argv) > 5 else "plain"
set_bytes = 2 * rows * cols * 4
fd = os.memfd_create("probe-inbox")
os.ftruncate(fd, set_bytes * sets)
r_go, w_go = os.pipe()
r_done, w_done = os.pipe()
pid = os.fork()
if pid == 0:  # the child
    os.sched_setaffinity(0, {1})
    torch.set_num_threads(1)
    m = mmap.mmap(fd, set_bytes * sets, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    views = [[torch.frombuffer(m, dtype=torch.float32, count=rows * cols, offset=i * set_bytes + k * rows * cols * 4)
              .view(rows, cols) for k in range(2)] for i in range(sets)]
    own = [[torch.empty(rows, cols) for _ in range(2)] for _ in range(sets)]
    fwd = lambda a, b: torch.mean((a - b) ** 2)
    rows_out = {"own, first after the wake-up": [], "inbox, just written": [], "own copies (copy untimed)": [], "inbox, read again": [], "copy into own": []}
    positions = []  # with "+warm": each call's ns in the pass after a wake-up, by its place in the pass
    if "+spin" in mode:
        os.set_blocking(r_go, False)
    for _ in range(requests):
        while True:
            try:
                if os.read(r_go, 1):
                    break
            except BlockingIOError:
                pass
        if "+warm" in mode:  # the child's own sets first: whatever waking up costs is paid here
            each = []
            for s_ in own:
                t = time.perf_counter_ns(); fwd(*s_); each.append(time.perf_counter_ns() - t)
            rows_out["own, first after the wake-up"].append(sum(each))
            positions.append(each)
        t = time.perf_counter_ns(); [fwd(*s) for s in views]; rows_out["inbox, just written"].append(time.perf_counter_ns() - t)
        t = time.perf_counter_ns(); [o[k].copy_(v[k]) for o, v in zip(own, views) for k in range(2)]; rows_out["copy into own"].append(time.perf_counter_ns() - t)
        t = time.perf_counter_ns(); [fwd(*s) for s in own]; rows_out["own copies (copy untimed)"].append(time.perf_counter_ns() - t)
        t = time.perf_counter_ns(); [fwd(*s) for s in views]; rows_out["inbox, read again"].append(time.perf_counter_ns() - t)
        os.write(w_done, b"x")
    for k, v in rows_out.items():
        if not v:
            continue
        v = [x / 1e6 / sets for x in v[2:]]
        print(f"INBOX {mode:6} {rows}x{cols} {sets} sets: {k:28} median {statistics.median(v):.4f} ms a call "
              f"(min {min(v):.4f}, max {max(v):.4f})", flush=True)
    if positions:
        by = [statistics.median(p[i] for p in positions[2:]) / 1e6 for i in range(sets)]
        print(f"INBOX {mode:6} {rows}x{cols} {sets} sets: own, first after the wake-up, call by call (ms): "
              + " ".join(f"{x:.4f}" for x in by), flush=True)
    os._exit(0)
os.sched_setaffinity(0, {0})
m = mmap.mmap(fd, set_bytes * sets, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
rng = np.random.default_rng(0)
scratch = np.ones(16 << 20, dtype=np.float32)
for _ in range(requests):
    data = rng.standard_normal(set_bytes // 4 * sets, dtype=np.float32).tobytes()
    if mode.startswith("samecore"):
        os.sched_setaffinity(0, {1})
        m[:] = data
        os.sched_setaffinity(0, {0})
    elif mode.startswith("pwrite"):
        os.pwrite(fd, data, 0)
    else:
        m[:] = data
    if mode.startswith("evict"):
        scratch.sum()
    os.write(w_go, b"x")
    os.read(r_done, 1)
os.waitpid(pid, 0)
