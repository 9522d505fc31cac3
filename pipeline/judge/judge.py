"""The parent's judgement: output values against the float64 reference, and times against its own clock.

Nothing here takes the child's word. Values are the candidate's outputs as the child wrote them into
the outbox (copied out by the parent before its next request), compared element by element with the
reference's full float64 output. A time the child reports is accepted only inside the bounds of the
parent's clock:

- upper: a timed block cannot claim more time than passed between the request and its reply;
- lower: the parent times `Bound` requests itself and subtracts what the very same requests cost
  with a null model before the candidate was imported. Each request reveals fresh inputs only as
  the parent's clock starts (on the cpu the parent writes them into the child's inbox while every
  process of the child's session is stopped; on a GPU the child makes them from a seed per call),
  calls on each back to back, syncs and writes the outputs. The harness copies nothing in that
  window, so nothing in the calibrated part is work a candidate could skip; what is left is the
  calls' own time. A refusal on this bound alone is confirmed by a second evaluation before it
  stands (pipeline.judge.evaluate.evaluate).

The child's flushed, held per-call times refine the parent's estimate (they exclude host launch
work and warm caches); they may not fall below it by more than BOUND_SLACK.
"""

from __future__ import annotations

import mmap
import os
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..child.protocol import PACKED_DTYPES, OutputHeader
from ..child.timing import summarize_blocks
from ..records import Ratio, Timing, TrialResult, Verdict
from .runqueue import Load

# How far below the parent's estimate the child's per-call time may be: (relative, milliseconds); the
# measurements behind each, and their history, in docs/benchmarks.md (search "slack"):
# - cuda (eager Bound requests): the estimate counts the forward's host work, which the hold hides
#   from the child's events (an honest 11 us kernel cost 110 us a call on the H100's parent clock),
#   hence 0.25 ms absolute, and LOOSE_BELOW_MS below which it refuses nothing.
# - cuda_graph (pipeline.child.replays): the device's work alone, the claim less the no-work call
#   (Baselines.null_ms). _grad: honest claims read 0.98-1.49 of the estimate, a half-forged 26 us 0.63-0.64.
# - cpu: load out of both sides (unloaded_ms); requests of about 4 ms (evaluate.CPU_BOUND_MS). 0.003 ms
#   absolute: at 0.01 a clock forged to half passed at 0.54 of a 0.09 ms call's estimate; honest forward
#   claims read 0.80-1.21 (36th session). A first claim within DOUBT_SLACK of its bound is judged again.
# - cpu_grad: no second look (session); the claim as a Bound request mixes first and later calls (mixed_calls).
#   Honest references read 0.91-1.17, a fused mse 0.94-1.06 (36th session; 45% + 50 us passed the half).
BOUND_SLACK = {"cuda": (0.5, 0.25), "cuda_graph": (0.35, 0.001), "cuda_graph_grad": (0.25, 0.001),
               "cpu": (0.35, 0.003), "cpu_grad": (0.30, 0.003)}  # (relative, milliseconds)
# A first claim that passes its bound but reads below the estimate x (1 - this) less the same absolute slack is
# judged again on both evaluations' evidence (evaluate.evaluate): honest fused kernels overlap a 0.6 (33rd session).
DOUBT_SLACK = {"cpu": 0.20}
# Calls not replayed from a graph: the eager bound counts host work, and below this refuses nothing (untrusted).
LOOSE_BELOW_MS = 0.5
# Replays a replayed Bound request (evaluate.replay_count); at REPLAYS_MAX calls are too short to fill one.
REPLAYS_MIN, REPLAYS_MAX = 4, 512
DIGEST_SUM_EPS = 1e-5  # a replayed call's digest's float32 summing, beside the tolerance (digest_ok)
UPPER_SLACK_MS = 1.0  # the child's sum over a timed block against the parent's window around it
CHUNK = 1 << 22  # values a step where an output is compared in pieces (32 MiB of float64 an array)
# Threads an output's chunks are compared on: each holds about 3 chunk-sized float64 arrays (100 MiB).
COMPARE_THREADS = max(1, min(8, len(os.sched_getaffinity(0))))


