"""Probe: how the cpu's lower bound on times separates honest calls from the red team's cheats.

For every bundled task at the tests' two cpu sizes ("small", "odd"), forward and in gradient mode,
the reference itself as the candidate (`class ModelNew(Model)`), and the red team's timing cheats on
mse: the child's median call over the parent's own estimate of a call (`claim/est`). The judge
refuses below (1 - rel) - abs/est of it (pipeline.judge.clocks.BOUND_SLACK); a `*` marks a result that was
judged twice (its first evaluation refused on the parent's clock alone).

    python bench/cpu_bound_ratios.py --runs 2 --load none|spin|copy [--modes fwd,grad] [--cheat-sizes small,odd]

`--load` runs two processes beside it for the whole probe: `spin` (busy loops) or `copy` (numpy
copies of 64 MB, the memory traffic of a neighbour). Logs: docs/device-logs/2026-11-26b-cpu-bound-*.
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from pipeline.judge import evaluate  # noqa: E402
from pipeline.judge.bench import prepare
from pipeline.child import tasks  # noqa: E402
import test_redteam as R  # noqa: E402  (the red team's settings, candidates and real_ms)

# forged-F: forged_time_blocks.py claiming F of each timed call's real time. (Its `real`, the
# candidate's own median, mixes every size it timed where check_shapes is on: read claim/est.)
CHEATS = ["replay_input_hook.py", "deferred_put.py", "clock_instance_patch.py", "forged_time_blocks.py",
          "forged-0.5", "forged-0.6", "mild-0.85", "replay_plan.py"]


def load(kind: str, seconds: float) -> None:
    end = time.time() + seconds
    if kind == "spin":
        while time.time() < end:
            pass
    else:
        import numpy as np
        a = np.ones(64 << 20, dtype=np.uint8)
        b = np.empty_like(a)
        while time.time() < end:
            np.copyto(b, a)


def ratio(result) -> str:
    claim = result.time_ms
    if claim is None and (m := re.search(r"says ([0-9.]+) ms", result.error or "")):
        claim = float(m.group(1))
    est = result.wall_ms_per_call
    value = f"{claim / est:.2f}" if claim and est else "-"
    return f"{result.verdict.value[:9]} {value}{'*' if result.first_refusal else ''}"


def judge(bench, path: Path | None, text: str | None, settings) -> object:
    d = Path(tempfile.mkdtemp())
    (d / "build").mkdir()
    if text is not None:
        path = d / "cand.py"
        path.write_text(text)
    return evaluate.evaluate(bench, path, d / "build", settings)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--load", choices=["none", "spin", "copy"], default="none")
    ap.add_argument("--modes", default="fwd,grad", help="the honest references' modes")
    ap.add_argument("--cheat-sizes", default="small", help="the sizes the cheats on mse are judged at")
    args = ap.parse_args()
    others = [multiprocessing.Process(target=load, args=(args.load, 3600), daemon=True)
              for _ in range(2 if args.load != "none" else 0)]
    for p in others:
        p.start()
    try:
        for grad in [m == "grad" for m in args.modes.split(",") if m]:
            settings = R.SETTINGS.model_copy(update={"grad": grad})
            for name in sorted(p.stem for p in R.TASKS.glob("*.py")):
                task = tasks.discover(R.TASKS, [name])[0]
                honest = task.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n"
                for size in ("small", "odd"):
                    bench = prepare(task, size, "cpu", settings)
                    try:
                        rows = [ratio(judge(bench, None, honest, settings)) for _ in range(args.runs)]
                    finally:
                        bench.close()
                    print(f"honest {'grad' if grad else 'fwd ':4} {name:14} {size:6} "
                          f"eager {bench.baselines.eager.median_ms:7.3f} ms  " + "  ".join(rows), flush=True)
        task = tasks.discover(R.TASKS, ["mse"])[0]
        forged = (R.REDTEAM / "forged_time_blocks.py").read_text()
        for size in args.cheat_sizes.split(","):
            bench = prepare(task, size, "cpu", R.SETTINGS)
            try:
                for cheat in CHEATS:
                    factor = cheat.split("-")[1] if "-" in cheat else None
                    text = forged.replace("FACTOR = 0.1\n", f"FACTOR = {factor}\n") if factor else None
                    rows = []
                    for _ in range(args.runs):
                        r = judge(bench, R.REDTEAM / cheat, text, R.SETTINGS)
                        rows.append(f"{ratio(r)} (est {r.wall_ms_per_call or 0:.3f}, real {R.real_ms(r) or 0:.3f})")
                    print(f"cheat  fwd  {cheat:26} {size:6} " + "  ".join(rows), flush=True)
            finally:
                bench.close()
    finally:
        for p in others:
            p.terminate()


if __name__ == "__main__":
    main()
