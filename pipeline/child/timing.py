"""The clock the reference process times eager's and torch.compile's calls with (the candidate's are
timed by the parent alone: pipeline.judge.clocks), and the floors measured there.

Each timed call ends only when the whole device is idle (work on side streams counts); on a GPU the
L2 is flushed before it and it is launched behind a hold kernel (pipeline.child.hold) so that
host-side stalls in the launch are not timed.
"""

from __future__ import annotations

import ctypes
import glob
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .hold import Hold

@dataclass(frozen=True)
class Method:
    """How calls are timed, here and in the reference (the child's numbers: it may not import
    pipeline.policy). `version` is part of the baseline cache key: a change of any other field, or of
    how one is used, is a new version and invalidates cached times."""
    version: str = "10"
    block: int = 4
    """Timed calls come in blocks of this many input sets, each refilled with fresh values before the block;
    every call is timed (work shifted between calls still counts), and the time is the median of block means."""
    sets_bytes: int = 1 << 30
    """Input sets a block keeps at most, together (input_sets)."""
    hold_ms: float = 1.0
    """A GPU call is launched behind a hold this long, covering torch.compile's cold launch path and most host stalls."""
    side_work_ratio: float = 1.5
    side_work_ms: float = 0.05
    """A call whose busy-until-idle time exceeds its events' by side_work_ratio x, plus this (beyond
    sync latency), did work on other streams."""
    l2_flush_bytes: int = 256 << 20
    """Bytes written before each GPU call to flush the L2 (twice the largest L2 of current parts). No flush on the
    cpu, where a call runs on the inputs its block just wrote, as Bound requests do: the same cache state."""


METHOD = Method()


