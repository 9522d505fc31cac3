"""Gradient mode: one call is the forward and the backward, on both sides of the judge.

The child wraps ModelNew and the reference process Model in the same `ForwardBackward`: floating inputs
become leaves and a call returns `Grads` (the output, then its gradients against every floating input
and parameter) in one outbox slot, so timing and checks cover forward plus backward unchanged. Each
call's upstream gradient comes from that call's secret seed (`reseed`; the reference draws the same),
with random signs and magnitudes far from 0 and 1, so a backward that ignores it is `wrong_gradient`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from . import tasks

UPSTREAM_SALT = 0x6A09E667  # keeps the upstream draw apart from the model's weights under the same seed


class GradError(RuntimeError):
    """The candidate's call has no usable gradient; `kind` is the verdict's name."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass
class Grads:
    """One gradient-mode call's result: the output, then one gradient per floating input, then one
    per parameter, each in the order `labels` names (after the output)."""

    output: torch.Tensor
    grads: list[torch.Tensor]
    labels: list[str]


def _wants_grad(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def draw_upstream(seed: int, shape, dtype: torch.dtype, device, round_to: torch.dtype | None = None) -> torch.Tensor:
    """The upstream gradient for `seed`: drawn in float32 on `device` (as tasks.make_inputs draws, so
    the reference process and the child get bitwise the same values), rounded to `round_to` (the
    candidate's dtype, for the float64 reference) or `dtype`, then cast to `dtype`."""
    gen = torch.Generator(device=device)
    gen.manual_seed((seed ^ UPSTREAM_SALT) & 0x7FFFFFFFFFFFFFFF)
    u = torch.rand(shape, generator=gen, device=device)
    sign = torch.randint(0, 2, shape, generator=gen, device=device).to(torch.float32) * 2 - 1
    mag = torch.where(u < 0.5, 0.25 + u, 1.5 + 5 * (u - 0.5))
    return (sign * mag).to(round_to or dtype).to(dtype)


class ForwardBackward:
    """`model` called as forward plus backward; `upstream_seed` draws the upstream of a call on a set
    that `reseed` never named. Any exception but GradError is the model's own (a runtime error)."""

    def __init__(self, model, upstream_seed: int, upstream_dtype: torch.dtype | None = None):
        self.model = model
        self.seed = upstream_seed
        # The float64 reference takes the upstream rounded as the candidate's dtype gets it.
        self.round_to = upstream_dtype
        self.params = [(name, p) for name, p in model.named_parameters() if p.requires_grad] \
            if isinstance(model, torch.nn.Module) else []
        self.upstreams: dict[tuple, torch.Tensor] = {}  # the default seed's, per output shape
        # Per input set, keyed by the id of its first tensor: (a weak reference to that tensor, the
        # seed, the upstream drawn or None until the output's shape is known).
        self.seeded: dict[int, tuple[weakref.ref, int, torch.Tensor | None]] = {}
        self.last: tuple | None = None  # the last output's (shape, dtype, device)

    def reseed(self, inputs: list[Any], seed: int) -> None:
        """The next calls on `inputs` take the upstream drawn from `seed`, drawn now where an earlier
        call told the output's shape (so no timed call pays for it), else at that call."""
        key = _first_tensor(inputs)
        self.seeded = {k: v for k, v in self.seeded.items() if v[0]() is not None}  # sets since freed
        if key is None:
            self.seed = seed  # no tensor to tell sets apart: the next call is this seed's
            return
        drawn = draw_upstream(seed, *self.last, self.round_to) if self.last else None
        self.seeded[id(key)] = (weakref.ref(key), seed, drawn)

    def upstream(self, inputs: tuple, out: torch.Tensor) -> torch.Tensor:
        self.last = (tuple(out.shape), out.dtype, out.device)
        key = _first_tensor(inputs)
        entry = self.seeded.get(id(key)) if key is not None else None
        if entry is not None and entry[0]() is key:
            _, seed, g = entry
            if g is None or (tuple(g.shape), g.dtype, g.device) != self.last:
                g = draw_upstream(seed, *self.last, self.round_to)
                self.seeded[id(key)] = (entry[0], seed, g)
            return g
        cache = (self.seed, *self.last)
        if cache not in self.upstreams:
            self.upstreams[cache] = draw_upstream(self.seed, *self.last, self.round_to)
        return self.upstreams[cache]

    def __call__(self, *inputs: Any) -> Grads:
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(True) if _wants_grad(x) else x for x in inputs]
            out = self.model(*leaves)
            if not isinstance(out, torch.Tensor):
                return out  # judged as a wrong type by the parent, like any forward
            if not out.requires_grad or out.grad_fn is None:
                raise GradError("no_gradient", "the output has no gradient: it is detached from the inputs "
                                "(a kernel without a backward, or a result cut from the graph)")
            wanted = [x for x in leaves if _wants_grad(x)]
            labels = [f"input {i}" for i, x in enumerate(inputs) if _wants_grad(x)] + \
                [f"parameter {name}" for name, _ in self.params]
            grads = torch.autograd.grad(out, wanted + [p for _, p in self.params], self.upstream(inputs, out),
                                        allow_unused=True)
        missing = [label for label, g in zip(labels, grads) if g is None]
        if missing:
            raise GradError("missing_gradient", f"no gradient for {', '.join(missing)}: its backward returned "
                            "None (or it never used that input)")
        return Grads(out.detach(), [g.detach() for g in grads], labels)


def null_model(module, shape: tuple, dtype: torch.dtype, device: str, grad: bool) -> KeptNull:
    """The null model a calibration times in the candidate's place: zeros of the output's shape; in
    gradient mode with zeros of every floating input's and parameter's shape too, so it copies (and a
    replay's digest reads) as many values as a real call; made once an input set (KeptNull)."""
    if grad:
        meta = tasks.make_model(module, module.Model, 0, "meta")
        params = [p.shape for p in meta.parameters()] if isinstance(meta, torch.nn.Module) else []

        def make(*inputs):
            wanted = [x for x in inputs if _wants_grad(x)]
            grads = [torch.zeros_like(x) for x in wanted] + [torch.zeros(s, device=device, dtype=dtype) for s in params]
            return Grads(torch.zeros(shape, device=device, dtype=dtype), grads, [])
    else:
        def make(*inputs):
            return torch.zeros(shape, device=device, dtype=dtype)
    return KeptNull(make)


class KeptNull:
    """A null model whose result for an input set (keyed by its first tensor's storage) is made once and
    handed back at every later call on it, so the null the calibration subtracts reads no input and writes
    no output: only the protocol's cost is subtracted (docs/decisions/cpu-timing.md)."""

    def __init__(self, make, most: int = 128):
        self.make, self.most, self.kept = make, most, {}

    def __call__(self, *inputs):
        key = next((x.data_ptr() for x in inputs if isinstance(x, torch.Tensor)), None)
        if key not in self.kept:
            if len(self.kept) >= self.most:  # sets made afresh each request (eager GPU requests)
                self.kept.clear()
            self.kept[key] = self.make(*inputs)
        return self.kept[key]


def _first_tensor(inputs) -> torch.Tensor | None:
    return next((x for x in inputs if isinstance(x, torch.Tensor)), None)


def reseed(model, inputs: list[Any], seed: int) -> None:
    """`ForwardBackward.reseed` where `model` is one (gradient mode); nothing for a forward."""
    if isinstance(model, ForwardBackward):
        model.reseed(inputs, seed)
