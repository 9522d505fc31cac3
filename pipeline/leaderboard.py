"""Which stored attempts count as verified, and which of them is "best": kgen's one rule.

    rows = store.attempts(verdict="correct")
    board = best_rows(rows)            # the best verified attempt per task, backend, device, size, dtype, mode
    ranked = sorted(filter(is_verified, rows), key=rank_key)   # best first (rank_key: the definition)
    faster(row["time_ms"], p75_ms, row["eager_ms"])            # verified faster than eager?

Shared by `kgen best`, the run summary, the report, `kgen export --best` and the kernel library, so
that "best", "verified" and "faster" each mean one thing (rank_key says what "best" means).
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


def rank_key(row: dict[str, Any]) -> tuple:
    """Best first: kgen's one definition of the best kernel, used by `kgen best`, the run summary,
    the report, `kgen export --best` and the library.

    The best kernel for a task is its verified attempt (is_verified: correct, no flag, judged by a
    confined child, timed on a fit device) with the highest speedup over eager, the ratio of eager's
    median time to the kernel's measured side by side in the same evaluation, among attempts of the
    same backend, device, size, dtype and mode; ties go to the lower median time, then the earlier
    attempt id.

    Why the ratio and not the lowest time: two attempts' times come from two evaluations that may
    have run under different load (on a busy box eager's own time moves severalfold between runs),
    while a ratio's two sides were timed interleaved, in one evaluation. Across sizes or devices the
    ratio is also the only comparable number, which the library and the export need. They take the
    best kernel that is also verified faster than eager (`faster`) with its files intact.
    """
    speedup = row.get("speedup_eager")
    return (-(speedup if speedup is not None else 0.0), row["time_ms"], row["id"])


def best_rows(rows: Iterable[dict[str, Any]], group: tuple[str, ...] = GROUP) -> list[dict[str, Any]]:
    """The best verified attempt (rank_key) in each group, sorted by the group's values."""
    best: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        if not is_verified(row):
            continue
        key = tuple(row.get(k) for k in group)
        held = best.get(key)
        if held is None or rank_key(row) < rank_key(held):
            best[key] = row
    return [best[k] for k in sorted(best, key=lambda k: tuple("" if v is None else str(v) for v in k))]


# "Faster", the library's and the export's one rule. The evaluator times a kernel and its baselines
# in interleaved blocks of calls and keeps, for each, the median and quartiles of the block means
# (records.Timing). A median ratio a little above 1 can be the machine's noise, so:
#
#   A kernel is FASTER than a baseline when its 75th-percentile block time is below the baseline's
#   median (p75_ms < base_ms): three quarters of its timed blocks beat the baseline's typical block.
#
# Where a record has no quartile (a manifest written before this rule), its median speedup must be
# at least MEDIAN_ONLY_SPEEDUP instead. The baseline is eager for every caller; torch.compile's is the
# second bar when the caller itself is compiled (torch.compile tracing the library's module). A
# kernel not faster than eager is never loaded nor exported; one faster than eager but not than
# torch.compile runs in eager calls only. A task whose reference did not compile has no compile
# time: the eager verdict then stands for compiled callers too (library.selection).
MEDIAN_ONLY_SPEEDUP = 1.1


def faster(time_ms: float | None, p75_ms: float | None, base_ms: float | None) -> bool | None:
    """The rule above; None when there is no baseline time to compare with."""
    if time_ms is None or base_ms is None or time_ms <= 0:
        return None
    if p75_ms is None:
        return base_ms / time_ms >= MEDIAN_ONLY_SPEEDUP
    return p75_ms < base_ms


def not_faster_reason(code_hash: str, device: str, baseline: str, time_ms: float, p75_ms: float | None,
                      base_ms: float | None) -> str:
    """One line saying why `faster` said no (or could not say), for warnings, describe() and export."""
    if base_ms is None:
        return f"kernel {code_hash} has no {baseline} time on {device} to compare with"
    head = f"kernel {code_hash} verified {base_ms / time_ms:.2f}x {baseline} on {device}"
    if base_ms <= time_ms:
        return f"{head}: slower than {baseline}"
    if p75_ms is None:
        return f"{head}: under the {MEDIAN_ONLY_SPEEDUP}x a median-only record needs to count as faster"
    return (f"{head}, within its timing spread (p75 {p75_ms:.3g} ms, {baseline} median {base_ms:.3g} ms): "
            f"not reliably faster than {baseline}")


def p75_of(store, ids: Iterable[str]) -> dict[str, float | None]:
    """The kernel's 75th-percentile time per attempt id, from result_json (Store.attempts() hides it)."""
    from .records import EvalResult

    ids = list(ids)
    out: dict[str, float | None] = {}
    for start in range(0, len(ids), 500):  # SQLite's bound-parameter limit
        chunk = ids[start:start + 500]
        sql = f"SELECT id, result_json FROM attempts WHERE id IN ({', '.join('?' * len(chunk))})"
        for row in store.db.query(sql, chunk):
            timing = EvalResult.model_validate_json(row["result_json"]).timing
            out[row["id"]] = timing.p75_ms if timing else None
    return out


# Why a correct attempt is not verified, by kind: what it means and what to run about it. The kinds
# are is_verified's conditions; the first that applies is the one given.
NOT_VERIFIED = {
    "flagged": ("flagged, not counted as kernels", "`kgen show ID` says why"),
    "untrusted": ("judged by a child confined below what the config requires",
                  "`kgen doctor` says what this machine lacks"),
    "unfit": ("timed on a device unfit to time them, so they carry no figure",
              "the same `kgen run` again on a quiet machine re-times them"),
    "no code": ("stored without their code", ""),
    "not timed": ("stored without a time", ""),
}


def not_verified_reason(row: dict[str, Any]) -> str | None:
    """Why a correct attempt is not verified, one short phrase: "flagged: no_custom_kernel",
    "untrusted: <why>", "unfit: <why>", "no code" or "not timed"; None where the attempt is verified
    or is not correct. `row` is an attempt row (Store.attempts: flags a list, untrusted_reason read
    from the result) or the same fields of an EvalResult (result_fields)."""
    if row.get("verdict") != "correct" or is_verified(row):
        return None
    flags = row.get("flags")
    if flags:
        return "flagged: " + (flags if isinstance(flags, str) else ",".join(flags))
    if row.get("trusted") != 1:
        why = row.get("untrusted_reason") or ("judged before the sealed judge" if row.get("trusted") is None
                                              else "confined below what the config requires")
        return f"untrusted: {why}"
    if row.get("device_unfit"):
        return f"unfit: {row['device_unfit']}"
    if not row.get("code_hash"):
        return "no code"
    return "not timed"


def result_fields(result) -> dict[str, Any]:
    """The fields not_verified_reason reads, from an EvalResult (a verdict not yet stored)."""
    return {"verdict": result.verdict.value, "flags": [f.value for f in result.flags], "time_ms": result.time_ms,
            "code_hash": "-", "trusted": int(result.trusted), "untrusted_reason": result.untrusted_reason,
            "device_unfit": result.device_unfit}


def none_verified(rows: Iterable[dict[str, Any]]) -> str:
    """One line saying why correct attempts among `rows` are not verified: how many are correct, how
    many of those are not verified and why (counted by kind, with the first reason of each), and what
    to run. Meant for where none is verified; where some are, it counts the others."""
    rows = list(rows)
    correct = [r for r in rows if r.get("verdict") == "correct"]
    if not rows:
        return "no attempts"
    if not correct:
        return (f"none of the {len(rows)} attempt{'s' if len(rows) != 1 else ''} is correct "
                "(`kgen attempts` lists their verdicts and errors)")
    kinds: dict[str, list[str]] = {}
    for r in correct:
        why = not_verified_reason(r)
        if why:
            kind, _, detail = why.partition(": ")
            kinds.setdefault(kind, []).append(detail)
    parts = []
    for kind, details in kinds.items():
        if kind == "flagged":  # each flag, once
            detail = ", ".join(sorted({f for d in details for f in d.split(",") if f}))
        else:
            detail = next((f"first: {d}" for d in details if d), "")
        were = "was" if len(details) == 1 else "were"
        what, todo = NOT_VERIFIED[kind]
        parts.append(f"{len(details)} {were} {what}" + (f" ({detail})" if detail else "") + (f": {todo}" if todo else ""))
    n, left = len(correct), sum(len(d) for d in kinds.values())
    if not left:
        return f"{n} correct attempt{'s' if n != 1 else ''}, all verified"
    head = (f"{n} correct attempt{'s' if n != 1 else ''}, none verified" if left == n
            else f"{left} of {n} correct attempts not verified")
    return head + ": " + "; ".join(parts)
