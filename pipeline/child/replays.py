"""Bound requests on a GPU, replayed from CUDA graphs: the parent's clock bounds a call's device time
down to calls of about 10 us.

A Bound request made of eager calls costs the candidate's host work too (Python, launches): an
honest 11 us kernel cost 110 us a call on the parent's clock on the H100, so the bound needed 0.25
ms of slack and said nothing about short calls. Here a request comes in two steps. `capture` (not
timed): the harness captures the model's forward once per input set into a CUDA graph. `play`
(timed by the parent): the harness writes each replay's factor, drawn from a seed that arrives only
with this step, into a table on the device, replays the graphs back to back (the host launches one
graph a replay) and syncs; the parent's clock around it measures the device's work. Capturing
inside the window cost milliseconds that varied from request to request, and put the H200's
estimate of a 10 us call anywhere from 0 to 6 us. Each replay, in the graph:

1. each float input of domain real or positive is rewritten as its set's base values times
   (1 + (f - 1) x mask), f the replay's factor (1 +- 0.05, from the table, by a counter on the
   device) and the mask values in [-1, 1] drawn on the device from the `play` seed, one mask per
   input for the request: no two replays see the same values, none can be known before `play`, and
   no answer computed from the bases at the capture (untimed) can be scaled into the replay's (a
   scalar factor let a homogeneous forward, mse's, precompute its answer and multiply by f^2), so
   the work is done in the window;
2. the forward runs;
3. a digest of its output, sum(output x weights) with weights drawn from the request's secret seed,
   goes to the replay's slot. In gradient mode a call is the forward and the backward
   (pipeline.child.grad): the graph holds both, each set's upstream gradient is drawn from its seed
   before the capture, and the digest runs over the output and every gradient, one after another.

Nothing else runs in the window: whatever of the harness's own work the calibration subtracts, a
candidate could leave out (rebinding torch's fill_ would drop an L2 flush from its graphs, and the
flush's 60 us a replay would come off its estimate), so the replays do only what a correct digest
needs. The inputs are read cold without a flush: a set is rewritten a round ahead of its forward and
the other sets' traffic in between takes it out of the L2 (`set_count`). A candidate that bent the
harness's own rewrites to land just before its forward would read warm inputs and take the L2's
speed-up off its estimate, no more (docs/decisions/gpu-timing.md).

The parent compares the digests of replays it chose in secret with the reference's (its float64
output for the same inputs, `inputs_for`): a replay whose work was skipped has the wrong digest. A
forward that cannot be captured (a host sync, a stream the graph does not know) fails the request;
the parent then falls back to eager Bound requests and says its bound is loose (pipeline.judge.session).

`inputs_for` and `factor` are what the reference process uses to make a replay's inputs: the same
values and ops on the same device, so the inputs are the child's bit for bit.
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
    """Each replay's inputs are its set's bases times a factor within 1 +- this."""
    perturbed: tuple[str, ...] = ("real", "positive")
    """The input domains a factor is applied to: a positive factor keeps both."""
    # Cold replays. Rewriting a set's inputs right before its forward would leave them in the L2, and
    # graphs launched one replay at a time are bound by the host's launches: at 8-20 us a call the
    # estimate would read far below an honest kernel's claim (docs/decisions/gpu-timing.md). So a set
    # is rewritten one round ahead of its forward, with enough sets that about cold_l2 times the L2 is
    # touched in between, and a round of at least round_replays replays is one graph launch.
    cold_l2: int = 3
    max_sets: int = 64
    round_replays: int = 32
    sets_bytes: int = 1 << 30
    """Bases and inputs of every set together, at most."""


PLAN = Plan()


def factors(factor_seed: int, replays: int) -> torch.Tensor:
    """The first `replays` replays' factors (float32, on the cpu): 1 +- PLAN.amplitude, from the request's
    `play` seed, drawn in one call of a seeded generator. The table is made inside the parent's window:
    a Python draw per replay costs over a third of a 512-replay request, with jitter tens of times the
    graphs' own variation (docs/decisions/gpu-timing.md)."""
    gen = torch.Generator()
    gen.manual_seed(factor_seed % (1 << 63))
    u = torch.rand(replays, generator=gen, dtype=torch.float64)
    return (1.0 + PLAN.amplitude * (2.0 * u - 1.0)).to(torch.float32)


