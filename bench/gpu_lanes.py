"""Passes of one batch (examples/config-batch.yaml) on one GPU and on two, local and Ray (issue 17): per pass,
attempts per hour and each GPU's busy fraction; then every pass against the first, attempt by
attempt (the same completions): verdicts that differ, and how far the kernel's time moved.

    python bench/gpu_lanes.py DB OUT LABEL...

The passes are the DB's runs in start order, named by LABEL; OUT/util-LABEL.csv holds nvidia-smi's
samples for that pass (timestamp, index, utilization.gpu; every 0.5 s).
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from pipeline.store.store import Store


def busy(path: Path) -> dict[str, float]:
    """Share of samples in which each GPU showed any utilisation."""
    seen: dict[str, list[int]] = defaultdict(list)
    if path.exists():
        for row in csv.reader(path.open()):
            if len(row) >= 3 and row[2].strip().isdigit():
                seen[row[1].strip()].append(int(row[2]) > 0)
    return {gpu: sum(v) / len(v) for gpu, v in sorted(seen.items()) if v}


def seconds(run: dict) -> float:
    start = datetime.fromisoformat(run["started_utc"])
    end = datetime.fromisoformat(run["finished_utc"]) if run["finished_utc"] else start
    return (end - start).total_seconds()


def main(db: str, out: str, labels: list[str]) -> None:
    store = Store.open(db)
    runs = sorted(store.db["runs"].rows, key=lambda r: r["started_utc"])[-len(labels):]
    passes = {}
    print(f"{'pass':<10}{'attempts':>9}{'correct':>8}{'wall s':>8}{'per hour':>9}  busy by GPU")
    for label, run in zip(labels, runs):
        rows = store.attempts(run=run["id"])
        passes[label] = {(r["task"], r["sample"]): r for r in rows}
        wall = seconds(run)
        gpus = busy(Path(out) / f"util-{label}.csv")
        print(f"{label:<10}{len(rows):>9}{sum(r['verdict'] == 'correct' for r in rows):>8}{wall:>8.0f}"
              f"{len(rows) / wall * 3600 if wall else 0:>9.0f}  "
              + ", ".join(f"GPU {g} {f:.0%}" for g, f in gpus.items()))
    base_label, base = next(iter(passes.items()))
    for label, other in list(passes.items())[1:]:
        differ = [k for k in base if k in other and base[k]["verdict"] != other[k]["verdict"]]
        moved = [other[k]["time_ms"] / base[k]["time_ms"] - 1 for k in base
                 if k in other and base[k]["time_ms"] and other[k]["time_ms"]]
        eager = [other[k]["eager_ms"] / base[k]["eager_ms"] - 1 for k in base
                 if k in other and base[k]["eager_ms"] and other[k]["eager_ms"]]
        unfit = sum(1 for r in other.values() if r.get("device_unfit"))
        print(f"LANES {label} vs {base_label}: {len(differ)} verdicts differ {differ[:4]}; kernel time "
              f"median {statistics.median(moved) if moved else float('nan'):+.2%}, widest "
              f"{max(moved, key=abs) if moved else float('nan'):+.2%} over {len(moved)}; eager median "
              f"{statistics.median(eager) if eager else float('nan'):+.2%}; {unfit} marked unfit")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
