"""Probe: the cpu judge, again and again, on one candidate: idle or beside two busy loops.

    python bench/cpu_judge_probe.py CANDIDATE [--runs 10] [--load none|spin] [--grad] [--task mse] [--size small]

CANDIDATE: a file under tests/redteam (honest_fast_mse.py, honest_cpp.py, omp_all_cores.py, ...), or
`clock-F`: tests/redteam/clock_instance_patch.py claiming F of each call's real time (its memo has no
gradient), or `forge-F`: tests/redteam/forged_time_blocks.py at FACTOR F (torch's mse, gradient mode too). mse at the
tests' "small" size, the red team's settings. Each line: the verdict, the recorded and the claimed
(less what load took) times against the parent's estimate, the speedup over eager, whether it was
judged twice (`*`), and the run-queue wait the parent saw. Its latest figures: docs/validation.md.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import test_redteam as R  # noqa: E402
from forgers import forged_clock  # noqa: E402

from pipeline.build import build
from pipeline.child import tasks  # noqa: E402
from pipeline.judge import evaluate  # noqa: E402
from pipeline.judge.bench import prepare


def spin(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("candidate")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--load", choices=["none", "spin"], default="none")
    ap.add_argument("--grad", action="store_true", help="gradient mode: forward plus backward")
    ap.add_argument("--task", default="mse", help="a bundled task, or one of tests/tasks (the forge-F and clock-F "
                    "candidates are mse's; forge-F on big_add adds instead)")
    ap.add_argument("--size", default="small", help="the task's size preset, or 'default' for its own globals")
    args = ap.parse_args()
    settings = R.SETTINGS.model_copy(update={"grad": args.grad})
    work = Path(tempfile.mkdtemp(prefix="kgen-probe-"))
    if args.candidate.startswith("forge-"):  # forged_time_blocks.py at FACTOR F: plain torch mse, so gradient mode too
        code = work / "forge.py"
        add = "def forward(self, a, b):\n        return a + b" if args.task == "big_add" else None
        code.write_text(forged_clock(float(args.candidate[6:]), add))
        build_dir = work / "build"
        build_dir.mkdir()
    elif args.candidate.startswith("clock-"):
        code = work / "clock.py"
        code.write_text((R.REDTEAM / "clock_instance_patch.py").read_text().replace(
            "return ms * 0.3, out", f"return ms * {float(args.candidate[6:])}, out"))
        build_dir = work / "build"
        build_dir.mkdir()
    else:
        code = R.REDTEAM / args.candidate
        result = build.build(code, hashlib.sha256(code.read_bytes()).hexdigest()[:16], work / "builds",
                             build.BuildOptions(timeout_s=600))
        assert result.ok, result.log[-2000:]
        build_dir = Path(result.build_dir)
    others = [multiprocessing.Process(target=spin, args=(7200,), daemon=True)
              for _ in range(2 if args.load == "spin" else 0)]
    for p in others:
        p.start()
    folder = R.TASKS if (R.TASKS / f"{args.task}.py").exists() else R.TEST_TASKS
    task = tasks.discover(folder, [args.task])[0]
    bench = prepare(task, args.size, "cpu", settings)
    print(f"{args.candidate} task={args.task} load={args.load} grad={args.grad} loadavg={os.getloadavg()[0]:.2f} "
          f"floor={bench.baselines.floor_ms:.4g} ms "
          f"({bench.baselines.bandwidth_gbs:.0f} GB/s) eager={bench.baselines.eager.median_ms:.4g} ms", flush=True)
    verdicts = []
    try:
        for i in range(args.runs):
            r = evaluate.evaluate(bench, code, build_dir, settings)
            verdicts.append(r.verdict.value)
            real = R.real_ms(r)
            est = r.wall_ms_per_call
            ratio = f"{r.time_ms / est:.2f}" if r.time_ms and est else "-"
            speed = f"{r.eager_ratio.median:.2f}x" if r.eager_ratio else "-"
            print(f"{i:2d} {r.verdict.value:17s}{'*' if r.outcome.earlier else ' '} time {r.time_ms} est {est} "
                  f"time/est {ratio} eager {speed} real {real} loadavg {os.getloadavg()[0]:.2f}"
                  f"{' trusted' if r.trusted else ' UNTRUSTED'}{' unfit: ' + r.device_unfit[:90] if r.device_unfit else ''}"
                  f"{' | ' + (r.error or '')[:160] if r.verdict.value != 'correct' else ''}", flush=True)
    finally:
        bench.close()
        for p in others:
            p.terminate()
    print("verdicts:", {v: verdicts.count(v) for v in set(verdicts)})


if __name__ == "__main__":
    main()
