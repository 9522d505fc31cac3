"""Which stored attempts count as verified, and how the best of them are chosen.

    rows = store.attempts(verdict="correct")
    board = best_rows(rows)            # fastest verified attempt per task, backend, device and size
    ranked = sorted(filter(is_verified, rows), key=rank_key)   # what the library replays first

Shared by `kgen best`, the report and the kernel library, so that "best" means one thing.
"""

from __future__ import annotations

from typing import Any, Iterable

# Times are only comparable on the same device at the same size: a kernel timed at "small" is
# not faster than one timed at "default" because its number is lower.
GROUP = ("task", "backend", "device", "size", "grad", "dtype")  # forward plus backward is another number


def is_verified(row: dict[str, Any]) -> bool:
    """Correct, with no flag (no_custom_kernel, shape_specialized), timed on a device fit to time,
    with code on disk, and judged by a confined child (trusted is 1; NULL rows predate the sealed judge).

    A flag marks a result we do not vouch for as a kernel, so it is never "best".
    """
    return (row.get("verdict") == "correct" and not row.get("flags") and row.get("time_ms") is not None
            and bool(row.get("code_hash")) and row.get("trusted") == 1 and not row.get("device_unfit"))


def best_rows(rows: Iterable[dict[str, Any]], group: tuple[str, ...] = GROUP) -> list[dict[str, Any]]:
    """The verified attempt with the lowest time_ms in each group, sorted by the group's values.

    Ties go to the earlier attempt (smaller id), so the answer does not depend on row order.
    """
    best: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        if not is_verified(row):
            continue
        key = tuple(row.get(k) for k in group)
        held = best.get(key)
        if held is None or (row["time_ms"], row["id"]) < (held["time_ms"], held["id"]):
            best[key] = row
    return [best[k] for k in sorted(best, key=lambda k: tuple("" if v is None else str(v) for v in k))]


def rank_key(row: dict[str, Any]) -> tuple:
    """Order for choosing one kernel among verified ones that may differ in size or CPU model.

    Within one size and device the eager baseline is shared, so the highest speedup is the lowest
    time; across sizes the speedup over eager is the only comparable number.
    """
    speedup = row.get("speedup_eager")
    return (-(speedup if speedup is not None else 0.0), row["time_ms"], row["id"])
