"""`kgen kernelbench-baselines`: kgen's stored eager and torch.compile baselines against KernelBench's
published timings for the same task files.

    kgen kernelbench-baselines ~/KernelBench                      # its results/timing/H100_Modal/
    kgen kernelbench-baselines ~/KernelBench/results/timing/H100_PCIe_LambdaLabs --json

KernelBench publishes, per GPU, baseline_time_torch.json (eager) and
baseline_time_torch_compile_inductor_default.json, each {"level1": {"19_ReLU.py": {"mean": ms, "std",
"min", "max", "num_trials", "hardware", "device"}, ...}, ...}: wall-clock times of 100 synced calls
after 3 warm-up calls on one input set (results/timing/README.md). kgen's own figure taken that way is
Baselines.eager_plain_ms (compiled_plain_ms), measured on a GPU beside the flushed, interleaved timing;
where a baseline lacks it (the cpu backend), its flushed median is compared instead, and the output
says which. Only baselines at the task's own size ("default") are compared: KernelBench timed its files
as written. The ratio is kgen's time over KernelBench's mean; its median, quartiles and range are given,
and every task off by more than the tolerance named.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import click

from ..records import Baselines
from .options import database_options, open_store

FILES = {"eager": "baseline_time_torch.json", "compile": "baseline_time_torch_compile_inductor_default.json"}
DEFAULT_HARDWARE = "H100_Modal"
MODES = (":grad", ":bfloat16", ":float16")  # baseline keys of other modes end so (bench.baseline_key)


class CompareError(ValueError):
    """Published timings that cannot be read; one line naming the file."""


def published_dir(path: Path) -> Path:
    """The folder of KernelBench's timing JSONs: `path` itself, or a checkout's results/timing/H100_Modal."""
    for folder in (path, path / "results" / "timing" / DEFAULT_HARDWARE):
        if any((folder / name).is_file() for name in FILES.values()):
            return folder
    raise CompareError(f"{path}: no {FILES['eager']} here nor in results/timing/{DEFAULT_HARDWARE}/ under it")


def load_published(folder: Path) -> dict[str, dict[str, tuple[int, float]]]:
    """Per kind (eager, compile), each task's (level, mean ms), by file stem."""
    out: dict[str, dict[str, tuple[int, float]]] = {}
    for kind, name in FILES.items():
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
            out[kind] = {Path(file).stem: (int(level.removeprefix("level")), float(entry["mean"]))
                         for level, files in data.items() for file, entry in files.items()}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CompareError(f"{path}: not KernelBench's timing format ({type(exc).__name__}: {exc})") from None
    return out


def stored_baselines(store) -> list[dict[str, Any]]:
    """The newest forward float32 baseline per task and device at the task's own size."""
    rows = store.db.query("SELECT key, task, size, device, torch_version, result_json, created_utc FROM baselines "
                          "WHERE size = 'default' ORDER BY created_utc")
    newest: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if not r["key"].endswith(MODES):
            newest[(r["task"], r["device"])] = r
    return list(newest.values())


def _ours(b: Baselines, kind: str) -> tuple[float | None, str]:
    plain = b.eager_plain_ms if kind == "eager" else b.compiled_plain_ms
    timing = b.eager if kind == "eager" else b.compiled
    if plain is not None:
        return plain, "plain"
    return (timing.median_ms, "median") if timing else (None, "")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    lo = int(at)
    return ordered[lo] + (ordered[min(lo + 1, len(ordered) - 1)] - ordered[lo]) * (at - lo)


