"""Where does run-to-run timing variance come from? Three fresh processes, each timing the same
subjects in three rounds of 40 calls with pipeline.child.timing.Clock's own steps (new input values, L2
reset, 256 MiB fill, events, device sync), keeping the event time and the wall time of every call:

  copy       a 1 GiB device-to-device copy (no Python in the call, one kernel)
  mse        the mse reference, eager (three kernels over 8.6 GB)
  ce         the cross_entropy reference, eager (0.5 ms)
  ce_comp    the cross_entropy reference under torch.compile (host-heavy launch path)

Per round: the median event time, its p10-p90, the median wall time, and how many calls the wall
rule (wall > 1.5 x events + 0.05 ms) would have timed by the wall clock; and the same call timed by
Clock.time_call, behind the hold kernel (pipeline.child.hold): the "held" columns. If the copy moves between
processes as much as the kernels do, the variance is the GPU's, not the harness's. NOISE_VARIANTS
picks how the processes start: plain, pinned to one core, or pinned with a real-time priority.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import torch

from pipeline.child import tasks
from pipeline.child.timing import SIDE_WORK_MS, SIDE_WORK_RATIO, Clock
from probe_kit import reference


def call_times(clock: Clock, fn, n: int = 40) -> tuple[list[float], list[float], list[float]]:
    """Each call timed twice over: with the GPU idle at the start event (timing method 4 and
    before: events and wall clock), and by Clock.time_call (behind the hold, method 5)."""
    events, walls, held = [], [], []
    for _ in range(n):
        clock.flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter_ns()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        walls.append((time.perf_counter_ns() - t0) / 1e6)
        events.append(start.elapsed_time(end))
        held.append(clock.time_call(fn)[0])
    return events, walls, held


def one_process() -> None:
    clock = Clock("cuda")
    src = torch.ones((1 << 30) // 4, device="cuda")
    dst = torch.empty_like(src)
    mse_mod, mse, mse_in = reference("mse")
    ce_mod, ce, ce_in = reference("cross_entropy")
    ce_comp = torch.compile(ce)
    subjects = {"copy": (lambda: dst.copy_(src), None, None), "mse": (lambda: mse(*mse_in), mse_mod, mse_in),
                "ce": (lambda: ce(*ce_in), ce_mod, ce_in), "ce_comp": (lambda: ce_comp(*ce_in), ce_mod, ce_in)}
    with torch.no_grad():
        for fn, _, _ in subjects.values():
            for _ in range(5):
                fn()
        for rnd in range(3):
            for name, (fn, module, inputs) in subjects.items():
                if module is not None:
                    tasks.refill_inputs(inputs, module, 1000 + rnd, "cuda")
                events, walls, held = call_times(clock, fn)
                q, qh = statistics.quantiles(events, n=10), statistics.quantiles(held, n=10)
                wall_rule = sum(w > e * SIDE_WORK_RATIO + SIDE_WORK_MS for e, w in zip(events, walls))
                print(json.dumps({"round": rnd, "subject": name, "median": statistics.median(events),
                                  "p10": q[0], "p90": q[-1], "max": max(events), "wall_median": statistics.median(walls),
                                  "wall_rule": wall_rule, "held_median": statistics.median(held),
                                  "held_p10": qh[0], "held_p90": qh[-1]}), flush=True)
            time.sleep(1.0)


VARIANTS = {  # how each fresh process is started: is the host's jitter the scheduler's?
    "plain": [],
    "pinned": ["taskset", "-c", "5"],
    "pinned_fifo": ["taskset", "-c", "5", "chrt", "-f", "50"],
}


def main() -> None:
    rows = []
    for variant in os.environ.get("NOISE_VARIANTS", "plain").split():
        for proc in range(3):
            cmd = [*VARIANTS[variant], sys.executable, __file__, "one"]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
            for line in out.stdout.splitlines():
                if line.startswith("{"):
                    rows.append({"variant": variant, "proc": proc, **json.loads(line)})
            if out.returncode:
                print(variant, out.stderr[-2000:])
    print(f"{'variant':<12}{'proc':>4}{'rnd':>4} {'subject':<9}{'median':>9}{'p10':>9}{'p90':>9}{'max':>9}{'wall':>9}{'rule':>5}{'held':>9}{'h p10':>9}")
    for r in rows:
        print(f"{r['variant']:<12}{r['proc']:>4}{r['round']:>4} {r['subject']:<9}{r['median']:>9.4f}{r['p10']:>9.4f}"
              f"{r['p90']:>9.4f}{r['max']:>9.4f}{r['wall_median']:>9.4f}{r['wall_rule']:>5}"
              f"{r['held_median']:>9.4f}{r['held_p10']:>9.4f}")
    for variant in dict.fromkeys(r["variant"] for r in rows):
        for subject in ("copy", "mse", "ce", "ce_comp"):
            meds = [r["median"] for r in rows if r["subject"] == subject and r["variant"] == variant]
            lows = [r["p10"] for r in rows if r["subject"] == subject and r["variant"] == variant]
            held = [r["held_median"] for r in rows if r["subject"] == subject and r["variant"] == variant]
            print(f"{variant:<12}{subject:<9} medians {min(meds):.4f}-{max(meds):.4f} ({100 * (max(meds) / min(meds) - 1):.2f}%)"
                  f"  p10 {min(lows):.4f}-{max(lows):.4f} ({100 * (max(lows) / min(lows) - 1):.2f}%)"
                  f"  held medians {min(held):.4f}-{max(held):.4f} ({100 * (max(held) / min(held) - 1):.2f}%)")


if __name__ == "__main__":
    one_process() if sys.argv[1:] == ["one"] else main()
