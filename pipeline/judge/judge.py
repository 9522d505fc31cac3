"""The parent's comparison of output values against the float64 reference, which the session's
checks make (what is decided from an evaluation's measurements: pipeline.verdicts). Nothing here takes
the child's word: values are the outputs as the child wrote them into the outbox, compared element by
element with the reference's full float64 output.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np

from ..child.memfd import PACKED_DTYPES
from ..child.protocol import OutputHeader
from ..records import TrialResult, Verdict
from ..policy import POLICY


@dataclass(frozen=True)
class Expected:
    """The reference's output for one call: metadata, and its float64 values in a sealed memfd only the
    parent holds (refproto.sealed_memfd), fetched as the call is checked and closed once it has been; `fd`
    is None where only the metadata was asked for (an attempt's shapes, before its child starts)."""

    shape: list[int]
    numel: int
    ref_dtype: str
    fd: int | None
    fp32_rel_err: float | None = None
    parts: list | None = None
    """Gradient mode: [label, shape] of the output and of each gradient, in the order of the values."""
    rel_errs: list | None = None
    """PyTorch's own error in the run's dtype against float64, part by part."""
    dtypes: list | None = None
    """The dtype of each part from PyTorch in the run's dtype: what the candidate's must be."""
    own_errs: list | None = None
    """PyTorch's own reading in the run's dtype, part by part, in the judge's elementwise metric."""

    def values(self) -> np.ndarray:
        return mapped(self.fd, np.float64, self.numel)

    def layout(self) -> list[tuple[str, list[int], int]]:
        """(label, shape, numel) of each part the values hold one after another."""
        if not self.parts:
            return [("output", list(self.shape), self.numel)]
        return [(label, list(shape), int(np.prod(shape, dtype=np.int64))) for label, shape in self.parts]

    def errors(self) -> list[tuple[float | None, float | None]]:
        """Each part's (rel_err, own_err), in layout order: what its tolerance stands on."""
        n = len(self.layout())
        return list(zip(self.rel_errs or [self.fp32_rel_err] * n, self.own_errs or [None] * n))

    def tolerances(self, tol: float, dtype: str) -> list[float]:
        """Each part's relative tolerance in the run's dtype (tolerance_for), in layout order."""
        return [tolerance_for(tol, dtype, e, o) for e, o in self.errors()]


def mapped(fd: int, dtype=np.uint8, count: int = -1) -> np.ndarray:
    """A read-only view of a sealed memfd's values, no copy (an output may be gigabytes); the map
    lives as long as the view, the descriptor may be closed before."""
    size = os.fstat(fd).st_size
    if not size:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(mmap.mmap(fd, size, prot=mmap.PROT_READ), dtype=dtype, count=count)


def tolerance_for(tol: float, dtype: str, ref_err: float | None, own_err: float | None = None) -> float:
    """The relative tolerance for one part in the run's dtype. float32: the task's, widened to
    POLICY.ref_err_factor x `own_err` (PyTorch's own float32 error on these inputs, the judge's metric)
    where larger, at most POLICY.own_err_cap x the task's. bfloat16 and float16: from `ref_err` (PyTorch's
    own error in that dtype against float64), never below the dtype's epsilon. All against float64, so a
    reduction accumulated in the low dtype fails where PyTorch's, accumulated in float32, passes."""
    if dtype not in POLICY.dtype_eps:
        return min(max(tol, POLICY.ref_err_factor * (own_err or 0.0)), POLICY.own_err_cap * tol)
    return max(tol, POLICY.dtype_eps[dtype], POLICY.ref_err_factor * (ref_err or 0.0))


def fail(verdict: Verdict, error: str, **extra) -> TrialResult:
    return TrialResult(index=0, variant="", ok=False, verdict=verdict, error=error, **extra)


def compare(header: OutputHeader, values: np.ndarray | None, want: Expected, tol: float, device: str,
            dtype: str = "float32", stats: list | None = None) -> TrialResult:
    """Judge one output (the child's header, the parent's view of its values) against the reference; in
    gradient mode the output then every gradient, each against its own magnitude. `stats`: each part's (max
    |got - ref|, max |ref|, (excess, index, ref, got) of the value furthest past its bound or None), None for
    a part holding NaN or Inf, measured in the reference (refproto.Compare; `want` then holds no values)."""
    if (problem := header_problem(header, values, want, device)) is not None:
        return problem
    if stats is None:
        got_at = values.chunk if isinstance(values, Slot) else (lambda i, j: values[i:j])
        b = want.values()
    start, worst_part = 0, None
    for k, ((label, shape, n), part_tol) in enumerate(zip(want.layout(), want.tolerances(tol, dtype))):
        part = range(start, start + n)
        start += n
        wrong = Verdict.mismatch if label == "output" else Verdict.wrong_gradient
        where = "output" if label == "output" else label
        st = _part_stats(got_at, b, part, part_tol) if stats is None else stats[k]
        if st is None:
            return fail(Verdict.non_finite if label == "output" else wrong, f"{where} holds NaN or Inf")
        max_abs, max_mag, worst = st
        max_rel = max_abs / max(max_mag, 1e-30)
        if worst is not None:
            index = [int(x) for x in np.unravel_index(worst[1], tuple(shape))] if shape else []
            prefix = "" if label == "output" else f"{label}: "
            return fail(wrong, f"{prefix}max relative error {max_rel:.3g} exceeds tolerance {part_tol:g}",
                        max_abs_err=max_abs, max_rel_err=max_rel, worst_index=index,
                        expected=worst[2], got=worst[3])
        if worst_part is None or max_rel > worst_part[1]:
            worst_part = (max_abs, max_rel)
    max_abs, max_rel = worst_part or (0.0, 0.0)
    return TrialResult(index=0, variant="", ok=True, max_abs_err=max_abs, max_rel_err=max_rel)


def header_problem(header: OutputHeader, values, want: Expected, device: str) -> TrialResult | None:
    """What is wrong with an output before its values are compared: its type, device, shape and
    dtypes, or values that did not reach the parent whole; None where nothing is."""
    if not header.exact_tensor:
        return fail(Verdict.wrong_type, f"returned {header.type}, expected exactly torch.Tensor")
    if (header.device or "").split(":")[0] != device:
        return fail(Verdict.wrong_type, f"returned a tensor on {header.device}, expected {device}")
    if header.shape != want.shape:
        return fail(Verdict.wrong_shape, f"shape {tuple(header.shape or ())}, the reference returns {tuple(want.shape)}")
    if header.dtype != want.ref_dtype:
        return fail(Verdict.wrong_dtype, f"dtype {header.dtype}, the reference returns {want.ref_dtype}")
    layout = want.layout()
    if want.parts:
        shapes = [shape for _, shape, _ in layout[1:]]
        if header.grads is None or len(header.grads) != len(shapes):
            return fail(Verdict.missing_gradient, f"{len(header.grads or [])} gradients, the reference has {len(shapes)}")
        for (label, shape, _), got in zip(layout[1:], header.grads):
            if list(got) != shape:
                return fail(Verdict.wrong_gradient, f"the {label} has shape {tuple(got)}, the reference's {tuple(shape)}")
        packed, wanted = header.packed or [], want.dtypes or []
        for (label, _, _), got, dtype in zip(layout[1:], packed[1:], wanted[1:]):
            if got != dtype:
                return fail(Verdict.wrong_gradient, f"the {label} is {got}, the reference's {dtype}")
    if header.packed and header.packed[0] != header.dtype:
        return fail(Verdict.protocol_error, f"the output is said to be {header.dtype} but was written as {header.packed[0]}")
    if values is None or not header.written or values.size != want.numel:
        return fail(Verdict.mismatch, "the output's values did not reach the parent")
    return None


def _part_stats(got_at, b: np.ndarray, part: range, part_tol: float):
    """One part's stats as `compare` takes them, from the float64 values in `b` (outputs within
    POLICY.ahead_bytes; larger ones are compared in the reference, tensor_stats). Relative per element, the
    part's mean magnitude the absolute floor, so zeros never pass against a non-zero reference."""
    n = len(part)
    mean = _abs_sum(b, part.start, part.stop) / n if n else 0.0
    return _range_stats(got_at, b, part.start, part.stop, mean, part_tol)


def tensor_stats(got_parts: list, ref_parts: list, tols: list[float]) -> list:
    """`compare`'s stats in the reference process (refproto.Compare): each part of the candidate's output
    (1-D, in its written dtypes, anywhere) against its float64 part on the reference's device, by
    _chunk_stats's metric, so large float64 values never leave the device that computed them."""
    return [_tensor_part(got, ref.detach().reshape(-1), tol) for got, ref, tol in zip(got_parts, ref_parts, tols)]


def _tensor_part(got, ref, tol: float):
    import torch

    # On the cpu in cache-sized pieces, as own_error (docs/decisions/memory-and-outputs.md).
    n, step = ref.numel(), POLICY.compare_piece if ref.device.type == "cpu" else POLICY.compare_chunk
    mean = sum(float(ref[i:i + step].abs().sum()) for i in range(0, n, step)) / n if n else 0.0
    max_abs, max_mag, worst = 0.0, 0.0, None
    for i in range(0, n, step):
        # To the device as written (half a float64 copy's bytes for float32), widened there.
        g, r = got[i:i + step].to(ref.device).to(torch.float64), ref[i:i + step]
        if not bool(torch.isfinite(g).all()):
            return None
        diff = (g - r).abs_()
        bound = r.abs()
        max_abs, max_mag = max(max_abs, float(diff.max())), max(max_mag, float(bound.max()))
        bound.add_(mean).mul_(tol)
        if not bool((diff <= bound).all()):
            over = diff.sub_(bound)
            k = int(over.argmax())
            if worst is None or not float(over[k]) <= worst[0]:
                worst = (float(over[k]), i + k, float(r[k]), float(g[k]))
    return max_abs, max_mag, worst


def own_error(a, b) -> tuple[float, float]:
    """How far `a` (PyTorch in the run's dtype) lands from `b` (float64): max |a - b| over max |b|, and the
    judge's elementwise metric (`compare`), max |a - b| / (|b| + the part's mean |b|), infinite where an
    all-zero part's element is not zero. In POLICY.compare_piece pieces, which stay in cache."""
    if a.numel() == 0:
        return 0.0, 0.0
    a, b = a.detach().reshape(-1), b.detach().reshape(-1)
    # On a GPU in chunks, not cache-sized pieces: each piece costs launches and syncs, and no core cache helps.
    n, piece = b.numel(), POLICY.compare_piece if b.device.type == "cpu" else POLICY.compare_chunk
    mean = sum(float(b[i:i + piece].double().abs().sum()) for i in range(0, n, piece)) / n
    top_diff = top_mag = own = 0.0
    for i in range(0, n, piece):
        ref = b[i:i + piece].double()
        diff, mag = a[i:i + piece].double().sub_(ref).abs_(), ref.abs()
        top_diff, top_mag = max(top_diff, diff.max().item()), max(top_mag, mag.max().item())
        if mean > 0:  # every element's floor is above zero
            own = max(own, diff.div_(mag.add_(mean)).max().item())
    if mean == 0:  # an all-zero part: any difference is infinitely off
        own = float("inf") if top_diff > 0 else 0.0
    return top_diff / max(top_mag, 1e-30), own


def _abs_sum(values: np.ndarray, lo: int, hi: int) -> float:
    """The sum of |values[lo:hi]|, POLICY.compare_piece values at a time."""
    piece = POLICY.compare_piece
    return sum(float(np.abs(values[i:min(i + piece, hi)]).sum()) for i in range(lo, hi, piece))


def _range_stats(got_at, ref: np.ndarray, lo: int, hi: int, mean: float, tol: float):
    """_chunk_stats over values lo to hi, POLICY.compare_piece values at a time (got_at(i, j): the
    output's values i to j), as one: None where one piece holds NaN or Inf; the worst value's index
    counted from lo."""
    top_diff, top_mag, worst, piece = 0.0, 0.0, None, POLICY.compare_piece
    for i in range(lo, hi, piece):
        j = min(i + piece, hi)
        if (st := _chunk_stats(got_at(i, j), ref[i:j], mean, tol)) is None:
            return None
        top_diff, top_mag = max(top_diff, st[0]), max(top_mag, st[1])
        if st[2] is not None:
            excess, k, ref_k, got_k = st[2]
            if worst is None or not excess <= worst[0]:  # NaN too, as argmax within a piece picks it
                worst = (excess, i - lo + k, ref_k, got_k)
    return top_diff, top_mag, worst


def _chunk_stats(got: np.ndarray, ref: np.ndarray, mean: float, tol: float):
    """One chunk against its reference: None where it holds NaN or Inf, else (max |got - ref|,
    max |ref|, and where some value is past its bound (excess, index, ref, got) of the one furthest
    past it, the one the feedback may show)."""
    if not np.all(np.isfinite(got)):
        return None
    diff = np.subtract(got, ref)  # a new array: `got` may be a view of the caller's values or the outbox
    np.abs(diff, out=diff)
    bound = np.abs(ref)
    stats = [float(diff.max()), float(bound.max()), None]
    bound += mean
    bound *= tol
    if not bool(np.all(diff <= bound)):
        k = int(np.argmax(diff - bound))
        stats[2] = (float(diff[k] - bound[k]), k, float(ref[k]), float(got[k]))
    return tuple(stats)


class Slot:
    """A slot of the child's outbox read in place, a chunk at a time widened to float64 from the header's
    dtypes (memfd.PACKED_DTYPES), never copied whole. Each comparison reads each value once, so a child
    rewriting its outbox meanwhile only changes which values it is judged on."""

    def __init__(self, outbox, slot: int, dtypes: list[str], counts: list[int]):
        import torch

        self.outbox, self.size = outbox, sum(counts)
        self.parts, at, first = [], slot * outbox.slot_values * 8, 0
        for dtype, count in zip(dtypes, counts):
            width = torch.empty((), dtype=getattr(torch, dtype)).element_size()
            self.parts.append((first, first + count, at, getattr(torch, dtype), width))
            first, at = first + count, at + count * width
        self.ok = at <= (slot + 1) * outbox.slot_values * 8

    @staticmethod
    def of(outbox, slot: int, dtypes: list[str], counts: list[int]) -> Slot | None:
        """None where a dtype is not one the parent decodes or the parts do not fit the slot."""
        if len(dtypes) != len(counts) or any(d not in PACKED_DTYPES for d in dtypes):
            return None
        slot_ = Slot(outbox, slot, dtypes, counts)
        return slot_ if slot_.ok else None

    def chunk(self, i: int, j: int) -> np.ndarray:
        """Values i to j (across parts) as a fresh float64 array."""
        import torch

        out = []
        for first, end, at, dtype, width in self.parts:
            lo, hi = max(i, first), min(j, end)
            if lo < hi:
                raw = torch.frombuffer(self.outbox.map, dtype=torch.uint8, count=(hi - lo) * width,
                                       offset=at + (lo - first) * width)
                out.append(raw.view(dtype).to(torch.float64, copy=True).numpy())  # a copy even of float64
                del raw
        return out[0] if len(out) == 1 else np.concatenate(out) if out else np.empty(0)


def same_values(a, b) -> bool:
    """Two outputs (arrays or Slots) hold the same values, NaN where NaN; compared in chunks. Two slots of
    the same dtypes compare byte for byte, with no float64 copies: stricter only for equal values of
    different bits (-0.0 and 0.0, NaN payloads), which is a change all the same."""
    if a is None or b is None or a.size != b.size:
        return False
    if isinstance(a, Slot) and isinstance(b, Slot) and [p[:2] + p[3:] for p in a.parts] == [p[:2] + p[3:] for p in b.parts]:
        return all(_same_bytes(a, b, at_a, at_b, (end - first) * width)
                   for (first, end, at_a, _, width), (_, _, at_b, _, _) in zip(a.parts, b.parts))
    if not isinstance(a, Slot) and not isinstance(b, Slot):
        return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))
    at = [x.chunk if isinstance(x, Slot) else (lambda i, j, x=x: x.reshape(-1)[i:j]) for x in (a, b)]
    step = POLICY.compare_chunk
    return all(np.array_equal(at[0](i, i + step), at[1](i, i + step), equal_nan=True) for i in range(0, a.size, step))


def _same_bytes(a: Slot, b: Slot, at_a: int, at_b: int, size: int) -> bool:
    step = POLICY.compare_chunk * 8
    for i in range(0, size, step):
        n = min(step, size - i)
        if not np.array_equal(np.frombuffer(a.outbox.map, np.uint8, n, at_a + i), np.frombuffer(b.outbox.map, np.uint8, n, at_b + i)):
            return False
    return True


def digest_ok(digest: float, want: float, scale: float, tol: float, dtype: str, parts: Expected | None) -> bool:
    """A replayed call's digest, sum(values x w) in float32, against the reference's (pipeline.child.replays): parts
    within their tolerances (as `compare` widens a checked call's) move it at most the widest x scale."""
    tol = max(parts.tolerances(tol, dtype)) if parts else tolerance_for(tol, dtype, None)
    return bool(np.isfinite(digest)) and abs(digest - want) <= (tol + POLICY.digest_sum_eps) * scale + 1e-30
