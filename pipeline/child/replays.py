"""Bound requests on a GPU, replayed from CUDA graphs: the parent's clock bounds a call's device time
down to calls of about 10 us (issue 27).

A Bound request made of eager calls costs the candidate's host work too (Python, launches): an
honest 11 us kernel cost 110 us a call on the parent's clock on the H100, so the bound needed 0.25
ms of slack and said nothing about short calls. Here the harness captures the model's forward once
per input set into a CUDA graph and replays the graphs back to back: the host launches one graph a
replay, and the parent's clock around the request measures the device's work. Each replay, in the
graph:

1. a counter on the device steps, and each float input of domain real or positive is rewritten as its
   set's base values times 1 + 0.05 sin(0.7 c + k) (c the replay's number from 1, k its set): no two
   replays see the same values, so a kernel that caches by content recomputes every time;
2. the L2 is flushed (a 256 MB fill), as before each of the child's timed calls;
3. the forward runs;
4. a digest of its output, sum(output x weights) with weights drawn from the request's secret seed,
   goes to the replay's slot.

The parent compares the digests of replays it chose in secret with the reference's (its float64
output for the same inputs, `inputs_for`): a replay whose work was skipped has the wrong digest. A
forward that cannot be captured (a host sync, a stream the graph does not know) fails the request;
the parent then falls back to eager Bound requests and says its bound is loose (pipeline.session).

`inputs_for` and `scale` are what the reference process uses to make a replay's inputs: the same
ops on the same device, so the values are the child's bit for bit.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from . import tasks
from .timing import L2_FLUSH_BYTES

AMPLITUDE = 0.05
PERTURBED = ("real", "positive")  # a positive factor keeps both domains


def scale(replay: int, k: int, device: str) -> torch.Tensor:
    """The factor replay number `replay` (from 0) of set `k` applies, as the graph computes it."""
    count = torch.tensor(float(replay + 1), device=device, dtype=torch.float32)
    return 1 + AMPLITUDE * torch.sin(count * 0.7 + k)


def _perturbed(x: Any, domain: str) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and domain.partition(":")[0] in PERTURBED


def inputs_for(module, seeds: list[int], replay: int, device: str) -> list[Any]:
    """Replay `replay`'s inputs of a request whose sets come from `seeds` (the reference's copy)."""
    k = replay % len(seeds)
    inputs = tasks.make_inputs(module, seeds[k], "base", device)
    factor = scale(replay, k, device)
    return [x * factor.to(x.dtype) if _perturbed(x, d) else x
            for x, d in zip(inputs, tasks.domains(module, len(inputs)))]


def weights(numel: int, seed: int, device: str) -> torch.Tensor:
    """The digest's weights, one per output value, from the request's secret seed."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return torch.randn(numel, generator=gen, device=device, dtype=torch.float32)


def digest(output: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum(output x weights) in float32 (cuBLAS's dot: no temporaries of the output's size)."""
    return torch.dot(output.reshape(-1).to(torch.float32), w)


def _clean_capture(device: str) -> None:
    """After a capture that failed, one that succeeds: a failed capture can leave torch's CUDA
    generator marked as capturing, and every later random draw on the device then fails ("Offset
    increment outside graph capture", seen on the H200), which would end an honest attempt whose
    forward merely cannot be captured. A clean capture's prologue and epilogue reset that mark."""
    try:
        torch.cuda.synchronize()
        x = torch.zeros(1, device=device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x.add_(1.0)
        del graph
    except Exception:  # noqa: BLE001 - the attempt goes on; a later draw says what is wrong
        pass


def replay(model: Callable[..., Any], module, seeds: list[int], replays: int, digest_seed: int,
           out_numel: int, device: str) -> list[float]:
    """Capture the forward once per input set, replay `replays` times round-robin, one device sync,
    and the digest of every replay. Raises where the forward cannot be captured."""
    sets = [tasks.make_inputs(module, seed, "base", device) for seed in seeds]
    doms = tasks.domains(module, len(sets[0]))
    bases = [[x.clone() if _perturbed(x, d) else None for x, d in zip(inputs, doms)] for inputs in sets]
    w = weights(out_numel, digest_seed, device)
    digests = torch.zeros(replays, dtype=torch.float32, device=device)
    count = torch.zeros((), dtype=torch.float32, device=device)
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # capture wants every lazy initialisation (cuBLAS's too) done before it
        for inputs in sets:
            out = model(*inputs)
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"the model returned {type(out).__name__}, not a tensor")
            digest(out, w)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graphs = []
    try:
        for k, (inputs, base) in enumerate(zip(sets, bases)):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                count.add_(1.0)
                factor = 1 + AMPLITUDE * torch.sin(count * 0.7 + k)
                for x, b in zip(inputs, base):
                    if b is not None:
                        torch.mul(b, factor.to(b.dtype), out=x)
                flush.fill_(1.0)
                out = model(*inputs)
                digests.index_copy_(0, (count - 1).long().view(1), digest(out, w).view(1))
            graphs.append(graph)
    except Exception:
        _clean_capture(device)
        raise
    for r in range(replays):
        graphs[r % len(graphs)].replay()
    torch.cuda.synchronize()
    return digests.tolist()
