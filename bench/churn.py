"""Does a request's window grow after the other process frees and allocates memory, or after this one is
stopped and continued? (docs/decisions/gpu-timing.md: on the branch one-clock the child's replayed
mse at KernelBench's size read 8.5-10.7 ms in each evaluation's first request and 11.7-13.5 ms in the
next four, eager beside it 8.3-8.5; between requests the reference captures and frees gigabytes with
the child stopped, and the child frees its graphs and captures anew.)

One process (the timer) holds two 4 GiB inputs and a CUDA graph of mse on them, and times replays on
its own clock, a window around launch and sync, as the parent times a Play. Between rounds, one of:
  quiet   nothing
  other   a second process allocates, writes and frees 16 GiB (torch.cuda.empty_cache), as the
          reference's capture and play do
  own     the timer itself frees 16 GiB of cache and allocates it again, as the child's next capture does
  stopped the timer is sent SIGSTOP, then SIGCONT 50 ms later, as the child around the reference's play
Per case, the windows of the first replay after the event and of the next ones (median of ROUNDS).

    PYTHONPATH=$PWD python bench/churn.py [--gib 4] [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import torch

HOG = """
import sys, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30) // 4, device="cuda"); x.fill_(1.0); torch.cuda.synchronize()
del x; torch.cuda.empty_cache()
"""


def timer(gib: float, rounds: int, cases: list[str]) -> None:
    n = int(gib * 2**30) // 4
    a, b = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.mean((a - b) ** 2)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        torch.mean((a - b) ** 2)
    graph.replay()
    torch.cuda.synchronize()

    def window() -> float:
        start = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    for case in cases:
        first, later = [], []
        for _ in range(rounds):
            for _ in range(3):
                window()
            if case == "other":
                subprocess.run([sys.executable, "-c", HOG, str(4 * gib)], check=True)
            elif case == "own":
                spare = torch.empty(int(4 * gib * 2**30) // 4, device="cuda")
                spare.fill_(1.0)
                del spare
                torch.cuda.empty_cache()
                spare = torch.empty(int(4 * gib * 2**30) // 4, device="cuda")
                del spare
            elif case == "stopped":
                print("STOP", flush=True)
                sys.stdin.readline()  # the driver's SIGSTOP and SIGCONT came and went
            first.append(window())
            later += [window() for _ in range(4)]
        print(f"CHURN {case:8s} first {statistics.median(first):8.3f} ms  later {statistics.median(later):8.3f} ms  "
              f"(first {min(first):.3f}-{max(first):.3f}, later {min(later):.3f}-{max(later):.3f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--timer", action="store_true")
    ap.add_argument("--cases", default="quiet,other,own,stopped,quiet")
    args = ap.parse_args()
    cases = args.cases.split(",")
    if args.timer:
        timer(args.gib, args.rounds, cases)
        return
    proc = subprocess.Popen([sys.executable, __file__, "--timer", "--gib", str(args.gib), "--rounds", str(args.rounds),
                             "--cases", args.cases], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("STOP"):
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(0.05)
            os.kill(proc.pid, signal.SIGCONT)
            proc.stdin.write("\n")
            proc.stdin.flush()
        else:
            print(line, end="", flush=True)
    sys.exit(proc.wait())


if __name__ == "__main__":
    main()