@dataclass(frozen=True)
class Expected:
    """The reference's output for one call: metadata, and its full float64 values in a sealed memfd
    (pipeline.judge.handover.sealed_memfd) that only the parent holds, fetched as that call is checked and
    closed once it has been (pipeline.judge.session.Session.fetch); `fd` is None where only the metadata
    was asked for (an attempt's shapes, before its child starts)."""

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

    def tolerances(self, tol: float, dtype: str) -> list[float]:
        """Each part's relative tolerance in the run's dtype (tolerance_for), in layout order."""
        n = len(self.layout())
        return [tolerance_for(tol, dtype, e, o) for e, o in zip(self.rel_errs or [self.fp32_rel_err] * n, self.own_errs or [None] * n)]


def mapped(fd: int, dtype=np.uint8, count: int = -1) -> np.ndarray:
    """A read-only view of a sealed memfd's values, no copy (an output may be gigabytes); the map
    lives as long as the view, the descriptor may be closed before."""
    size = os.fstat(fd).st_size
    if not size:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(mmap.mmap(fd, size, prot=mmap.PROT_READ), dtype=dtype, count=count)


# The least relative tolerance a dtype gets: its machine epsilon. A fixed 1e-4 fails every honest
# bfloat16 kernel; the rounding of the output alone is up to half an epsilon.
DTYPE_EPS = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}
REF_ERR_FACTOR = 4  # and at least this many times PyTorch's own error in the dtype against float64
# float32 widens the task's tolerance to REF_ERR_FACTOR x PyTorch's own reading in the judge's
# elementwise metric, at most this many times the task's: PyTorch's own float32 gradient of triplet
# margin loss failed 1e-4 on 1 seed in 60 of the needle variant (an element 7x below the part's
# mean, off by 1e-3 of itself), and the honest reference was judged wrong_gradient.
OWN_ERR_CAP = 10


def tolerance_for(tol: float, dtype: str, ref_err: float | None, own_err: float | None = None) -> float:
    """The relative tolerance for one part in the run's dtype. float32 keeps the task's (default
    1e-4), widened only where PyTorch's own float32 result on the attempt's very inputs reads more
    than a quarter of it in the judge's elementwise metric (`own_err`), to REF_ERR_FACTOR x that,
    at most OWN_ERR_CAP x the task's. In bfloat16 and float16 it is derived from the reference's own
    error in that dtype against float64 (measured per attempt on the same inputs), never below the
    dtype's epsilon. Every comparison is against float64, so a reduction accumulated in the low
    dtype (whose error grows with its length) fails where PyTorch's, accumulated in float32, passes."""
    if dtype not in DTYPE_EPS:
        return min(max(tol, REF_ERR_FACTOR * (own_err or 0.0)), OWN_ERR_CAP * tol)
    return max(tol, DTYPE_EPS[dtype], REF_ERR_FACTOR * (ref_err or 0.0))


def fail(verdict: Verdict, error: str, **extra) -> TrialResult:
    return TrialResult(index=0, variant="", ok=False, verdict=verdict, error=error, **extra)


