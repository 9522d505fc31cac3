"""Build seconds per candidate, one at a time and eight at once, by mode:
`light` (kgen's route: the .cu against the light ATen header, nvcc's host and device steps side by
side, main.cpp against the precompiled torch headers, each build's child started ahead with torch
imported while the one before builds), `light-cold` (the same, each child started when its build
does), `light-serial` (cold, and nvcc's steps one after another as nvcc runs them), `fast` (the
precompiled headers, the .cu against torch/types.h) and `plain` (the candidate's `load_inline` as written). Candidates: the demo's CUDA completions
(fixtures/replay/demo.jsonl) and any completions in --seeds DIR (*.txt), each extracted by kgen's own
extractor.

    python3 bench/gpu_builds.py [--seeds .seeds] [--modes light,fast,plain] [--alone light=99,fast=3,plain=0]

Every build runs in its own fresh folder through pipeline.build, as a batch runs it (no GPU visible,
the lanes' architecture named, MAX_JOBS = cores / concurrent builds)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.build import build, headers
from pipeline.generate import extract  # noqa: E402


def candidates(seeds: Path | None) -> list[tuple[str, str]]:
    found = []
    for n, line in enumerate(Path("fixtures/replay/demo.jsonl").read_text().splitlines()):
        entry = json.loads(line)
        if entry["backend"] == "cuda":
            found.append((f"demo-{entry['task']}-{n}", entry["text"]))
    for path in sorted(seeds.glob("*.txt")) if seeds else []:
        found.append((f"seed-{path.stem[:3]}", path.read_text()))
    out = []
    for name, text in found:
        got = extract.extract(text)
        if got.code:
            out.append((name, got.code))
        else:
            print(f"SKIP {name}: {got.error}")
    return out


def run(label: str, group: list[tuple[str, str]], mode: str, at_once: int, root: Path) -> list[dict]:
    env = build.build_env(["0"])
    jobs = max(1, (os.cpu_count() or 1) // at_once)
    # As a batch or a search builds: the next build's child starts, torch imported, while one builds.
    # Not in a mode that ends in -cold or -serial (the builds before spares).
    spares = build.BuildSpares(at_once) if not mode.endswith(("-cold", "-serial")) else None
    if spares:
        spares.fill(env, wait=True)  # as in a batch under way; the lone builds' next ones start as each builds

    def one(item):
        name, code = item
        where = root / f"{label}-{name}"
        where.mkdir(parents=True)
        path = where / "candidate.py"
        path.write_text(code)
        result = build.build(path, "h" + name.replace("-", "_"), where / "builds",
                             build.BuildOptions(900, jobs, env, fast=mode != "plain", cuda=True,
                                                light=mode.startswith("light"), split=mode != "light-serial", reuse=False),
                             notice=print, spares=spares)
        row = dict(label=label, name=name, mode=mode, at_once=at_once, seconds=round(result.seconds, 1),
                   ok=result.ok, headers=result.headers,
                   # The build child's own line in its log (pipeline/build/nvcc_split.py): a note, not a measurement of ours.
                   nvcc=[ln.split("steps ", 1)[1] for ln in result.log.splitlines() if ln.startswith("[kgen-nvcc]")])
        print("BUILD", json.dumps(row), flush=True)
        if not result.ok:
            print("  ", build.failure_line(result)[:200], flush=True)
        elif result.headers != mode.split("-")[0]:  # fell back: the note says why the faster route failed
            print("  ", [ln for ln in result.log.splitlines() if ln.startswith(build.FELL_BACK)][-1:], flush=True)
        return row

    try:
        with ThreadPoolExecutor(at_once) as pool:
            return list(pool.map(one, group))
    finally:
        if spares:
            spares.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=Path, default=None)
    parser.add_argument("--modes", default="light,fast,plain")
    parser.add_argument("--alone", default="light=99,fast=3,plain=0",
                        help="how many candidates each mode builds one at a time, as mode=n,...")
    parser.add_argument("--at-once", type=int, default=8)
    args = parser.parse_args()
    alone_n = {mode: int(n) for mode, n in (part.split("=") for part in args.alone.split(","))}
    group = candidates(args.seeds)
    print(f"{len(group)} candidates; {os.cpu_count()} cores")
    started = time.monotonic()
    folder = headers.ensure(True, print)
    print(f"PCH ready in {time.monotonic() - started:.1f} s: {folder}")
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("KGEN_BUILD_BENCH_DIR")) as scratch:
        root = Path(scratch)
        for mode in args.modes.split(","):
            alone = alone_n.get(mode, 0)
            # Seeds first among the lone builds when only a few are asked for: they are the ones named.
            order = sorted(group, key=lambda item: not item[0].startswith("seed"))
            if args.at_once:
                rows += run(f"{mode}-x{args.at_once}", group[:args.at_once], mode, args.at_once, root)
            if alone:
                rows += run(f"{mode}-alone", order[:alone], mode, 1, root)
    print(f"\n{'builds':<14} {'n':>3} {'ok':>3} {'median s':>9} {'min':>6} {'max':>6}")
    for label in dict.fromkeys(r["label"] for r in rows):
        secs = [r["seconds"] for r in rows if r["label"] == label]
        oks = sum(r["ok"] for r in rows if r["label"] == label)
        print(f"{label:<14} {len(secs):>3} {oks:>3} {statistics.median(secs):>9.1f} {min(secs):>6.1f} {max(secs):>6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
