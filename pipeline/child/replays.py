"""Bound requests on a GPU replayed from CUDA graphs, so the parent's clock times device work, not host
work, down to calls of about 10 us. `Captured` (untimed) captures a request's replays as one graph; its
`play` (timed) draws the masks from a seed revealed only then, launches and syncs. Replay r reads set
r % sets times mask r // sets (`layout`), so no pair comes twice and nothing computed at the capture
answers a replay; it writes a digest the parent checks on replays chosen in secret. Inputs are read cold;
an uncapturable forward fails the request (eager, untrusted). Measurements: docs/decisions/gpu-timing.md.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import tasks
from .grad import ForwardBackward, Grads, null_model


@dataclass(frozen=True)
class Plan:
    """How replayed requests perturb and lay out their inputs (the child's numbers: it may not import
    pipeline.policy)."""
    amplitude: float = 0.05
    """Each replay's inputs are its set's bases times a mask, each value within 1 +- this."""
    perturbed: tuple[str, ...] = ("real", "positive")
    """The input domains a mask is applied to: a positive mask keeps both."""
    # Cold replays: a set is rewritten sets - 1 replays ahead of its forward, about cold_l2 L2s of traffic
    # between, and a play is one graph launch; warm or launch-bound replays read low (docs/decisions/gpu-timing.md).
    cold_l2: int = 3
    max_sets: int = 64
    sets_bytes: int = 1 << 30
    """Bases and inputs of every set together, at most."""


PLAN = Plan()


def _perturbed(x: Any, domain: str) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and domain.partition(":")[0] in PLAN.perturbed


def masks(like: list[Any], doms: list[str], factor_seed: int, device: str, count: int = 1,
          into: list | None = None) -> list[list]:
    """The request's `count` masks, each one per perturbed input (None for the others), within 1 +-
    PLAN.amplitude, drawn one after another, in input order, on the device from the `play` seed (into
    the tensors `into` holds, where given)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(factor_seed % (1 << 63))
    out = []
    for k in range(count):
        one = []
        for i, (x, d) in enumerate(zip(like, doms)):
            if not _perturbed(x, d):
                one.append(None)
                continue
            m = into[k][i] if into is not None else torch.empty_like(x)
            one.append(m.uniform_(1.0 - PLAN.amplitude, 1.0 + PLAN.amplitude, generator=gen))
        out.append(one)
    return out


def perturb(base: torch.Tensor, mask: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """base x mask, in `out` where given (which may be the mask itself)."""
    return torch.mul(base, mask, out=out) if out is not None else torch.mul(base, mask)


def l2_bytes(device: str) -> int:
    return getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 0) \
        if device.startswith("cuda") else 0


def layout(n_seeds: int, set_bytes: int, l2: int, replays: int) -> tuple[int, int]:
    """(sets, masks) of a request: replay r reads set r % sets under mask r // sets, so no (set,
    mask) pair is replayed twice in a play. A pair replayed again could be answered from what its
    first replay learnt (its base and its mask), at no cost."""
    sets = set_count(n_seeds, set_bytes, l2, replays)
    return sets, math.ceil(replays / sets)


def inputs_for(module, seeds: list[int], replay: int, replays: int, factor_seed: int,
               device: str) -> tuple[list[Any], int]:
    """Replay `replay`'s inputs of a request of `replays` whose sets come from `seeds` (the reference's
    copy): its set's base under its mask (layout); and its set's seed."""
    inputs = tasks.make_inputs(module, seeds[0], "base", device)
    sets, _ = layout(len(seeds), tasks.input_bytes(inputs), l2_bytes(device), replays)
    seed = seeds[(replay % sets) % len(seeds)]
    if seed != seeds[0]:
        inputs = tasks.make_inputs(module, seed, "base", device)
    ms = masks(inputs, tasks.domains(module, len(inputs)), factor_seed, device, count=replay // sets + 1)[-1]
    return [perturb(x, m) if m is not None else x for x, m in zip(inputs, ms)], seed


def weights(numel: int, seed: int, device: str) -> torch.Tensor:
    """The digest's weights, one per output value, from the request's secret seed."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return torch.randn(numel, generator=gen, device=device, dtype=torch.float32)


def parts(result: Any) -> list[torch.Tensor]:
    """What a call's digest covers, in order: the output, then in gradient mode each gradient."""
    if isinstance(result, Grads):
        return [result.output, *result.grads]
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"the model returned {type(result).__name__}, not a tensor")
    return [result]


def digest(result: Any, w: torch.Tensor) -> torch.Tensor:
    """sum(values x weights) in float32 over the call's parts laid one after another (cuBLAS's dot
    per part: no temporaries of the output's size)."""
    total, at = None, 0
    for part in parts(result):
        n = part.numel()
        d = torch.dot(part.reshape(-1).to(torch.float32), w.narrow(0, at, n))
        total, at = d if total is None else total + d, at + n
    return total


