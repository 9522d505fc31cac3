"""Where a candidate's call spent its time (the harness's Profile requests): the torch profiler's
kernels and ops, split into the candidate's own and PyTorch's. A claim: the parent decides
`no_custom_kernel` from it and its own checks.
"""

from __future__ import annotations

from typing import Any

from . import tasks
from .grad import reseed


def profile(model, module, warm_seed: int, device: str, own: list[str] = (), repeats: int = 1,
            short_us: float = 0.0) -> dict[str, Any]:
    """Where one call's time went: the candidate's own code, or PyTorch's kernels and ops. On the cpu
    a call whose span is under `short_us` is profiled again, `repeats` times at most; the median share wins."""
    import torch

    inputs = tasks.make_inputs(module, warm_seed, "base", device)
    cuda = device.startswith("cuda")
    found = []
    for _ in range(1 if cuda else repeats):
        reseed(model, inputs, warm_seed)  # gradient mode: the call's upstream, from the same seed
        with torch.no_grad(), _profiler(cuda) as prof:
            model(*inputs)
            if cuda:
                torch.cuda.synchronize()
        found.append(summarize_profile(prof.function_events, cuda, own))
        if (found[-1]["total_us"] or 0) >= short_us:
            break
    # The median share: one preemption in a short call's span can put a pure-PyTorch call under half.
    return sorted(found, key=lambda f: f["torch_fraction"] or 0.0)[len(found) // 2]


def _profiler(cuda: bool):
    """torch.autograd's profiler, which torch.profiler.profile wraps without importing inductor and dynamo
    at its first start. use_kineto as the wrapper sets it: without it a GPU call shows no kernel events."""
    from torch.autograd import profiler

    return profiler.profile(use_cpu=True, use_device="cuda" if cuda else None, use_kineto=True)


# Ops that only allocate or reshape: a custom kernel legitimately calls them.
_CHEAP_OPS = ("aten::empty", "aten::zeros", "aten::ones", "aten::view", "aten::reshape", "aten::contiguous",
              "aten::as_strided", "aten::resize", "aten::to", "aten::_to_copy", "aten::detach", "aten::lift",
              "aten::item", "aten::_local_scalar_dense", "aten::select", "aten::slice", "aten::expand",
              "aten::alias", "aten::unsqueeze", "aten::squeeze", "aten::fill_", "aten::zero_", "aten::copy_",
              "aten::empty_strided", "aten::empty_like", "aten::zeros_like", "aten::t", "aten::transpose",
              "aten::div", "aten::div_", "aten::mul", "aten::mul_", "aten::resolve",
              "aten::set_", "aten::new_empty")  # the last two: Triton's interpreter moving its buffers
_TORCH_KERNEL_MARKS = ("at::native", "at::cuda", "void at::", "cutlass", "cublas", "cudnn", "gemm", "triton_",
                       "cub::", "reduce_kernel", "elementwise_kernel", "vectorized_elementwise")


def torch_kernel(name: str, own: list[str] | tuple[str, ...] = ()) -> bool:
    """Whether a GPU kernel is PyTorch's (ATen, cuBLAS, inductor's triton_*), not the candidate's:
    a kernel named after one of the candidate's own Triton functions is always its own."""
    if any(name == k or name.startswith(k + "_") for k in own):
        return False
    return any(m in name for m in _TORCH_KERNEL_MARKS)


def summarize_profile(events, cuda: bool, own: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    if cuda:
        kernels: dict[str, float] = {}
        for e in events:
            if str(e.device_type).endswith("CUDA") and not e.name.startswith(("Memcpy", "Memset")):
                kernels[e.name] = kernels.get(e.name, 0.0) + e.device_time_total
        total = sum(kernels.values())
        torch_time = sum(t for n, t in kernels.items() if torch_kernel(n, own))
        top = sorted(kernels.items(), key=lambda kv: -kv[1])[:8]
        return {"total_us": total, "torch_us": torch_time, "top": top,
                "torch_fraction": torch_time / total if total else None}
    # On the CPU, time inside aten ops that compute (not allocate) is PyTorch doing the work; the
    # candidate's extension function is invisible to the profiler, so the rest of the call is its.
    ops = [e for e in events if e.name.startswith("aten::")]
    compute = sum(e.self_cpu_time_total for e in ops if not e.name.startswith(_CHEAP_OPS))
    # Outermost ops only, so nested children are not counted twice.
    ends = [(e.time_range.start, e.time_range.end) for e in events]
    span = (max(e for _, e in ends) - min(s for s, _ in ends)) if ends else 0.0
    top: dict[str, float] = {}
    for e in ops:
        top[e.name] = top.get(e.name, 0.0) + e.self_cpu_time_total
    return {"total_us": span, "torch_us": compute,
            "top": sorted(top.items(), key=lambda kv: -kv[1])[:8],
            "torch_fraction": compute / span if span else None}


def warm_profiler(device: str) -> None:
    """Pay a process's first profiler session (CUPTI's start, seconds) while this child is a spare,
    not inside the attempt."""
    import torch

    x = torch.ones(1024, device=device)
    with _profiler(cuda=True):
        x.sum()
        torch.cuda.synchronize()
