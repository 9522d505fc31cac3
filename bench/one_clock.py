"""Could the parent's clock alone give the figure on a GPU? Each bundled reference judged as its own
candidate EVALS times (default 5), each in a fresh reference process and child with new seeds, at
each of SIZES (default "odd default"): per evaluation the time the attempt records (on a GPU the
child's events within the parent's bound, on the cpu the parent's windows), the parent's own
estimate (its paired replay windows, or its Bound windows, net per call: the median over the
requests and the fastest), and eager beside it. Then per task and size the spread of each over the
evaluations, and the parent's median over the child's: where the parent's median holds within 5%
across fresh evaluations and the ratio is stable, it can be the figure (issue "one clock").

    PYTHONPATH=$PWD python bench/one_clock.py [--device cuda] [--tasks mse,huber] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

from pipeline.child import tasks
from pipeline.config import EvalConfig
from pipeline.judge import evaluate
from pipeline.judge.bench import prepare

ROOT = Path(__file__).resolve().parents[1]
PAIRED = re.compile(r"each less a null replay of the reference's beside it: ([0-9., ]+) us a call")


def parent_per_call(result) -> list[float]:
    """The parent's net ms a call, request by request: the paired replays' (from the stored note), or
    on the cpu the recorded time's own (the parent's windows; one value, the median, is what is kept)."""
    found = PAIRED.search(result.bound_note or "")
    if found:
        return [float(x) / 1e3 for x in found.group(1).split(",") if x.strip()]
    return [result.wall_ms_per_call] if result.wall_ms_per_call else []


def spread(xs: list[float]) -> float | None:
    return (max(xs) - min(xs)) / min(xs) if xs and min(xs) > 0 else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tasks", default="mse,huber,cross_entropy,triplet")
    ap.add_argument("--sizes", default="odd,default")
    ap.add_argument("--evals", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    settings = EvalConfig(compile_baseline=False, check_shapes=False, profile=False)
    rows, work = [], Path(tempfile.mkdtemp(prefix="kgen-oneclock-"))
    for task in tasks.discover(ROOT / "reference_tasks", args.tasks.split(",")):
        code = work / f"{task.name}.py"  # the reference as its own candidate
        code.write_text(task.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n")
        (work / f"build-{task.name}").mkdir()
        for size in args.sizes.split(","):
            runs = []
            for _ in range(args.evals):
                bench = prepare(task, size, args.device, settings)
                try:
                    r = evaluate.evaluate(bench, code, work / f"build-{task.name}", settings)
                finally:
                    bench.close()
                per_call = parent_per_call(r)
                runs.append({"verdict": r.verdict.value, "recorded_ms": r.time_ms, "x_eager": r.speedup_eager, "eager_ms":
                             r.eager_beside.median_ms if r.eager_beside else None,
                             "parent_median_ms": statistics.median(per_call) if per_call else None,
                             "parent_fastest_ms": min(per_call) if per_call else None, "requests": len(per_call),
                             "note": (r.bound_note or "")[:400]})
                print(json.dumps({"task": task.name, "size": size, **runs[-1]}), file=sys.stderr, flush=True)
            ok = [x for x in runs if x["verdict"] == "correct" and x["recorded_ms"] and x["parent_median_ms"]]
            rows.append({"task": task.name, "size": size, "correct": f"{len(ok)}/{len(runs)}",
                         "recorded_spread": spread([x["recorded_ms"] for x in ok]),
                         "parent_spread": spread([x["parent_median_ms"] for x in ok]),
                         "parent_over_recorded": [round(x["parent_median_ms"] / x["recorded_ms"], 3) for x in ok],
                         "x_eager_spread": spread([x["x_eager"] for x in ok if x["x_eager"]]),
                         "x_eager": [round(x["x_eager"], 3) for x in ok if x["x_eager"]],
                         "recorded_ms": statistics.median(x["recorded_ms"] for x in ok) if ok else None})
    print(f"{'task':<14}{'size':<9}{'correct':>8}{'ms':>10}{'spread':>8}{'parent spread':>14}{'x eager spread':>15}  parent / recorded; x eager")
    for r in rows:
        pct = [f"{100 * x:.1f}%" if x is not None else "-" for x in (r["recorded_spread"], r["parent_spread"], r["x_eager_spread"])]
        print(f"{r['task']:<14}{r['size']:<9}{r['correct']:>8}{r['recorded_ms'] or 0:>10.4f}{pct[0]:>8}{pct[1]:>14}{pct[2]:>15}  "
              + " ".join(str(x) for x in r["parent_over_recorded"]) + "; " + " ".join(str(x) for x in r["x_eager"]))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