def expected_digest(parts64: list[torch.Tensor], w: torch.Tensor, chunk: int) -> dict[str, float]:
    """The reference's digest of float64 parts with the child's float32 weights, and its scale, sum |w|
    (|ref| + the part's mean |ref|), which bounds how far values within the elementwise tolerance move the
    digest. A chunk at a time: whole float64 copies of the weights and |ref| would be three more outputs."""
    digest_, scale, at = 0.0, 0.0, 0
    for part in parts64:
        flat, n = part.double().reshape(-1), part.numel()
        mean = sum(float(flat[i:i + chunk].abs().sum()) for i in range(0, n, chunk)) / max(n, 1)
        for i in range(0, n, chunk):
            values, wd = flat[i:i + chunk], w[at + i:at + min(i + chunk, n)].double()
            digest_ += float(torch.dot(values, wd))
            scale += float(torch.dot(wd.abs_(), values.abs().add_(mean)))
        at += n
    return {"digest": digest_, "scale": scale}


def _clean_capture(device: str) -> None:
    """After a failed capture, one that succeeds: a failed one can leave torch's CUDA generator marked as
    capturing, so every later draw fails ("Offset increment outside graph capture") and with it an honest
    attempt whose forward merely cannot be captured. A clean capture resets the mark."""
    with contextlib.suppress(Exception):  # the attempt goes on; a later draw says what is wrong
        torch.cuda.synchronize()
        x = torch.zeros(1, device=device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x.add_(1.0)
        del graph


def unsplit_large_blocks() -> None:
    """Blocks over 512 MiB are never split by the caching allocator (call before the first CUDA
    allocation): split, a small tensor made later in a freed set's block kept the whole block reserved."""
    # torch 2.11 warns that the torch.cuda spelling is deprecated, in favour of this one.
    set_settings = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
    set_settings("max_split_size_mb:512")


def lone(set_bytes: int) -> bool:
    """A set that with its base is over PLAN.sets_bytes: a request keeps it alone and replays it once."""
    return 2 * set_bytes > PLAN.sets_bytes


def most_replays(n_seeds: int, set_bytes: int) -> int:
    """The replays a request may have (the parent's plan keeps to it): one for a lone set, else as
    many (set, mask) pairs as n_seeds sets and PLAN.sets_bytes of masks give."""
    return 1 if lone(set_bytes) else n_seeds * max(1, PLAN.sets_bytes // max(set_bytes, 1))


def set_count(n_seeds: int, set_bytes: int, l2_bytes: int, replays: int) -> int:
    """Input sets a request keeps: one where the set is lone, else a multiple of its seeds (set j holds
    seeds[j % n_seeds]) with about PLAN.cold_l2 L2s of traffic (three set sizes a replay) between a set's
    rewrite and its forward, within PLAN.max_sets, PLAN.sets_bytes and what the replays use."""
    if lone(set_bytes):
        return 1
    per = max(set_bytes, 1)
    want = math.ceil(PLAN.cold_l2 * l2_bytes / (3 * per)) + 1
    cap = min(PLAN.max_sets, PLAN.sets_bytes // (2 * per), max(replays, n_seeds))
    return min(math.ceil(want / n_seeds), max(cap // n_seeds, 1)) * n_seeds


class Captured:
    """A request's play, captured and waiting for `play`: one CUDA graph of every replay in order (each
    a rewrite of a later replay's inputs, the forward, the digest), and the graph that writes the
    first replays' inputs."""

    def __init__(self, model: Callable[..., Any], module, seeds: list[int], replays: int, digest_seed: int,
                 device: str, shared: tuple[list, list] | None = None):
        """`shared`: another Captured's (sets, bases) of the same request shape, read here too (the
        reference's null and eager, played one after the other: their values are no answer's)."""
        self.replays, self.device, self.n_seeds, self.module = replays, device, len(seeds), module
        first = shared[0][0] if shared else tasks.make_inputs(module, seeds[0], "base", device)
        n, k = layout(len(seeds), tasks.input_bytes(first), l2_bytes(device), replays)
        self.sets_bytes = tasks.input_bytes(first) * n  # the inputs' sets (their bases as much again)
        doms = tasks.domains(module, len(first))
        if shared and len(shared[0]) == n:
            sets, bases = shared
        else:
            sets = [first] + [tasks.make_inputs(module, seeds[j % len(seeds)], "base", device) for j in range(1, n)]
            bases = [[x.clone() if _perturbed(x, d) else None for x, d in zip(inputs, doms)] for inputs in sets]
        # Replay r's inputs are written at replay r - ahead (the prologue writes the first `ahead`):
        # the other sets' traffic in between takes them out of the L2.
        ahead = min(n - 1, replays)
        self.digests = torch.zeros(replays, dtype=torch.float32, device=device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # capture wants every lazy initialisation (cuBLAS's too) done before it
            w = None
            for inputs in sets:  # every set, so that a KeptNull (grad) makes its results outside the capture
                result = model(*inputs)
                if w is None:  # the digest's weights, one per value of the call's parts
                    w = weights(sum(p.numel() for p in parts(result)), digest_seed, device)
                digest(result, w)
        torch.cuda.current_stream().wait_stream(side)
        if isinstance(model, ForwardBackward):
            # Each set's upstream, drawn now from its seed (the reference draws the same): a draw
            # inside the capture would be baked into the graph as the capture's values anyway.
            for j, inputs in enumerate(sets):
                model.reseed(inputs, seeds[j % len(seeds)])
        torch.cuda.synchronize()
        # The warm-up's temporaries were cached on the side stream, and a capture draws on a pool of
        # its own: freed now, they are not held beside the capture's (a set's size each at KernelBench's).
        torch.cuda.empty_cache()
        self.doms, self.like, self.mask_count = doms, sets[0], k
        # Drawn again from each play's seed. A lone set under one mask holds its mask itself, rewritten in
        # place: a mask is as large as its set.
        self.masks = masks(sets[0], doms, 0, device, count=k, into=[sets[0]] if n == k == 1 else None)

        def rewrite(r: int) -> None:
            for x, b, m in zip(sets[r % n], bases[r % n], self.masks[r // n]):
                if b is not None:
                    perturb(b, m, out=x)

        # One memory pool for both graphs: what outlives a replay lives outside it, and a pool each
        # held a call's temporaries once per graph, in gradient mode its gradients and saved tensors too.
        pool = torch.cuda.graph_pool_handle()
        # No prologue where one set is all (nothing to write ahead): an empty graph cannot be replayed.
        self.prologue, self.graph = torch.cuda.CUDAGraph() if ahead else None, torch.cuda.CUDAGraph()
        try:
            if self.prologue is not None:
                with torch.cuda.graph(self.prologue, pool=pool):
                    for r in range(ahead):
                        rewrite(r)
            with torch.cuda.graph(self.graph, pool=pool):
                for r in range(replays):
                    if r + ahead < replays:
                        rewrite(r + ahead)
                    self.digests.narrow(0, r, 1).copy_(digest(model(*sets[r % n]), w).view(1))
        except Exception:
            _clean_capture(device)
            raise
        # What the graphs read and write lives as long as they do: the model too, whose KeptNull (grad) holds
        # the null's results.
        self.keep = (sets, bases, w, model)
        # Each graph launched once here, untimed: a graph's first launch uploads it to the device too,
        # a cost that varies with the graph's size and is no call's work.
        self.play_graphs()

    def rebase(self, seeds: list[int], digest_seed: int) -> bool:
        """A later request of the same shape on these graphs: the sets' bases (inputs where not perturbed)
        drawn again from `seeds` in place, the digest's weights from `digest_seed`; no capture, no memory back
        to the driver. False in gradient mode (a new upstream each seed) or where shapes or arguments differ."""
        sets, bases, w, model = self.keep
        if isinstance(model, ForwardBackward) or len(seeds) != self.n_seeds:
            return False
        for j, (inputs, base) in enumerate(zip(sets, bases)):
            fresh = tasks.make_inputs(self.module, seeds[j % len(seeds)], "base", self.device)
            if len(fresh) != len(inputs) or not all(
                    (x.shape, x.dtype) == (f.shape, f.dtype) if isinstance(x, torch.Tensor) else x == f for x, f in zip(inputs, fresh)):
                return False
            for x, b, f in zip(inputs, base, fresh):
                if isinstance(x, torch.Tensor):
                    (x if b is None else b).copy_(f)
        w.copy_(weights(w.numel(), digest_seed, self.device))
        torch.cuda.synchronize()
        return True

    def play_graphs(self) -> None:
        if self.prologue is not None:
            self.prologue.replay()
        self.graph.replay()
        torch.cuda.synchronize()

    def play(self, factor_seed: int) -> list[float]:
        """The masks from `factor_seed`, then the play's graphs, one device sync, the digests."""
        masks(self.like, self.doms, factor_seed, self.device, count=self.mask_count, into=self.masks)
        self.play_graphs()
        return self.digests.tolist()


def null_request(module, n_seeds: int, replays: int, out_shape: list[int], device: str, grad: bool = False,
                 shared: tuple[list, list] | None = None) -> Captured:
    """A null model's request shaped as a candidate's (zeros of the output's shape and dtype, in gradient
    mode of every gradient's too; only how many sets matters, not their seeds), which the reference
    replays beside the candidate's (Reference.play)."""
    null = null_model(module, tuple(out_shape), module.__kgen_dtype__ or torch.float32, device, grad)
    return Captured(null, module, list(range(1, n_seeds + 1)), replays, 0, device, shared)
