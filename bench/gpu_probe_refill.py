"""Writing new values into the inputs right before a timed call slows compiled references by 2-12%
(gpu_probe_timing.py). Which way of giving each call fresh values leaves the timing as it is?

  synced       same inputs every call (the shared baselines' method)
  refill       new values into the same storage, then the call (kgen's method up to TIMING_VERSION 2)
  refill_read  refill, then a 256 MB read-only flush, synced
  refill_wait  refill, then 20 ms of idle GPU
  rot2         two input sets: refill the idle one, then time the other (written one call earlier)
  rot2_read    rot2 with the read-only flush before the call
  warm_read    refill, L2 reset, 256 MB fill, then ~0.7 ms of reads over that buffer (the GPU kept busy
               right up to the sync), then the call
  warm_sleep   refill, L2 reset, fill, then a 1 ms spin kernel, then the call
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch

from pipeline.child import tasks
from pipeline.child.timing import Clock
from probe_kit import event_ms, reference

ROOT = Path(__file__).resolve().parent.parent


def run(model, sets, before, n=30) -> float:
    with torch.no_grad():
        for _ in range(3):
            model(*sets[0])
        times = []
        for i in range(n):
            x = before(i)
            torch.cuda.synchronize()
            times.append(event_ms(lambda: model(*x)))
    return statistics.median(times)


def main() -> None:
    clock = Clock("cuda")
    buf = clock._flush_buf
    rows = []
    for name in os.environ.get("PROBE_TASKS", "mse kl_div cross_entropy hinge huber cosine triplet").split():
        module, model, a = reference(name)
        b = tasks.make_inputs(module, 2, "base", "cuda")
        refill = lambda x, seed: tasks.refill_inputs(x, module, seed, "cuda")  # noqa: E731

        def rot(i, read=False):
            idle, live = (a, b) if i % 2 else (b, a)
            refill(idle, 300 + i)
            if read:
                torch.cuda.synchronize()
                buf.sum()
            return live

        def refill_then(i, read=False, wait=False):
            refill(a, 100 + i)
            if read:
                torch.cuda.synchronize()
                buf.sum()
            if wait:
                torch.cuda.synchronize()
                time.sleep(0.02)
            return a

        def warm(i, sleep=False):
            refill(a, 500 + i)
            clock._reset_l2()
            buf.fill_(1.0)
            if sleep:
                torch.cuda._sleep(2_000_000)
            else:
                for _ in range(8):
                    buf.sum()
            return a

        for label, m in (("compile", torch.compile(model)), ("eager", model)):
            if label == "eager" and name not in ("cross_entropy", "kl_div"):
                continue
            row = {"task": name, "model": label,
                   "synced": run(m, [a], lambda i: a),
                   "refill": run(m, [a], refill_then),
                   "refill_read": run(m, [a], lambda i: refill_then(i, read=True)),
                   "refill_wait": run(m, [a], lambda i: refill_then(i, wait=True)),
                   "rot2": run(m, [a], rot),
                   "rot2_read": run(m, [a], lambda i: rot(i, read=True)),
                   "warm_read": run(m, [a], warm), "warm_sleep": run(m, [a], lambda i: warm(i, True))}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del model, a, b
        torch.cuda.empty_cache()
    cols = ["synced", "refill", "refill_read", "refill_wait", "rot2", "rot2_read", "warm_read", "warm_sleep"]
    print(f"\n{'task':<14}{'model':<9}" + "".join(f"{c:>12}" for c in cols))
    for r in rows:
        print(f"{r['task']:<14}{r['model']:<9}" + "".join(f"{r[c]:>12.3f}" for c in cols))


if __name__ == "__main__":
    main()