def factor(factor_seed: int, replay: int) -> float:
    """Replay number `replay`'s factor (from 0), as the table holds it."""
    return float(factors(factor_seed, replay + 1)[replay])


def table(factor_seed: int, replays: int, device: str) -> torch.Tensor:
    return factors(factor_seed, replays).to(device)


def _perturbed(x: Any, domain: str) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and domain.partition(":")[0] in PLAN.perturbed


def masks(like: list[Any], doms: list[str], factor_seed: int, device: str, into: list | None = None) -> list:
    """The request's masks, one per perturbed input (None for the others), in [-1, 1], drawn in input
    order on the device from the `play` seed (into the tensors `into` holds, where given)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(factor_seed % (1 << 63))
    out = []
    for k, (x, d) in enumerate(zip(like, doms)):
        if not _perturbed(x, d):
            out.append(None)
            continue
        m = into[k] if into is not None else torch.empty_like(x)
        out.append(m.uniform_(-1.0, 1.0, generator=gen))
    return out


def perturb(base: torch.Tensor, f: torch.Tensor, mask: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """base x (1 + (f - 1) x mask), in base's dtype (f: a one-value tensor on the device)."""
    return torch.addcmul(base, base, mask * (f.to(base.dtype) - 1), out=out) if out is not None else \
        torch.addcmul(base, base, mask * (f.to(base.dtype) - 1))


