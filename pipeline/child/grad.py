"""Gradient mode: one call is the forward and the backward, on both sides of the judge.

The candidate's child wraps ModelNew, the reference process wraps Model (float32 or the run's dtype
for the baselines, float64 for the expected values), in the same `ForwardBackward`: the floating
inputs become leaves that require gradients (integer inputs never do), the forward runs, and
`torch.autograd.grad` takes the gradient of the output against every floating input and every
parameter with one upstream gradient. The call returns a `Grads`: the output and the gradients,
written one after another into one outbox slot and compared part by part by the parent
(pipeline.judge), so the timing, the checked calls and the bound on the parent's clock all cover
forward plus backward with no machinery of their own.

The upstream gradient is ones for a one-element output (a loss), otherwise normal values drawn from
the attempt's init seed, which the child learns only in Setup, with the candidate already imported:
a backward that assumes ones where it is not given ones is wrong. It is made once per output shape
and kept, so no timed call pays for drawing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

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


def input_labels(inputs: list[Any]) -> list[str]:
    return [f"input {i}" for i, x in enumerate(inputs) if _wants_grad(x)]


def _wants_grad(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


class ForwardBackward:
    """`model` called as forward plus backward; `upstream_seed` picks a non-scalar output's upstream
    gradient. Any exception but GradError is the model's own (a runtime error)."""

    def __init__(self, model, upstream_seed: int, upstream_dtype: torch.dtype | None = None):
        self.model = model
        self.seed = upstream_seed
        # The float64 reference takes the upstream rounded as the candidate's dtype gets it.
        self.round_to = upstream_dtype
        self.params = [(name, p) for name, p in model.named_parameters() if p.requires_grad] \
            if isinstance(model, torch.nn.Module) else []
        self.upstreams: dict[tuple, torch.Tensor] = {}

    def upstream(self, out: torch.Tensor) -> torch.Tensor:
        key = (tuple(out.shape), out.dtype, str(out.device))
        if key not in self.upstreams:
            if out.numel() == 1:
                g = torch.ones(out.shape, dtype=out.dtype, device=out.device)
            else:  # drawn on the cpu, so the reference and the child draw the same values on any device
                gen = torch.Generator().manual_seed(self.seed ^ UPSTREAM_SALT)
                g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
                g = g.to(self.round_to or out.dtype).to(out.device, out.dtype)
            self.upstreams[key] = g
        return self.upstreams[key]

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
            labels = input_labels(list(inputs)) + [f"parameter {name}" for name, _ in self.params]
            grads = torch.autograd.grad(out, wanted + [p for _, p in self.params], self.upstream(out),
                                        allow_unused=True)
        missing = [label for label, g in zip(labels, grads) if g is None]
        if missing:
            raise GradError("missing_gradient", f"no gradient for {', '.join(missing)}: its backward returned "
                            "None (or it never used that input)")
        return Grads(out.detach(), [g.detach() for g in grads], labels)