def compare(header: OutputHeader, values: np.ndarray | None, want: Expected, tol: float, device: str,
            dtype: str = "float32") -> TrialResult:
    """Judge one output (the child's header, the parent's copy of its values) against the reference;
    in gradient mode the output and then every gradient, each part against its own magnitude."""
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
    got_at = values.chunk if isinstance(values, Slot) else (lambda i, j: values[i:j])
    b = want.values()
    start, worst_part = 0, None
    for (label, shape, n), part_tol in zip(layout, want.tolerances(tol, dtype)):
        part = range(start, start + n)
        start += n
        wrong = Verdict.mismatch if label == "output" else Verdict.wrong_gradient
        where = "output" if label == "output" else label
        # Magnitude-aware: relative per element, with the part's mean magnitude as the absolute
        # floor, so zeros never pass against a non-zero reference (KernelBench #165). In chunks of
        # CHUNK values (issue 28: whole-part float64 copies were several times a 1 GiB output),
        # spread over the parent's cores (a 6.4 GB output took minutes on one).
        chunks = [(i, min(i + CHUNK, part.stop)) for i in part[::CHUNK]]
        mean = sum(_spread(lambda c: float(np.abs(b[c[0]:c[1]]).sum()), chunks)) / n if n else 0.0
        stats = _spread(lambda c: _chunk_stats(got_at(*c), b[c[0]:c[1]], mean, part_tol), chunks)
        finite = all(st is not None for st in stats)
        past, max_abs, max_mag, worst = False, 0.0, 0.0, (-np.inf, 0, 0.0, 0.0)
        for (i, _), st in zip(chunks, stats if finite else []):
            max_abs, max_mag = max(max_abs, st[0]), max(max_mag, st[1])
            if st[2] is not None:
                past = True
                excess, k, ref_k, got_k = st[2]
                if not excess <= worst[0]:  # NaN too: argmax over the part picked it
                    worst = (excess, i - part.start + k, ref_k, got_k)
        if not finite:
            return fail(Verdict.non_finite if label == "output" else wrong, f"{where} holds NaN or Inf")
        max_rel = max_abs / max(max_mag, 1e-30)
        if past:
            index = [int(x) for x in np.unravel_index(worst[1], tuple(shape))] if shape else []
            prefix = "" if label == "output" else f"{label}: "
            return fail(wrong, f"{prefix}max relative error {max_rel:.3g} exceeds tolerance {part_tol:g}",
                        max_abs_err=max_abs, max_rel_err=max_rel, worst_index=index,
                        expected=worst[2], got=worst[3])
        if worst_part is None or max_rel > worst_part[1]:
            worst_part = (max_abs, max_rel)
    max_abs, max_rel = worst_part or (0.0, 0.0)
    return TrialResult(index=0, variant="", ok=True, max_abs_err=max_abs, max_rel_err=max_rel)


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


_POOL: ThreadPoolExecutor | None = None


def _spread(fn, chunks: list) -> list:
    """fn over the chunks in order, on up to COMPARE_THREADS threads (numpy lets go of the GIL on
    arrays this large); one chunk runs here."""
    global _POOL
    if len(chunks) <= 1:
        return [fn(c) for c in chunks]
    if _POOL is None:
        _POOL = ThreadPoolExecutor(COMPARE_THREADS, thread_name_prefix="kgen-compare")
    return list(_POOL.map(fn, chunks))


class Slot:
    """A slot of the child's outbox read in place, a chunk at a time, each chunk widened to float64
    from the dtypes the header names (pipeline.child.protocol.PACKED_DTYPES): a whole float64 copy
    of a gigabyte output was twice its size in the parent (issue 28). Each comparison reads each
    value once, into its own chunk-sized copy, so a child that rewrites its outbox meanwhile only
    changes which values it is judged on, as with the whole copy made before; nothing else reads it."""

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
    """Two outputs (arrays or Slots) hold the same values, NaN where NaN; compared in chunks."""
    if a is None or b is None or a.size != b.size:
        return False
    if not isinstance(a, Slot) and not isinstance(b, Slot):
        return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))
    at = [x.chunk if isinstance(x, Slot) else (lambda i, j, x=x: x.reshape(-1)[i:j]) for x in (a, b)]
    return all(np.array_equal(at[0](i, i + CHUNK), at[1](i, i + CHUNK), equal_nan=True) for i in range(0, a.size, CHUNK))


@dataclass
class Window:
    """One request the parent timed: from its send to the reply's arrival."""

    ms: float
    calls: int
    load: Load | None = None
    """What the run queues took of it, and the child's time on a cpu in it (pipeline.judge.runqueue)."""


