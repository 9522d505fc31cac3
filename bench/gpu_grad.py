"""Forward-plus-backward kernels (issue 15): each judged by kgen's evaluator in gradient mode, per dtype,
with eager and torch.compile doing forward plus backward timed side by side; then a training-style
loop (forward, backward, SGD step) through pipeline.library against the same loop in plain PyTorch.

    python3 bench/gpu_grad.py --backend cuda                       # fixtures/grad/{task}_cuda.py
    python3 bench/gpu_grad.py --backend cpu --tasks huber --dtypes float32   # a dry run on the CPU

Prints one GRAD line per task and dtype, one TRAIN line per loop; the attempts go into a fresh
SQLite file (--db), from which the library loads them, as a user's would."""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline import library  # noqa: E402
from pipeline.build import build
from pipeline.child import tasks  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.records import Provenance  # noqa: E402
from pipeline.store.store import Store  # noqa: E402

SIZES = {"mse": "batch_size=2048,input_shape=(4096,)", "huber": "batch_size=2048,input_shape=(4096,)",
         "hinge": "batch_size=4096,input_shape=(4096,)"}
CPU_SIZES = {"huber": "small"}


def candidate(task: str, backend: str) -> Path:
    return ROOT / ("fixtures/grad" if backend == "cuda" else "tests/redteam") / (
        f"{task}_cuda.py" if backend == "cuda" else f"grad_honest_{task}.py")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--tasks", default="mse,huber,hinge")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--config", default="examples/config-h100.yaml")
    ap.add_argument("--db", default=None)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--train", default=None, help="dtypes to run the training loop in (default: --dtypes), from "
                                                   "the correct attempts in --db, earlier calls' included")
    ap.add_argument("--pairs", default=None, help="task:dtype pairs to judge instead of every task in every dtype")
    ap.add_argument("--train-tasks", default=None, help="tasks to run the training loop for (default: --tasks)")
    ap.add_argument("--train-size", default=None, help="the loop's size (default: the size judged); a kernel "
                    "that passed at every shape drawn is used at any shape of that rank (its envelope)")
    args = ap.parse_args()
    cfg = load_config(ROOT / args.config)
    work = Path(tempfile.mkdtemp(prefix="kgen-grad-"))
    generated, builds = work / "generated", work / "builds"
    generated.mkdir()
    db_path = Path(args.db) if args.db else work / "grad.db"
    names = args.tasks.split(",")
    sources = {}
    for t in names:
        code = candidate(t, args.backend).read_text()
        h = hashlib.sha256(code.encode()).hexdigest()[:16]
        (generated / f"{h}.py").write_text(code)
        sources[t] = (h, generated / f"{h}.py")

    def one(t: str):
        h, path = sources[t]
        s = time.monotonic()
        options = build.BuildOptions(900, env=build.build_env(["0"] if args.backend == "cuda" else []), fast=True,
                                     cuda=args.backend == "cuda")
        r = build.build(path, h, builds, options, notice=lambda line: print(line, flush=True))
        print(f"BUILD {t} ok={r.ok} headers={r.headers} {time.monotonic() - s:.1f} s", flush=True)
        if not r.ok:
            print(r.log[-3000:])
        return t, r

    with ThreadPoolExecutor(len(names)) as pool:
        built = dict(pool.map(one, names))
    store = Store.open(db_path)
    run_id = store.start_run("{}", "[]", args.backend, args.backend, torch.__version__, torch.version.cuda,
                             note="bench/gpu_grad.py")
    for dtype in [d for d in args.dtypes.split(",") if d]:
        settings = cfg.evaluation.model_copy(update={"grad": True, "dtype": dtype})
        for t in names:
            if not built[t].ok or (args.pairs and f"{t}:{dtype}" not in args.pairs.split(",")):
                continue
            task = tasks.discover(ROOT / "reference_tasks", [t])[0]
            size = (CPU_SIZES if args.backend == "cpu" else SIZES)[t]
            s = time.monotonic()
            bench = prepare(task, size, args.backend, settings)
            try:
                r = evaluate.evaluate(bench, sources[t][1], Path(built[t].build_dir), settings)
            finally:
                bench.close()
            task_id = store.upsert_task(t, str(task.path), task.source)
            store.save_attempt(Provenance(run_id=run_id, task_id=task_id, task=t, model="fixture", sample=0,
                                          backend=args.backend, template=dtype, completion_id=None,
                                          code_hash=sources[t][0], size=bench.size_name), r)
            tm, e, c = r.timing, r.eager_beside, r.compiled_beside
            spread = (f"kernel p25-p75 {tm.p25_ms:.4g}-{tm.p75_ms:.4g}, eager {e.p25_ms:.4g}-{e.p75_ms:.4g}"
                      + (f", compile {c.p25_ms:.4g}-{c.p75_ms:.4g}" if c else "")) if tm and e else ""
            print(f"GRAD {t} {dtype} size={bench.size_name} verdict={r.verdict.value} flags={[f.value for f in r.flags]} "
                  f"ms={r.time_ms} eager={e.median_ms if e else None} compile={c.median_ms if c else None} "
                  f"x_eager={r.speedup_eager} x_compile={r.speedup_compile} floor_frac={r.floor_fraction} "
                  f"sizes={r.sizes} ({spread}) parent_ms_per_call={r.wall_ms_per_call} error={r.error} "
                  f"wall={time.monotonic() - s:.1f}s "
                  f"prepare={bench.phases} eval={r.phases}", flush=True)
    rows = {(r["task"], r["dtype"]) for r in store.attempts(verdict="correct") if r.get("grad")}
    store.close()
    for dtype in (args.train or args.dtypes).split(","):
        for t in (args.train_tasks or args.tasks).split(","):
            if (t, dtype) in rows:
                train(t, dtype, args, db_path, generated, builds)
    return 0