def compare(store, published: dict[str, dict[str, tuple[int, float]]], tolerance: float = 0.10) -> list[dict[str, Any]]:
    """Per device and kind: every matched task (ours, theirs, ratio), the ratio's median, quartiles and
    range, and the tasks whose ratio is off 1 by more than `tolerance`; plus the stored tasks
    KernelBench has no time for."""
    by_device: dict[str, list[dict[str, Any]]] = {}
    for r in stored_baselines(store):
        by_device.setdefault(r["device"], []).append(r)
    out = []
    for device, rows in sorted(by_device.items()):
        for kind, theirs in published.items():
            matched, unknown = [], []
            for r in sorted(rows, key=lambda r: r["task"]):
                ours, measure = _ours(Baselines.model_validate_json(r["result_json"]), kind)
                if r["task"] not in theirs:
                    unknown.append(r["task"])
                elif ours is not None:
                    level, ms = theirs[r["task"]]
                    matched.append({"task": r["task"], "level": level, "kgen_ms": ours, "kernelbench_ms": ms,
                                    "ratio": ours / ms, "measure": measure, "torch_version": r["torch_version"]})
            ratios = [m["ratio"] for m in matched]
            out.append({"device": device, "kind": kind, "tasks": len(matched), "unknown": unknown,
                        "measures": sorted({m["measure"] for m in matched}),
                        "median_ratio": statistics.median(ratios) if ratios else None,
                        "p25_ratio": _quantile(ratios, 0.25) if ratios else None,
                        "p75_ratio": _quantile(ratios, 0.75) if ratios else None,
                        "min_ratio": min(ratios, default=None), "max_ratio": max(ratios, default=None),
                        "off": [m for m in matched if abs(m["ratio"] - 1) > tolerance], "matched": matched})
    return out


def _lines(groups: list[dict[str, Any]], tolerance: float) -> list[str]:
    lines = []
    for g in groups:
        head = f"{g['device']}, {'torch.compile' if g['kind'] == 'compile' else 'eager'}: {g['tasks']} tasks"
        if not g["tasks"]:
            lines.append(head + " matched")
            continue
        measure = " and ".join(g["measures"])
        lines.append(f"{head}, kgen/KernelBench median {g['median_ratio']:.3f} (quartiles {g['p25_ratio']:.3f}-"
                     f"{g['p75_ratio']:.3f}, range {g['min_ratio']:.3f}-{g['max_ratio']:.3f}; kgen's {measure} time)")
        lines.append(f"  off by more than {tolerance:.0%}: {len(g['off'])}")
        for m in g["off"]:
            lines.append(f"    level {m['level']} {m['task']}: kgen {m['kgen_ms']:.4g} ms, KernelBench "
                         f"{m['kernelbench_ms']:.4g} ms ({m['ratio']:.2f}x)")
        if g["unknown"]:
            lines.append(f"  not in KernelBench's file: {', '.join(g['unknown'])}")
    return lines


@click.command(name="kernelbench-baselines")
@click.argument("published", type=click.Path(exists=True, file_okay=False))
@database_options
@click.option("--tolerance", type=click.FloatRange(min=0), default=0.10, show_default=True,
              help="Name every task whose ratio is off 1 by more than this.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per device and kind, every task in it.")
def kernelbench_baselines(published: str, db: str, tolerance: float, as_json: bool) -> None:
    """Stored eager and torch.compile baselines against KernelBench's published timings.

    PUBLISHED is a KernelBench checkout (its results/timing/H100_Modal/ is read) or a folder holding
    baseline_time_torch.json and baseline_time_torch_compile_inductor_default.json. Baselines at the
    tasks' own size are compared, by file name: the ratio is kgen's time over KernelBench's mean (its
    synced back-to-back calls; kgen's time taken the same way where stored, else its median)."""
    try:
        times = load_published(published_dir(Path(published)))
    except CompareError as exc:
        raise click.ClickException(str(exc)) from None
    with open_store(db) as store:
        groups = compare(store, times, tolerance)
    if as_json:
        for g in groups:
            click.echo(json.dumps(g))
    elif not groups:
        click.echo(f"{db} holds no baseline at a task's own size (run KernelBench tasks with size: default)")
    else:
        click.echo("\n".join(_lines(groups, tolerance)))