def unloaded_ms(window: Window, threads: int = 1) -> float:
    """The window less what other processes took of it (cpu): its milliseconds less the run-queue
    wait of the child's busiest thread and the parent's, but never below the child's time on a cpu
    over the `threads` cores it is held to (pipeline.sandbox.cpu_cores). On a busy 2-core box the
    child's clock counted the time others had its core, the parent's fastest request did not (a
    clock forged to 30% read 0.6 of the estimate, judged correct). No candidate lowers this below its
    work: a wait is time it did not run, and work split over threads is inside their cpu time over
    the cores; a thread that exits in the window takes its wait with it (nothing subtracted)."""
    if window.load is None:
        return window.ms
    return max(window.ms - window.load.wait_ms, window.load.cpu_ms / max(1, threads), 0.0)


def parent_estimate(calibration: list[Window], bounds: list[Window], device: str = "cuda") -> float | None:
    """Per-call milliseconds from the parent's own clock: the fastest Bound request less the median
    null-model request of the same size (on the cpu, the fastest), per call.

    The fastest, not the median: a machine's stalls only ever add time (on the 2-core CI box about one
    Bound request in three took 8-16 ms longer than the rest, enough to put an honest kernel's median
    below the bound), while a candidate cannot make any request faster than the work it must do in
    it: to shorten one it would have to skip calls, and each request has one call, chosen in secret,
    whose output is checked in full. The median calibration is robust to a stalled null request
    (seen: 15.3 ms among 7.3-7.9). On the cpu it is the fastest too: in gradient mode half its requests
    stalled 1.5-2 ms, and the median let a forged clock through once in five."""
    per_call = net_per_call(calibration, bounds, device)
    return min(per_call) if per_call else None


def net_per_call(calibration: list[Window], bounds: list[Window], device: str = "cuda", threads: int = 1) -> list[float]:
    """Each Bound request's milliseconds a call less the calibration's (parent_estimate). On the cpu
    both less what other processes took of them (unloaded_ms): a loaded box once stalled every null
    request, the calibration came out high, the estimate low, and the red team's forged clock
    claiming 30% of its time was judged correct."""
    if not calibration or not bounds:
        return []
    if device == "cpu":
        base = min(unloaded_ms(w, threads) for w in calibration)
        return [max(0.0, unloaded_ms(w, threads) - base) / w.calls for w in bounds]
    base = statistics.median(w.ms for w in calibration)
    return [max(0.0, w.ms - base) / w.calls for w in bounds]


def paired_per_call(calibration: list[Window], null_calibration: list[float | None], bounds: list[Window],
                    nulls: list[float | None]) -> list[float] | None:
    """Each replayed Bound request's milliseconds a call less its own null request and the protocol's
    offset. The offset is what the child's null model costs on the parent's clock (before the import,
    so with the protocol's costs) over the reference's null replay: the median over the calibration's
    pairs, `null_calibration[i]` the reference's null beside `calibration[i]` (None where none was).
    Pairs, not the two medians: the GPU's clock and state drift within a calibration too, and
    medians of windows and of nulls taken at other moments put the offset of an H200's 8 us calls
    anywhere from 2.6 to 5.5 ms over 512 replays, the estimate from 4.2 us to 1.0 (docs/benchmarks.md,
    twenty-seventh session), so a clock forged to half passed now and then. None where a request or
    the calibration has no null replay beside it (net_per_call then stands)."""
    offset = calibration_offset(calibration, null_calibration)
    if offset is None or not bounds or len(nulls) != len(bounds) or None in nulls:
        return None
    return [max(0.0, w.ms - (offset + null)) / w.calls for w, null in zip(bounds, nulls)]


