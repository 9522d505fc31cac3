"""nvcc on candidates' .cu files against kgen's light ATen header and against torch/types.h (issue 14;
a one-off probe, docs/benchmarks.md): seconds each, whether each builds, and whether the two objects
hold the same device code (the .nv_fatbin section, byte for byte) and the same exported host symbols.

    python3 bench/probe_light_nvcc.py [--seeds ../shared/seeds] [--stubs DIR] [--arch 9.0]

Sources: the first CUDA completion of each task in fixtures/replay/demo.jsonl, and each seed file
given. One nvcc at a time. On a machine whose torch is the CPU build (no GPU needed: nvcc only
compiles), torch's CUDA headers miss cuda_cmake_macros.h and the cuBLAS/cuSPARSE/cuSOLVER headers
that ATen/cuda/CUDAContext.h includes: `--stubs DIR` adds DIR to the include path (docs/benchmarks.md
says how that folder was made)."""

from __future__ import annotations

import argparse
import ast
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.generate import extract
from pipeline.build import headers  # noqa: E402


def sources(seeds: Path | None) -> dict[str, str]:
    texts = {}
    for line in Path("fixtures/replay/demo.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["backend"] == "cuda" and f"demo-{entry.get('task')}" not in texts:
            texts[f"demo-{entry.get('task')}"] = entry["text"]
    for path in sorted(seeds.glob("0*.txt")) if seeds else []:
        texts[path.stem[:8]] = path.read_text()
    out = {}
    for name, text in texts.items():
        code = extract.extract(text).code
        cu = [n.value for n in ast.walk(ast.parse(code))
              if isinstance(n, ast.Constant) and isinstance(n.value, str) and "__global__" in n.value]
        if cu:
            out[name] = cu[0]
    return out


# What load_inline writes above a cuda_sources text (torch.utils.cpp_extension.load_inline): the
# first version of this probe left it out, and so missed that torch/types.h came in anyway.
LOAD_INLINE_PREFIX = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"


def nvcc_flags(arch: str) -> tuple[str, list[str]]:
    """nvcc and the flags load_inline gives a .cu here."""
    from torch.utils import cpp_extension as ce

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", arch)
    if ce.CUDA_HOME is None:  # a CPU build of torch finds no CUDA of its own
        ce.CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    lines = headers.ninja_variables(True, "k.cu")
    return lines.get("nvcc", "nvcc"), shlex.split(lines["cuda_cflags"] + " " + lines.get("cuda_post_cflags", ""))


def section(obj: Path, name: str) -> bytes:
    out = obj.with_suffix(f".{name.strip('.')}")
    subprocess.run(["objcopy", "-O", "binary", f"--only-section={name}", str(obj), str(out)], check=True)
    return out.read_bytes()


def exported(obj: Path) -> list[str]:
    nm = subprocess.run(["nm", "-g", "--defined-only", str(obj)], capture_output=True, text=True, check=True)
    return sorted(parts[2] for parts in (line.split() for line in nm.stdout.splitlines()) if len(parts) == 3 and parts[1] == "T")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=Path, default=None)
    parser.add_argument("--stubs", type=Path, default=None)
    parser.add_argument("--arch", default="9.0")
    parser.add_argument("--only", default="", help="only the sources whose names contain this")
    args = parser.parse_args()
    nvcc, flags = nvcc_flags(args.arch)
    light = headers.light_header()
    if light is None:
        print("PROBE no light header for this torch")
        return 1
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        headers.write_shims(root / "inc", light)  # the folder a build reads, less its precompiled variants
        extra = [f"-I{root / 'inc'}", *(["-isystem", str(args.stubs)] if args.stubs else [])]
        for name, text in sources(args.seeds).items():
            if args.only not in name:
                continue
            cu = root / f"{name}.cu"
            cu.write_text(LOAD_INLINE_PREFIX + text)
            row = {"name": name}
            for label, define in (("light", ["-DKGEN_LIGHT_ATEN"]), ("fast", [])):
                obj = root / f"{name}-{label}.o"
                started = time.monotonic()
                done = subprocess.run([nvcc, *extra, *define, *flags, "-c", str(cu), "-o", str(obj)],
                                      capture_output=True, text=True)
                row[label] = round(time.monotonic() - started, 1)
                row[f"{label}_ok"] = done.returncode == 0
                if done.returncode:
                    lines = (done.stdout + done.stderr).splitlines()
                    row[f"{label}_error"] = next((ln.strip() for ln in lines if "error" in ln), lines[-1] if lines else "")[:160]
            if row["light_ok"] and row["fast_ok"]:
                row["same_device_code"] = section(root / f"{name}-light.o", ".nv_fatbin") == \
                    section(root / f"{name}-fast.o", ".nv_fatbin")
                row["same_exports"] = exported(root / f"{name}-light.o") == exported(root / f"{name}-fast.o")
            print("PROBE", json.dumps(row), flush=True)
            rows.append(row)
    both = [r for r in rows if r["light_ok"] and r["fast_ok"]]
    if both:
        print(f"PROBE built both ways: {len(both)} of {len(rows)}; light median {statistics.median(r['light'] for r in both)} s "
              f"({min(r['light'] for r in both)}-{max(r['light'] for r in both)}), torch/types.h median "
              f"{statistics.median(r['fast'] for r in both)} s ({min(r['fast'] for r in both)}-{max(r['fast'] for r in both)}); "
              f"same device code in {sum(r['same_device_code'] for r in both)}, same exports in {sum(r['same_exports'] for r in both)}")
    print(f"PROBE light failed where torch/types.h built: {[r['name'] for r in rows if r['fast_ok'] and not r['light_ok']]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
