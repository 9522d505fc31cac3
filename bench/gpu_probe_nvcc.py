"""Where a CUDA build's seconds go (issue 14; a one-off probe, docs/benchmarks.md): build one demo
completion through pipeline.build (fast headers), then re-run its two compile commands from the
ninja file by hand, timed, and nvcc once more with --time (per phase: cudafe++, cicc, ptxas, the
host compiler), with the fast include folder and without it.

    python3 bench/gpu_probe_nvcc.py"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.build import build
from pipeline.generate import extract  # noqa: E402


def main() -> int:
    entry = next(json.loads(line) for line in Path("fixtures/replay/demo.jsonl").read_text().splitlines()
                 if json.loads(line)["backend"] == "cuda")
    code = extract.extract(entry["text"]).code
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "c.py").write_text(code)
        options = build.BuildOptions(900, 16, build.build_env(["0"]), cuda=True)
        result = build.build(root / "c.py", "probe", root / "b", options)
        print("PROBE build", result.ok, result.headers, f"{result.seconds:.1f} s")
        ninja = next((root / "b" / "probe").rglob("build.ninja"))
        text = ninja.read_text()
        var = dict(re.findall(r"^(\w+) = (.*)$", text, re.M))
        where = ninja.parent
        fast_inc = [f for f in shlex.split(var["cuda_cflags"]) if f.startswith("-I") and "headers" in f]
        for label, drop in (("fast", []), ("plain", fast_inc)):
            cuda = [f for f in shlex.split(var["cuda_cflags"]) if f not in drop]
            post = shlex.split(var.get("cuda_post_cflags", ""))
            cmd = [var.get("nvcc", "nvcc"), *cuda, "-c", str(where / "cuda.cu"), "-o", str(root / f"{label}.o"), *post]
            t = time.monotonic()
            subprocess.run(cmd, check=True, capture_output=True)
            print(f"PROBE nvcc {label}: {time.monotonic() - t:.1f} s")
            csv = root / f"{label}.csv"
            subprocess.run(cmd + ["--time", str(csv)], check=True, capture_output=True)
            print(f"PROBE phases {label}:\n" + csv.read_text())
            cxx = [var.get("cxx", "c++"), *[f for f in shlex.split(var["cflags"]) if f not in drop],
                   "-c", str(where / "main.cpp"), "-o", str(root / f"{label}-main.o"), *shlex.split(var.get("post_cflags", ""))]
            t = time.monotonic()
            subprocess.run(cxx, check=True, capture_output=True)
            print(f"PROBE g++ main.cpp {label}: {time.monotonic() - t:.1f} s")
        print("PROBE cuda_cflags:", var["cuda_cflags"][:600])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