def calibration_offset(calibration: list[Window], null_calibration: list[float | None]) -> float | None:
    """The median of the calibration's pairs, each window less the reference's null beside it
    (paired_per_call); None where they are not index for index or no window has a null beside it."""
    pairs = [w.ms - n for w, n in zip(calibration, null_calibration) if n is not None]
    if not pairs or len(null_calibration) != len(calibration):
        return None
    return statistics.median(pairs)


def unloaded_means(blocks: list[tuple[list[float], Window]], device: str, threads: int = 1) -> list[float]:
    """Each timed block's claimed mean call, on the cpu less the share of its window other processes
    took (unloaded_ms), as the Bound requests it is checked against are. This only ever lowers a
    claim the bound is checked on, never the time recorded."""
    means = []
    for claimed, window in blocks:
        mean = statistics.fmean(claimed) if claimed else 0.0
        if device == "cpu" and window.ms > 0:
            mean *= unloaded_ms(window, threads) / window.ms
        means.append(mean)
    return means


@dataclass
class Evidence:
    """What one evaluation's clock check rests on, kept so that a second evaluation decides on both
    (pipeline.judge.evaluate.evaluate): never a fresh draw that forgets the first."""

    per_call: list[float]
    """Each Bound request's net milliseconds a call (net_per_call)."""
    means: list[float]
    """Each timed block's claimed mean call, less what load took (unloaded_means)."""
    load_share: float = 0.0
    """The share of its timed and Bound windows that went to run-queue waits (load_share)."""
    paired: bool = False
    """Whether per_call came from paired_per_call: each request net of a null request of its own, so
    the estimate is their median, not the fastest (a null replay slowed by chance would make its
    request the fastest)."""
    mixed: tuple[float, ...] = ()
    """Gradient mode on the cpu: each timed block's claimed calls as a Bound request mixes them (mixed_calls)."""


# On the cpu, an evaluation whose windows spent this share of their time in run-queue waits was
# timed on a machine unfit to time. Beside load 5-8 on the 2-core box (five processes building and
# testing, 2026-11-28) the waits took most of each window: the correction for them (unloaded_ms) left
# honest kernels' claims at 0.29-0.48 of the parent's estimate, eleven honest candidates were refused,
# and an honest fused mse that runs 2-3x eager idle recorded 0.18x beside two spinners on its core.
# Such an attempt keeps its correctness verdict and its timing is marked unfit
# (EvalResult.device_unfit), as on a GPU that failed its health check: kept out of `best` and the
# library, re-timed by a resume. A candidate that loads its own core gains nothing: its timing is
# marked unfit too, and its clock is never believed.
LOADED_SHARE = 0.15


def load_share(windows: list[Window]) -> float:
    """The share of `windows`' milliseconds that went to run-queue waits (pipeline.judge.runqueue): the
    child's busiest thread's and the parent's."""
    total = sum(w.ms for w in windows)
    waited = sum(w.load.wait_ms for w in windows if w.load is not None)
    return min(1.0, waited / total) if total > 0 else 0.0


def loaded(evidence: Evidence, device: str) -> str | None:
    """Why an evaluation's timing is unfit for the load on its cpu (LOADED_SHARE); else None."""
    if device != "cpu" or evidence.load_share < LOADED_SHARE:
        return None
    return (f"the cpu was loaded: {evidence.load_share:.0%} of the timed windows went to run-queue waits "
            f"(other processes, or the candidate's own threads)")


def pooled(evidence: list[Evidence]) -> tuple[float | None, float | None]:
    """(the parent's estimate, the claim it is checked against) over every evaluation's evidence: the
    fastest Bound request of any (the median where every evaluation's requests were paired), and the
    median block mean of all."""
    per_call = [x for e in evidence for x in e.per_call]
    means = [x for e in evidence for x in e.means]
    pick = statistics.median if evidence and all(e.paired for e in evidence) else min
    return (pick(per_call) if per_call else None), (statistics.median(means) if means else None)