class Clock:
    def __init__(self, device: str):
        self.device = device
        self.cuda = device.startswith("cuda")
        self._ns = time.perf_counter_ns
        if self.cuda:
            self._event = torch.cuda.Event
            self._record = torch.cuda.Event.record
            self._elapsed = torch.cuda.Event.elapsed_time
            self._sync = torch.cuda.synchronize
            self._reset_l2 = _persisting_l2_reset()
            self._flush_buf = torch.empty(METHOD.l2_flush_bytes // 4, dtype=torch.float32, device=device)
            self._hold = Hold(device)
            self._current_stream = torch.cuda.current_stream

    def sync(self) -> None:
        if self.cuda:
            self._sync()

    def flush(self) -> None:
        if not self.cuda:
            return
        if self._reset_l2 is not None:
            self._reset_l2()
        self._flush_buf.fill_(1.0)
        self.sync()

    def time_call(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """Milliseconds of one call measured until the device is idle, and its result."""
        self.flush()
        if self.cuda:
            start, end, idle = (self._event(enable_timing=True) for _ in range(3))
            # The call's host-side launch runs while the hold keeps the GPU busy (pipeline.child.hold): the
            # start event fires when the hold ends, so host stalls shorter than METHOD.hold_ms are not timed.
            stream = self._current_stream()
            self._hold(stream.cuda_stream, METHOD.hold_ms)
            self._record(start, stream)
            out = fn()
            self._record(end, stream)
            self._sync()  # device-wide: waits for side streams too
            self._record(idle, stream)  # fires at once: the device's own clock of when all was done
            self._sync()
            events = float(self._elapsed(start, end))
            until_idle = float(self._elapsed(start, idle))
            # Events see only the current stream. Work left on other streams shows as a device far
            # longer busy than the events: then the time until the device was idle is the time.
            if until_idle > events * METHOD.side_work_ratio + METHOD.side_work_ms:
                return until_idle, out
            return events, out
        t0 = self._ns()
        out = fn()
        return (self._ns() - t0) / 1e6, out

    def block_ms(self, fn: Callable[[], Any], calls: int) -> float:
        """Wall milliseconds of `calls` back-to-back calls ending with a device sync."""
        self.sync()
        t0 = self._ns()
        for _ in range(calls):
            fn()
        self.sync()
        return (self._ns() - t0) / 1e6


def _persisting_l2_reset() -> Callable[[], None] | None:
    """Reset any persisting-L2 carve-out a candidate set, so lines it pinned are flushed too."""
    here = os.path.dirname(torch.__file__)
    candidates = ["libcudart.so", *glob.glob(os.path.join(here, "..", "nvidia", "cu*", "lib", "libcudart.so*")),
                  *glob.glob(os.path.join(here, "lib", "libcudart*.so*"))]
    for lib in candidates:
        try:
            rt = ctypes.CDLL(lib, mode=ctypes.RTLD_LOCAL)
            break
        except OSError:
            continue
    else:
        return None
    set_limit, reset = rt.cudaDeviceSetLimit, rt.cudaCtxResetPersistingL2Cache
    limit_persisting_l2 = 0x06  # cudaLimitPersistingL2CacheSize

    def run() -> None:
        set_limit(limit_persisting_l2, ctypes.c_size_t(0))
        reset()

    return run


def input_sets(nbytes: int, device: str) -> int:
    """How many input sets of `nbytes` a block keeps: up to METHOD.block, together at most METHOD.sets_bytes (at
    least one), on a GPU within 40% of free memory. Several keep a block's calls off each other's caches; sets
    past METHOD.sets_bytes are past any cache, so one, refilled before each call, is as cold and copies nothing."""
    count = max(1, min(METHOD.block, METHOD.sets_bytes // max(nbytes, 1)))
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        return max(1, min(count, int(0.4 * free) // max(nbytes, 1)))
    return count


def time_sides(clock: Clock, calls: list[Callable[[list[Any]], Any]], sets: list[list[Any]], total: int,
               seeds_for: Callable[[int, int], list[int]], refill: Callable[[list[Any], int], None]) -> list[list[float]]:
    """Milliseconds of `total` timed calls of each of `calls`, in blocks of METHOD.block: before a block its sets
    get fresh values (`seeds_for(first, count)`, then `refill`), and again before reuse, so no call sees values
    twice. Each set is timed with each of `calls` in turn (one draw for eager and compiled). A list per callable."""
    times: list[list[float]] = [[] for _ in calls]
    for first in range(0, total, METHOD.block):
        seeds = seeds_for(first, min(METHOD.block, total - first))
        for j, seed in enumerate(seeds[:len(sets)]):
            refill(sets[j], seed)
        for j, seed in enumerate(seeds):
            inputs = sets[j % len(sets)]
            if j >= len(sets):
                refill(inputs, seed)
            for side, call in enumerate(calls):
                ms, out = clock.time_call(lambda: call(inputs))
                times[side].append(ms)
                del out
    return times


def time_cold(clock: Clock, calls: list[Callable[[list[Any]], Any]], sets: list[list[Any]]) -> list[list[float]]:
    """Each of `calls` timed on each set in turn, all sets made before the first call, as the cpu's Bound request
    times the candidate's on sets the parent just wrote: both sides meet the same caches. A list per callable."""
    times: list[list[float]] = [[] for _ in calls]
    for inputs in sets:
        for side, call in enumerate(calls):
            ms, out = clock.time_call(lambda: call(inputs))
            times[side].append(ms)
            del out
    return times


class ColdPool:
    """The reference's sets for time_cold: drawn once, then rewritten from a copy before each later block, so each
    is freshly written as the inbox's are, without a draw per set (draws would be most of a cpu attempt's
    timing). Only where both copies fit in `most` bytes; larger sets are drawn anew each block."""

    def __init__(self, most: int):
        self.most, self.key, self.sets, self.source = most, None, [], []

    def take(self, key: str, make: Callable[[int], list[Any]], seeds: list[int]) -> list[list[Any]]:
        if key == self.key and len(self.sets) == len(seeds):
            for dst, src in zip(self.sets, self.source):
                for a, b in zip(dst, src):
                    if isinstance(a, torch.Tensor):
                        a.copy_(b)
            return self.sets
        sets = [make(seed) for seed in seeds]
        nbytes = sum(x.numel() * x.element_size() for s in sets for x in s if isinstance(x, torch.Tensor))
        keep = 2 * nbytes < self.most
        self.key, self.sets = (key, sets) if keep else (None, [])
        self.source = [[x.clone() if isinstance(x, torch.Tensor) else x for x in s] for s in sets] if keep else []
        return sets


def calls_for(estimate_ms: float | None, target_ms: float, least: int, most: int) -> int:
    """How many timed calls: `least`, or more for a short call until they add up to about
    `target_ms`, never more than `most`. Per-call noise (launch and host jitter, tens of microseconds)
    is a larger share of a short call; more calls keep its median as stable as a long call's."""
    if not estimate_ms or estimate_ms <= 0 or target_ms <= 0:
        return least
    return max(least, min(most, math.ceil(target_ms / estimate_ms)))


def summarize_blocks(times_ms: list[float], block: int = METHOD.block) -> dict[str, float]:
    """Median and quartiles of the block means; n counts calls."""
    means = [statistics.fmean(times_ms[i:i + block]) for i in range(0, len(times_ms), block)]
    return {**summarize(means), "n": len(times_ms)}


def event_ms(call: Callable[[], Any]) -> float:
    """Milliseconds of one call between CUDA events, ending with a device sync (no flush)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def plain_ms(call: Callable[[], Any], calls: int = 30, warmup: int = 5) -> float:
    """The common method of other benchmarks (shared/baselines-h100.md): back-to-back calls on one
    input set, each between device syncs and timed by events, no flush; the median. Kept only to
    compare our baselines with numbers measured that way; never used for a verdict."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    return statistics.median(event_ms(call) for _ in range(calls))


def summarize(times_ms: list[float]) -> dict[str, float]:
    qs = statistics.quantiles(times_ms, n=4) if len(times_ms) >= 2 else [times_ms[0]] * 3
    return {"median_ms": statistics.median(times_ms), "p25_ms": qs[0], "p75_ms": qs[2], "n": len(times_ms)}


def hold_ms(clock: Clock, ms: float = METHOD.hold_ms, repeats: int = 5) -> float:
    """How long a hold (pipeline.child.hold) of `ms` takes between CUDA events, median of `repeats`: `ms` within
    microseconds on a GPU that is ours alone, longer when time-sliced or when every launch has slowed. Queued
    behind a first hold, so the host's launch is not counted."""
    stream = clock._current_stream()
    times = []
    for _ in range(repeats):
        start, end = clock._event(enable_timing=True), clock._event(enable_timing=True)
        clock._sync()
        clock._hold(stream.cuda_stream, 0.5)
        clock._record(start, stream)
        clock._hold(stream.cuda_stream, ms)
        clock._record(end, stream)
        clock._sync()
        times.append(float(clock._elapsed(start, end)))
    return statistics.median(times)


def measure_bandwidth(device: str, clock: Clock | None = None, nbytes: int | None = None) -> float:
    """Device memory bandwidth in GB/s, the better of a copy and a read (`clock`: the caller's, reused). A
    GPU: a large buffer from a flushed L2, the median. The cpu, unflushed: `nbytes` (the task's inputs), warm,
    the fastest, the bandwidth where the data sits (docs/decisions/cpu-timing.md)."""
    clock = clock or Clock(device)
    cached = not clock.cuda and nbytes is not None
    numel = (1 << 30) // 4 if clock.cuda else (256 << 20) // 4
    if clock.cuda:
        free, _ = torch.cuda.mem_get_info()
        numel = min(numel, int(free * 0.2) // 4)
    if cached:
        numel = max(1024, nbytes // 4)
    src = torch.ones(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copies, reads = [], []
    rounds = 30 if cached else 7

    def copy() -> None:
        ms, _ = clock.time_call(lambda: dst.copy_(src))
        copies.append(2 * numel * 4 / (ms / 1e3) / 1e9)

    def read() -> None:
        ms, _ = clock.time_call(lambda: src.sum())
        reads.append(numel * 4 / (ms / 1e3) / 1e9)

    # On a GPU each call starts from a flushed L2, so they alternate. On the cpu the reads come after all
    # the copies: a read right after a copy pays for the copy's dirty lines, which an honest warm read does not.
    for _ in range(rounds):
        copy()
        if clock.cuda:
            read()
    if not clock.cuda:
        for _ in range(rounds):
            read()
    pick = max if cached else statistics.median  # the cache's best, which no honest read beats
    return max(pick(copies), pick(reads))


def bandwidth_floor(device: str, clock: Clock | None, input_bytes: int, bandwidth: float | None = None) -> dict[str, float]:
    """The bandwidth floor (Baselines.floor_ms): the inputs' bytes at the bandwidth where they sit
    (`bandwidth`, where measured already)."""
    bandwidth = bandwidth or measure_bandwidth(device, clock, input_bytes)
    return {"bandwidth_gbs": bandwidth, "floor_ms": input_bytes / (bandwidth * 1e9) * 1e3}


def flop_count(call: Callable[[], Any]) -> int:
    """Floating-point operations of one call as PyTorch's flop counter sees them: matmuls,
    convolutions, attention; elementwise work counts 0. No kernel computing the same formula the same
    way does less, but one that rewrites the algebra to skip it does (EvalConfig.compute_floor)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        call()
    return int(counter.get_total_flops())


def warm_flop_count() -> None:
    """Import what FlopCounterMode's first use imports (torch._dynamo) in the reference's zygote, so every
    reference forked from it is spared it. The import alone, no op: an op before a fork moved the forks' results
    (docs/decisions/spares-and-startup.md)."""
    import torch._dynamo  # noqa: F401


def measure_flops(device: str, clock: Clock | None = None) -> float:
    """The device's best measured arithmetic rate in FLOP/s: square matmuls in float32 and bfloat16 (and float16
    on a GPU), the fastest of five each, with the caller's threads, since a kernel may compute in any dtype its
    tolerance allows. fp8 is not tried."""
    clock = clock or Clock(device)
    n = 8192 if clock.cuda else 384
    best = 0.0
    for dtype in (torch.float32, torch.bfloat16) + ((torch.float16,) if clock.cuda else ()):
        a = torch.ones(n, n, dtype=dtype, device=device)
        b = torch.ones(n, n, dtype=dtype, device=device)
        for _ in range(5):
            ms, _ = clock.time_call(lambda: a @ b)
            best = max(best, 2 * n ** 3 / (ms / 1e3))
        del a, b
    return best


def compute_floor(device: str, clock: Clock | None, call: Callable[[], Any] | None = None,
                  flops: int = 0, own_ms: float | None = None, rate: float | None = None) -> dict[str, float | None]:
    """The compute floor (Baselines.compute_floor_ms): the flops of one `call` (or `flops`) at the device's best
    rate (`rate`, where measured already). None where the counter sees no arithmetic (every loss) or it or the
    matmuls fail. `own_ms`: the reference's own time for that arithmetic, so no rate below its own is taken."""
    try:
        flops = flop_count(call) if call is not None else flops
        rate = (rate or measure_flops(device, clock)) if flops > 0 else None
    except Exception:  # noqa: BLE001 - no compute floor is the loss tasks' state: only the bandwidth floor
        rate = None
    if rate and own_ms and own_ms > 0:
        rate = max(rate, flops / own_ms * 1e3)
    return {"flops": flops, "flops_per_s": rate, "compute_floor_ms": flops / rate * 1e3 if rate else None}


def floors_again(device: str, clock: Clock | None, input_bytes: int, flops: int) -> dict[str, float | None]:
    """Both floors measured again (pipeline.judge.bench.TaskBench.floor_now), beside a time below one:
    on a GPU beside a paused child whose memory may leave too little for the buffers; then None, and
    the floor the bench had stands."""
    try:
        floor: dict[str, float | None] = bandwidth_floor(device, clock, input_bytes)
    except Exception:  # noqa: BLE001 - out of memory: the bench's own floor is the one to judge by
        floor = {"bandwidth_gbs": None, "floor_ms": None}
    return floor | compute_floor(device, clock, flops=flops)
