"""The cpu judge idle and beside two busy loops: the honest fast mse, torch's mse with its clock forged
to a tenth, and each bundled reference as its own candidate, RUNS evaluations each way, on one bench per task (its baselines measured idle).

    python bench/cpu_load.py [--runs 5] [--size small] [--tasks mse,cosine,...] [--record FILE]

Per candidate and load: correct, with a figure, fit to be best (trusted and not unfit; the references
are flagged no_custom_kernel besides), the median and
range of x eager and of the time a call; then the loaded median time over the idle one. One JSON line
per evaluation goes to stderr. Its latest figures: docs/validation.md ("The honest references").
With --record, the self-loading forger (tests/redteam/load_launder.py) is judged too, and each
evaluation's Measured and Decision (pipeline.verdicts) go to FILE as a JSON line: the
recorded table tests/test_decide.py reads (fixtures/decide/recorded.jsonl).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import test_redteam as R  # noqa: E402
from forgers import forged_clock  # noqa: E402

from pipeline.build import build  # noqa: E402
from pipeline.child import tasks  # noqa: E402
from pipeline.judge import evaluate  # noqa: E402
from pipeline.judge.bench import prepare  # noqa: E402

NAMES = ("cosine", "cross_entropy", "hinge", "huber", "kl_div", "mse", "triplet")


def spin(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def candidates(work: Path, names: list[str], record: bool = False) -> list[tuple[str, str, Path, Path]]:
    """(label, task, code, build dir): the fused mse (built once), then each reference as ModelNew."""
    code = R.REDTEAM / "honest_fast_mse.py"
    built = build.build(code, hashlib.sha256(code.read_bytes()).hexdigest()[:16], work / "builds",
                        build.BuildOptions(timeout_s=600))
    assert built.ok, built.log[-2000:]
    out = [("honest_fast_mse", "mse", code, Path(built.build_dir))]
    forged = work / "forged.py"  # torch's mse, its clock forged to a tenth (tests/redteam/forged_time_blocks.py)
    forged.write_text(forged_clock(0.1))
    (work / "build-forged").mkdir()
    out.append(("mse, clock forged to 0.1", "mse", forged, work / "build-forged"))
    if record:
        launder = R.REDTEAM / "load_launder.py"
        (work / "build-launder").mkdir()
        out.append(("load_launder (clock forged to 0.1, spinners of its own)", "mse", launder, work / "build-launder"))
    for name in names:
        task = tasks.discover(R.TASKS, [name])[0]
        ref = work / f"{name}.py"
        ref.write_text(task.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n")
        (work / f"build-{name}").mkdir()
        out.append((name, name, ref, work / f"build-{name}"))
    return out


def summary(results: list) -> dict:
    timed = [r for r in results if r.time_ms is not None]
    xs = sorted(r.speedup_eager for r in timed if r.speedup_eager)
    ts = [r.time_ms for r in timed]
    return {"correct": sum(r.verdict.value == "correct" for r in results), "figure": len(timed),
            "fit": sum(r.verdict.value == "correct" and r.trusted and not r.device_unfit for r in results),
            "x_median": statistics.median(xs) if xs else None, "x_range": (xs[0], xs[-1]) if xs else None,
            "time_median": statistics.median(ts) if ts else None, "n": len(results)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--size", default="small")
    ap.add_argument("--tasks", default=",".join(NAMES))
    ap.add_argument("--record", type=Path, help="append each evaluation's Measured and Outcome here")
    args = ap.parse_args()
    decided: list = []
    if args.record:
        real = evaluate.decide

        def decide(m):  # the judge's own rule, its argument and answer kept
            decision = real(m)
            decided.append((m, decision))
            return decision
        evaluate.decide = decide
    settings = R.SETTINGS
    work = Path(tempfile.mkdtemp(prefix="kgen-cpuload-"))
    rows = []
    for label, name, code, build_dir in candidates(work, args.tasks.split(","), bool(args.record)):
        bench = prepare(tasks.discover(R.TASKS, [name])[0], args.size, "cpu", settings)
        got = {}
        try:
            for load in ("idle", "loaded"):
                others = [multiprocessing.Process(target=spin, args=(7200,), daemon=True)
                          for _ in range(2 if load == "loaded" else 0)]
                for p in others:
                    p.start()
                try:
                    got[load] = []
                    for _ in range(args.runs):
                        decided.clear()
                        r = evaluate.evaluate(bench, code, build_dir, settings)
                        got[load].append(r)
                        if args.record:
                            with args.record.open("a") as f:
                                for m, decision in decided:
                                    f.write(json.dumps({"device": "cpu", "candidate": label, "load": load,
                                                        "measured": m.model_dump(mode="json"),
                                                        "decision": decision.model_dump(mode="json")}) + "\n")
                        print(json.dumps({"candidate": label, "load": load, "verdict": r.verdict.value,
                                          "time_ms": r.time_ms, "x_eager": r.speedup_eager, "unfit": r.device_unfit,
                                          "trusted": r.trusted, "error": (r.error or "")[:200]}), file=sys.stderr, flush=True)
                finally:
                    for p in others:
                        p.terminate()
        finally:
            bench.close()
        idle, loaded = summary(got["idle"]), summary(got["loaded"])
        ratio = (loaded["time_median"] / idle["time_median"]) if idle["time_median"] and loaded["time_median"] else None
        rows.append((label, idle, loaded, ratio))
    print(f"| candidate | idle: correct / figure / fit of {args.runs} | idle x eager | loaded: correct / figure / "
          f"fit | loaded x eager | loaded / idle time |")
    print("|---|---|---|---|---|---|")
    for label, idle, loaded, ratio in rows:
        def x(s: dict) -> str:
            return f"{s['x_median']:.2f} ({s['x_range'][0]:.2f}-{s['x_range'][1]:.2f})" if s["x_median"] else "-"
        print(f"| {label} | {idle['correct']} / {idle['figure']} / {idle['fit']} | {x(idle)} | "
              f"{loaded['correct']} / {loaded['figure']} / {loaded['fit']} | {x(loaded)} | "
              f"{f'{ratio:.2f}' if ratio else '-'} |")


if __name__ == "__main__":
    main()
