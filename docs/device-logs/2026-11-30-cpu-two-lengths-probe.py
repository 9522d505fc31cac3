"""Probe (thirtieth session, cpu): Bound requests of two lengths, differenced, against the landed
estimate (one length, less the fastest null request). The parent (core 0) times each request on its
clock: it writes the request's sets into a shared memfd, wakes the child (core 1, one thread), and
waits for its reply. The child runs mse's forward on each set in place (or, for a null request,
returns zeros of the output's shape, as the calibration's null model). The claim is what a timed
block would read: the child's own warm sets, call by call, the median. Usage: probe.py ROWS COLS ROUNDS
[eager]: with "eager", a third process on the child's core (the reference) runs an eager block of
16 mse calls on its own 8 sets before every request, as the judge's reference does."""
import mmap, os, statistics, sys, time
import numpy as np
import torch

rows, cols, rounds = (int(a) for a in sys.argv[1:4])
eager = len(sys.argv) > 4 and sys.argv[4] == "eager"
SHORT, LONG = 4, 8
set_bytes = 2 * rows * cols * 4
fd = os.memfd_create("probe-inbox")
os.ftruncate(fd, set_bytes * LONG)
r_go, w_go = os.pipe()
r_done, w_done = os.pipe()
pid = os.fork()
if pid == 0:
    os.sched_setaffinity(0, {1})
    torch.set_num_threads(1)
    m = mmap.mmap(fd, set_bytes * LONG, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    views = [[torch.frombuffer(m, dtype=torch.float32, count=rows * cols, offset=i * set_bytes + k * rows * cols * 4)
              .view(rows, cols) for k in range(2)] for i in range(LONG)]
    own = [[torch.randn(rows, cols) for _ in range(2)] for _ in range(LONG)]
    fwd = lambda a, b: torch.mean((a - b) ** 2)
    claims, hot = [], []
    spare = [[torch.randn(rows, cols) for _ in range(2)] for _ in range(LONG)]
    while True:
        msg = os.read(r_go, 2)
        if msg == b"q ":
            break
        kind, n = msg[:1], msg[1]
        if kind == b"r":
            outs = [fwd(*views[i]) for i in range(n)]
        elif kind == b"n":
            outs = [torch.zeros(()) for _ in range(n)]
        else:  # a timed block on its own sets: the claim
            fwd(*own[0])
            for s in own * 4:
                t = time.perf_counter_ns(); fwd(*s); claims.append(time.perf_counter_ns() - t)
            for s, f in zip(own * 4, spare * 4):  # as a timed block: each call's inputs written just before it
                s[0].copy_(f[0]); s[1].copy_(f[1])
                t = time.perf_counter_ns(); fwd(*s); hot.append(time.perf_counter_ns() - t)
        os.write(w_done, b"x")
    print(f"TWO {rows}x{cols}: claim (own warm sets, median call) {statistics.median(claims) / 1e6:.4f} ms; "
          f"on inputs written just before each call {statistics.median(hot) / 1e6:.4f} ms", flush=True)
    os._exit(0)
r_ref, w_ref = os.pipe()
r_refd, w_refd = os.pipe()
ref = os.fork() if eager else None
if ref == 0:
    os.sched_setaffinity(0, {1})
    torch.set_num_threads(1)
    sets = [[torch.randn(rows, cols) for _ in range(2)] for _ in range(8)]
    while os.read(r_ref, 1) == b"e":
        for s in sets * 2:
            torch.mean((s[0] - s[1]) ** 2)
        os.write(w_refd, b"x")
    os._exit(0)
os.sched_setaffinity(0, {0})
m = mmap.mmap(fd, set_bytes * LONG, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
rng = np.random.default_rng(0)
pool = [rng.standard_normal(set_bytes // 4, dtype=np.float32).tobytes() for _ in range(LONG * 2)]
win = {k: [] for k in ("n4", "n8", "r4", "r8")}
for rnd in range(rounds):
    for kind in ("n", "r"):
        for n in (SHORT, LONG):
            if eager:
                os.write(w_ref, b"e"); os.read(r_refd, 1)
            t = time.perf_counter_ns()
            for i in range(n):
                m[i * set_bytes:(i + 1) * set_bytes] = pool[(rnd + i) % len(pool)]
            os.write(w_go, kind.encode() + bytes([n]))
            os.read(r_done, 1)
            win[f"{kind}{n}"].append((time.perf_counter_ns() - t) / 1e6)
    os.write(w_go, b"t\x00"); os.read(r_done, 1)
os.write(w_go, b"q ")
os.waitpid(pid, 0)
if eager:
    os.write(w_ref, b"q"); os.waitpid(ref, 0)
w = {k: v[2:] for k, v in win.items()}
mn = {k: min(v) for k, v in w.items()}
md = {k: statistics.median(v) for k, v in w.items()}
landed = min((x - mn["n8"]) / LONG for x in w["r8"])
two_min = ((mn["r8"] - mn["r4"]) - (mn["n8"] - mn["n4"])) / (LONG - SHORT)
two_med = ((md["r8"] - md["r4"]) - (md["n8"] - md["n4"])) / (LONG - SHORT)
pairs = sorted(((a8 - a4) - (b8 - b4)) / (LONG - SHORT) for a4, a8, b4, b8 in zip(w["r4"], w["r8"], w["n4"], w["n8"]))
tag = f"{rows}x{cols}{' eager' if eager else ''}"
print(f"TWO {tag}: windows median ms " + ", ".join(f"{k} {md[k]:.3f}" for k in md), flush=True)
print(f"TWO {tag}: estimate a call, ms: landed (fastest 8-call request less the fastest null) {landed:.4f}; "
      f"two lengths, fastest {two_min:.4f}; two lengths, medians {two_med:.4f}; per round, median {statistics.median(pairs):.4f} "
      f"[{pairs[len(pairs) // 4]:.4f}-{pairs[3 * len(pairs) // 4]:.4f}]", flush=True)