def train(t: str, dtype: str, args, db_path: Path, generated: Path, builds: Path) -> None:
    """SGD on the predictions through the loss: library (kernel forward and verified backward) against
    the reference Model, same start, same steps, alternating repeats; ms per step and the end state."""
    device = "cuda" if args.backend == "cuda" else "cpu"
    task = tasks.discover(ROOT / "reference_tasks", [t])[0]
    size = args.train_size or (CPU_SIZES if args.backend == "cpu" else SIZES)[t]
    module = tasks.load_module(task, size, dtype)
    loss_lib = library.load(t, db=db_path, backend=args.backend, generated_dir=generated, builds_dir=builds,
                            grad=True, dtype=dtype)
    reference = tasks.make_model(module, module.Model, 0, device)
    p0, target = tasks.make_inputs(module, 7, "base", device)[:2]

    def loop(fn) -> tuple[float, torch.Tensor]:
        p = torch.nn.Parameter(p0.clone())
        opt = torch.optim.SGD([p], lr=1e3)
        for _ in range(3):  # warm-up, then from the same start
            fn(p, target).backward()
        p.data.copy_(p0)
        p.grad = None
        if device == "cuda":
            torch.cuda.synchronize()
        s = time.perf_counter()
        for _ in range(args.steps):
            opt.zero_grad(set_to_none=True)
            fn(p, target).backward()
            opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - s) * 1e3 / args.steps, p.detach()

    lib_ms, ref_ms = [], []
    for _ in range(args.repeats):
        ms, p_lib = loop(loss_lib)
        lib_ms.append(ms)
        ms, p_ref = loop(reference)
        ref_ms.append(ms)
    diff = ((p_lib.double() - p_ref.double()).abs().max() / p_ref.double().abs().max()).item()
    ratios = sorted(r / lib for lib, r in zip(lib_ms, ref_ms))
    print(f"TRAIN {t} {dtype} size={size} kernel={loss_lib.entry.code_hash if loss_lib.entry else None} "
          f"backward_verified={bool(loss_lib.entry and loss_lib.entry.envelope.backward)} steps={args.steps} "
          f"library {statistics.median(lib_ms):.4g} ms/step ({min(lib_ms):.4g}-{max(lib_ms):.4g}) "
          f"plain {statistics.median(ref_ms):.4g} ms/step ({min(ref_ms):.4g}-{max(ref_ms):.4g}) "
          f"speedup {statistics.median(ratios):.3g} ({ratios[0]:.3g}-{ratios[-1]:.3g}) end-state rel diff {diff:.2g}",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
