"""Two trees side by side on one machine: the honest CUDA mse of tests/test_gpu.py (or, on the cpu,
tests/redteam/honest_fast_mse.py) judged ROUNDS times in each of two processes per tree, the trees
taking turns, so that both see the same machine. One line a judgement: tree, verdict, x eager, the
room's start-up seconds.

    python bench/tree_ab.py OLD_ROOT NEW_ROOT [--rounds 3] [--device cuda|cpu]

OLD_ROOT and NEW_ROOT are checkouts (e.g. `git worktree add /tmp/old <commit>`); each judges with its
own pipeline/ and tests/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ONE = r"""
import json, sys, tempfile, hashlib
from pathlib import Path
root, device, rounds = Path(sys.argv[1]).resolve(), sys.argv[2], int(sys.argv[3])
sys.path[:0] = [str(root), str(root / "tests")]
from pipeline.build import build
from pipeline.child import tasks
from pipeline.config import EvalConfig
from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
tmp = Path(tempfile.mkdtemp(prefix="kgen-ab-"))
if device == "cuda":
    import test_gpu as G
    code = G.CANDIDATE.format(kernels=G.KERNELS, mode=0, body=G.CALL)
    settings, size, options = G.SETTINGS, "small", build.BuildOptions(600, 4, cuda=True)
else:
    code = (root / "tests" / "redteam" / "honest_fast_mse.py").read_text()
    settings = EvalConfig(compile_baseline=False, trials=5, timed_calls=10, timed_ms=0, warmup_calls=2, timeout_s=60)
    size, options = "small", build.BuildOptions(600, 2)
path = tmp / "candidate.py"
path.write_text(code)
digest = hashlib.sha256(code.encode()).hexdigest()[:16]
built = build.build(path, digest, tmp / "builds", options)
assert built.ok, built.log[-2000:]
bench = prepare(tasks.discover(root / "reference_tasks", ["mse"])[0], size, device, settings)
for _ in range(rounds):
    r = evaluate.evaluate(bench, path, Path(built.build_dir), settings)
    print("AB " + json.dumps({"verdict": r.verdict.value, "x_eager": r.speedup_eager, "unfit": r.device_unfit,
                              "time_ms": r.time_ms, "eager_beside_ms": r.eager_beside.median_ms if r.eager_beside else None,
                              "startup_s": r.phases.get("startup"), "child_s": r.phases.get("child")}), flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    seen: dict[str, list[float]] = {"old": [], "new": []}
    for name in ("old", "new", "old", "new"):
        root = str(Path(getattr(args, name)).resolve())  # the command runs from the temp folder
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run([sys.executable, "-c", ONE, root, args.device, str(args.rounds)], env=env,
                             capture_output=True, text=True, cwd=tempfile.gettempdir())
        for line in out.stdout.splitlines():
            if line.startswith("AB "):
                row = json.loads(line[3:])
                print(f"TREE {name} {row}", flush=True)
                if row["x_eager"] is not None:
                    seen[name].append(row["x_eager"])
        if out.returncode:
            print(f"TREE {name} failed: {out.stderr[-1500:]}", flush=True)
    for name, xs in seen.items():
        if xs:
            print(f"SUMMARY {name}: x eager median {statistics.median(xs):.3f} over {len(xs)} ({min(xs):.3f}-{max(xs):.3f})")
    if seen["old"] and seen["new"]:
        print(f"SUMMARY new/old median ratio {statistics.median(seen['new']) / statistics.median(seen['old']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