def check_windows(blocks: list[tuple[list[float], Window]]) -> tuple[Verdict, str] | None:
    """Each timed block's claimed calls within the parent's window around it."""
    for claimed, window in blocks:
        if sum(claimed) > window.ms + UPPER_SLACK_MS:
            return (Verdict.impossible_timing, f"a timed block claims {sum(claimed):.4g} ms but only "
                    f"{window.ms:.4g} ms passed on the parent's clock")
    return None


def check_estimate(device: str, median_ms: float, estimate: float | None,
                   null_ms: float | None = None) -> tuple[Verdict, str] | None:
    """The child's median call against the parent's own estimate of a call, less BOUND_SLACK. For the
    replayed bound (`cuda_graph`) the claim is first taken `null_ms` less (Baselines.null_ms): what the
    child's clock reads around a call that does no work, which the estimate of the device's work in
    replays does not hold."""
    if estimate is None:
        return Verdict.protocol_error, "no bound blocks were timed by the parent"
    rel, abs_ms = BOUND_SLACK[device if device in BOUND_SLACK else "cuda" if device.startswith("cuda") else "cpu"]
    lower = estimate * (1 - rel) - abs_ms
    offset = null_ms if device.startswith("cuda_graph") and null_ms else 0.0
    if median_ms - offset < lower:
        less = f" ({median_ms - offset:.4g} ms beyond the {offset:.4g} ms it reads for a call that does no work)" if offset else ""
        return (Verdict.impossible_timing, f"the child's clock says {median_ms:.4g} ms a call{less}, but the parent's "
                f"own clock measured {estimate:.4g} ms a call on fresh inputs (at least {lower:.4g} ms): the "
                f"work was done outside the timed calls or the timer was tampered with")
    return None


def doubtful(device: str, median_ms: float, estimate: float | None) -> bool:
    """Whether a claim that passed check_estimate is close enough to it to be judged again (DOUBT_SLACK)."""
    return (device in DOUBT_SLACK and estimate is not None
            and median_ms < estimate * (1 - DOUBT_SLACK[device]) - BOUND_SLACK[device][1])


def digest_ok(digest: float, want: float, scale: float, tol: float, dtype: str, parts: Expected | None) -> bool:
    """A replayed call's digest, sum(values x w) in float32, against the reference's (pipeline.child.replays): parts
    within their tolerances (as `compare` widens a checked call's) move it at most the widest x scale."""
    tol = max(parts.tolerances(tol, dtype)) if parts else tolerance_for(tol, dtype, None)
    return bool(np.isfinite(digest)) and abs(digest - want) <= (tol + DIGEST_SUM_EPS) * scale + 1e-30


def mixed_calls(blocks: list[list[float]], calls: int) -> list[float]:
    """Each block's claims as a Bound request of `calls` mixes them: its first once, the rest's mean `calls - 1`
    times (a 512 x 512 add's gradient: first 0.5 ms, then 0.2; 1 in 4 in a block, 1 in 23 a request)."""
    return [(b[0] + (calls - 1) * (statistics.fmean(b[1:]) if len(b) > 1 else b[0])) / calls for b in blocks if b and calls > 0]


def summarize(times: list[float]) -> Timing:
    return Timing(**summarize_blocks(times))


def pair_ratios(blocks: list[list[float]], reference: list[float]) -> Ratio | None:
    """The reference's block means over the candidate's, pair by pair: `reference` holds the
    reference's calls block after block, as many a block as the candidate's block beside it."""
    ratios, start = [], 0
    for block in blocks:
        theirs = reference[start:start + len(block)]
        start += len(block)
        if len(theirs) != len(block) or not block or min(block) <= 0:
            return None  # the blocks do not line up: no pairs to take
        ratios.append(statistics.fmean(theirs) / statistics.fmean(block))
    if not ratios or start != len(reference):
        return None
    s = summarize_blocks(ratios, 1)  # blocks of one: the ratios' own median and quartiles
    return Ratio(median=s["median_ms"], p25=s["p25_ms"], p75=s["p75_ms"], pairs=len(ratios))