def inputs_for(module, seeds: list[int], replay: int, factor_seed: int, device: str) -> list[Any]:
    """Replay `replay`'s inputs of a request whose sets come from `seeds` (the reference's copy)."""
    inputs = tasks.make_inputs(module, seeds[replay % len(seeds)], "base", device)
    f = torch.tensor([factor(factor_seed, replay)], dtype=torch.float32, device=device)
    ms = masks(inputs, tasks.domains(module, len(inputs)), factor_seed, device)
    return [perturb(x, f, m) if m is not None else x for x, m in zip(inputs, ms)]


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
    """The reference's digest of float64 parts with the child's float32 weights, and its scale:
    sum |w| (|ref| + the part's mean |ref|), which bounds how far parts within the elementwise
    tolerance can move the digest. A chunk at a time: whole float64 copies of the weights and |ref|
    would be three more outputs."""
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
    """After a capture that failed, one that succeeds: a failed capture can leave torch's CUDA
    generator marked as capturing, and every later random draw on the device then fails ("Offset
    increment outside graph capture", seen on the H200), which would end an honest attempt whose
    forward merely cannot be captured. A clean capture's prologue and epilogue reset that mark."""
    with contextlib.suppress(Exception):  # the attempt goes on; a later draw says what is wrong
        torch.cuda.synchronize()
        x = torch.zeros(1, device=device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x.add_(1.0)
        del graph


def set_count(n_seeds: int, set_bytes: int, l2_bytes: int, replays: int) -> int:
    """Input sets a request keeps: a multiple of its seeds (set j holds seeds[j % n_seeds], so replay
    r's set holds the reference's seeds[r % n_seeds]) with about PLAN.cold_l2 L2s of traffic between a
    set's rewrite and its forward (each replay in between reads its base, writes and reads its
    inputs: three times a set's bytes), within PLAN.max_sets, PLAN.sets_bytes and what the replays use."""
    per = max(set_bytes, 1)
    want = math.ceil(PLAN.cold_l2 * l2_bytes / (3 * per)) + 1
    cap = min(PLAN.max_sets, PLAN.sets_bytes // (2 * per), max(replays, n_seeds))
    return min(math.ceil(want / n_seeds), max(cap // n_seeds, 1)) * n_seeds


class Captured:
    """A request's graphs, captured and waiting for `play`: one a set (its replay), a round (every
    set's replay in order, repeated up to PLAN.round_replays) and the prologue that writes the first
    round's inputs."""

    def __init__(self, model: Callable[..., Any], module, seeds: list[int], replays: int, digest_seed: int,
                 device: str):
        self.replays, self.device = replays, device
        first = tasks.make_inputs(module, seeds[0], "base", device)
        l2 = getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 0)
        n = set_count(len(seeds), tasks.input_bytes(first), l2, replays)
        self.sets_bytes = tasks.input_bytes(first) * n  # the inputs' sets (their bases as much again)
        sets = [first] + [tasks.make_inputs(module, seeds[j % len(seeds)], "base", device) for j in range(1, n)]
        doms = tasks.domains(module, len(sets[0]))
        bases = [[x.clone() if _perturbed(x, d) else None for x, d in zip(inputs, doms)] for inputs in sets]
        # Replay r's inputs are written at replay r - ahead (the prologue writes the first `ahead`):
        # the other sets' traffic in between takes them out of the L2.
        self.ahead = ahead = n - 1
        self.digests = torch.zeros(replays, dtype=torch.float32, device=device)
        self.table = torch.ones(replays + ahead, dtype=torch.float32, device=device)
        self.count = torch.zeros((), dtype=torch.long, device=device)
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

        self.doms, self.masks = doms, masks(sets[0], doms, 0, device)  # drawn again from each play's seed

        def rewrite(j: int, f: torch.Tensor) -> None:
            for x, b, m in zip(sets[j], bases[j], self.masks):
                if b is not None:
                    perturb(b, f, m, out=x)

        def replay(j: int) -> None:
            at = self.count.view(1)
            rewrite((j + ahead) % n, self.table.index_select(0, at + ahead))
            out = model(*sets[j])
            self.digests.index_copy_(0, at, digest(out, w).view(1))
            self.count.add_(1)

        self.graphs, self.round, self.prologue = [], None, None
        # One memory pool for every graph: they run one after another on one stream and keep nothing
        # of theirs past a replay (what outlives one lives outside the pool), and a pool each held a
        # call's temporaries once per graph, in gradient mode its gradients and saved tensors too.
        pool = torch.cuda.graph_pool_handle()
        try:
            if ahead:
                self.prologue = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.prologue, pool=pool):
                    for j in range(ahead):
                        rewrite(j, self.table.narrow(0, j, 1))
            for j in range(n):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    replay(j)
                self.graphs.append(graph)
            self.round_replays = n * math.ceil(PLAN.round_replays / n)
            if self.round_replays <= replays:
                self.round = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.round, pool=pool):
                    for r in range(self.round_replays):
                        replay(r % n)
        except Exception:
            _clean_capture(device)
            raise
        # What the graphs read and write lives as long as they do: the model too, whose KeptNull (grad) holds
        # the null's results (the reference's null, freed with its model, once had graphs write freed memory).
        self.keep = (sets, bases, w, model)
        self.like = sets[0]
        self._upload()

    def _upload(self) -> None:
        """Each graph `play` launches, launched once here, untimed: a graph's first launch uploads it to
        the device too, a cost that varies with the graph's size and is no call's work."""
        self.table.fill_(1.0)
        self.count.zero_()
        if self.prologue is not None:
            self.prologue.replay()
        tail = self.replays  # the replays after the whole rounds: single graphs (at most replays in all)
        if self.round is not None:
            self.round.replay()
            tail = self.replays % self.round_replays
        for j in sorted({r % len(self.graphs) for r in range(tail)}):
            self.graphs[j].replay()
        torch.cuda.synchronize()

    def play(self, factor_seed: int) -> list[float]:
        """The factors and masks from `factor_seed`, then every replay in order (whole rounds, then
        single replays), one device sync, the digests."""
        self.table.copy_(table(factor_seed, self.replays + self.ahead, self.device))
        masks(self.like, self.doms, factor_seed, self.device, into=self.masks)
        self.count.zero_()
        if self.prologue is not None:
            self.prologue.replay()
        done = 0
        while self.round is not None and self.replays - done >= self.round_replays:
            self.round.replay()
            done += self.round_replays
        for r in range(done, self.replays):
            self.graphs[r % len(self.graphs)].replay()
        torch.cuda.synchronize()
        return self.digests.tolist()


def null_request(module, n_seeds: int, replays: int, out_shape: list[int], device: str, grad: bool = False) -> Captured:
    """A null model's request shaped as a candidate's (the child's null model: zeros of the output's
    shape and dtype, in gradient mode of every gradient's too; values from any seeds, only how many
    sets matters), which the reference replays beside the candidate's
    (pipeline.judge.reference.Reference.null_play)."""
    null = null_model(module, tuple(out_shape), module.__kgen_dtype__ or torch.float32, device, grad)
    return Captured(null, module, list(range(1, n_seeds + 1)), replays, 0, device)
