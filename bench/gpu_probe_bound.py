"""Probe (issue 15): where a gradient-mode Bound request's time goes, for the null model and for an
honest kernel, phase by phase, in one process (no sandbox, no parent): the child's `bound()` steps
replayed as they are (inputs from a seed per call, the calls, one sync, each output put into an
outbox memfd), each phase timed with the wall clock.

    python3 bench/gpu_probe_bound.py --task mse --dtype bfloat16          # fixtures/grad/mse_cuda.py
    python3 bench/gpu_probe_bound.py --backend cpu --task huber --size small --dtype float32

Why: on the H100 the parent's clock put honest forward-plus-backward kernels at 1.7-2.1 ms a call
against 0.06-0.1 ms claimed (docs/benchmarks.md, tenth session), in some attempts and not others.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.build import build  # noqa: E402
from pipeline.child import protocol as P  # noqa: E402
from pipeline.child import memfd
from pipeline.child import tasks  # noqa: E402
from pipeline.child.grad import ForwardBackward, Grads  # noqa: E402
from pipeline.child.harness import import_candidate  # noqa: E402
from pipeline.child.prebuilt import import_only  # noqa: E402

SIZES = {"mse": "batch_size=2048,input_shape=(4096,)", "huber": "batch_size=2048,input_shape=(4096,)",
         "hinge": "batch_size=4096,input_shape=(4096,)"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--task", default="mse")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--size", default=None)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--pin", default="no", help="page-lock the outbox first, as the child does on a GPU: "
                    "no, yes, or both (one run each, after one build)")
    args = ap.parse_args()
    device = "cuda" if args.backend == "cuda" else "cpu"
    src = ROOT / ("fixtures/grad" if device == "cuda" else "tests/redteam") / (
        f"{args.task}_cuda.py" if device == "cuda" else f"grad_honest_{args.task}.py")
    work = Path(tempfile.mkdtemp(prefix="kgen-probe-"))
    s = time.monotonic()
    r = build.build(src, "probe", work, build.BuildOptions(
        900, env=build.build_env(["0"] if device == "cuda" else []), fast=True, cuda=device == "cuda"))
    print(f"BUILD ok={r.ok} {time.monotonic() - s:.1f} s", flush=True)
    if not r.ok:
        print(r.log[-2000:])
        return 1
    os.environ["TORCH_EXTENSIONS_DIR"] = r.build_dir
    import_only()
    cand = import_candidate(str(src))
    task = tasks.discover(ROOT / "reference_tasks", [args.task])[0]
    module = tasks.load_module(task, args.size or SIZES.get(args.task, "small"), args.dtype)
    real = ForwardBackward(tasks.make_model(module, cand.ModelNew, 1, device), 5)
    out_shape = tuple(real(*tasks.make_inputs(module, 3, "base", device)).output.shape)
    dtype = module.__kgen_dtype__ or torch.float32

    def null(*inputs):
        wanted = [x for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()]
        return Grads(torch.zeros(out_shape, device=device, dtype=dtype), [torch.zeros_like(x) for x in wanted], [])

    numel = 1 + sum(x.numel() for x in tasks.make_inputs(module, 3, "base", device) if x.is_floating_point())
    for pin in {"no": [False], "yes": [True], "both": [False, True]}[args.pin]:
        probe(module, real, null, numel, device, pin, args)
    return 0


def probe(module, real, null, numel: int, device: str, pin: bool, args) -> None:
    """Requests alternating null and real, each phase timed; one BOUNDPROBE line per model."""
    outbox = memfd.Outbox(memfd.Outbox.create(numel * 8 * args.calls), numel, args.calls)
    pinned = outbox.pin() if pin else False
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    phases: dict[str, dict[str, list[float]]] = {"null": {}, "real": {}}
    seed = 100
    for i in range(args.requests * 2):
        name, model = (("null", null), ("real", real))[i % 2]
        t = [time.perf_counter()]
        with torch.no_grad():
            sets = []
            for _ in range(args.calls):
                seed += 1
                sets.append(tasks.make_inputs(module, seed, "base", device))
            t.append(time.perf_counter())
            outs = [model(*x) for x in sets]
            t.append(time.perf_counter())
            sync()
            t.append(time.perf_counter())
            headers = [P.put(outbox, j, out) for j, out in enumerate(outs)]
            t.append(time.perf_counter())
        assert all(h.written for h in headers), "an output did not fit the probe's outbox"
        for key, a, b in (("inputs", 0, 1), ("calls", 1, 2), ("sync", 2, 3), ("put", 3, 4), ("total", 0, 4)):
            phases[name].setdefault(key, []).append((t[b] - t[a]) * 1e3)
    for name in ("null", "real"):
        line = " ".join(f"{k}={statistics.median(v):.3f}({min(v):.3f}-{max(v):.3f})" for k, v in phases[name].items())
        print(f"BOUNDPROBE {args.task} {args.dtype} pinned={pinned} {name} ms per request of {args.calls} calls: {line}", flush=True)
    outbox.close()


if __name__ == "__main__":
    sys.exit(main())
