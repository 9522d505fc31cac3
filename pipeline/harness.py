"""The sandboxed child's side: the only module that imports candidate code.

    python -m pipeline.harness --result-fd N build CODE_PATH
    python -m pipeline.harness --result-fd N eval        (job and plan arrive as JSON lines on stdin)

It never imports store, config or llm, never sees the database or a secret. It learns the task,
the code path and the device first; the seeds arrive only after the candidate is imported, so
module-level code cannot precompute answers. It returns raw outputs (as digests) and clocks; the
parent judges them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import resource
import sys
import traceback
from pathlib import Path
from typing import Any

from . import landlock, tasks, timing, wire
from .timing import Clock

# The harness keeps its own references: a candidate that rebinds these module attributes later
# does not change what the harness calls.
_send = wire.send


SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys", "/opt")
# Of /proc, only the system-wide files libraries read (CPU and memory info, kernel settings, the
# NVIDIA driver's) and this process's own entry. Never all of /proc: Landlock does not stop reading
# another process's /proc/PID/environ, so the parent's or the user's shell's API keys would leak.
PROC_READ = ("cpuinfo", "meminfo", "stat", "loadavg", "uptime", "version", "filesystems", "devices",
             "modules", "swaps", "sys", "driver")


def proc_paths() -> list[str]:
    return [f"/proc/{name}" for name in PROC_READ] + [f"/proc/{os.getpid()}"]


def readable_paths(extra: list[str]) -> list[str]:
    """What the child may read: the system, Python and its packages, our package, and the files of
    this job; not the project folder itself, where the database lives."""
    ours = str(Path(__file__).resolve().parent)
    project = str(Path(ours).parent)
    paths = [*SYSTEM_READ, *proc_paths(), sys.prefix, sys.base_prefix, sys.exec_prefix, ours, *extra]
    paths += [p for p in sys.path if p and os.path.isdir(p) and os.path.abspath(p) != project]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            paths.append(os.environ[var])
    return paths


# seccomp, per machine: (audit arch, setsid's number, seccomp's number).
_SECCOMP_ABI = {"x86_64": (0xC000003E, 112, 317), "aarch64": (0xC00000B7, 157, 277)}


def forbid_setsid() -> bool:
    """A seccomp filter, on every thread and inherited by everything started later: setsid() fails
    with EPERM, so no process of ours can leave the session that sandbox.Child.kill sweeps (a new
    process group is still allowed: ninja puts each compile in one). Syscalls of a foreign ABI
    (x32, i386 through int 0x80), where the numbers differ, are refused outright. True when it holds."""
    import ctypes
    import errno
    import platform
    import struct

    abi = _SECCOMP_ABI.get(platform.machine())
    if abi is None:
        return False
    arch, setsid, seccomp = abi
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    program = [
        (load, 0, 0, 4),            # 0: A = seccomp_data.arch
        (jeq, 1, 0, arch),          # 1: native ABI -> 3
        (ret, 0, 0, deny),          # 2: foreign ABI
        (load, 0, 0, 0),            # 3: A = seccomp_data.nr
        (jge, 2, 0, 0x40000000),    # 4: x32 -> 7
        (jeq, 1, 0, setsid),        # 5: setsid -> 7
        (ret, 0, 0, allow),         # 6
        (ret, 0, 0, deny),          # 7
    ]
    code = b"".join(struct.pack("=HBBI", *insn) for insn in program)
    buf = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(program), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS, required for an unprivileged filter
        return False
    # SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC: every thread torch already started too.
    return libc.syscall(ctypes.c_long(seccomp), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.byref(prog)) == 0


def apply_limits(memory_gb: float | None, cuda: bool, read: list[str], write: list[str]) -> bool:
    """Limits the child sets on itself before any candidate code runs; True when Landlock holds."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if not forbid_setsid():
        print("[kgen] seccomp unavailable: a process of the candidate could leave the session", flush=True)
    if memory_gb and not cuda:  # CUDA reserves huge virtual ranges, so an address-space cap breaks it
        cap = int(memory_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    home = os.environ.get("HOME", "")
    ext = os.environ.get("TORCH_EXTENSIONS_DIR", "")
    writable = [p for p in (home, ext, "/dev/shm", *write) if p]
    if os.environ.get("KGEN_LANDLOCK", "1") == "0":
        return False
    return landlock.restrict(readable_paths(read + writable), writable)


def import_candidate(code_path: str, force_verbose_build: bool = False):
    if force_verbose_build:
        # The build log must hold the compiler's full text, whatever `verbose` the candidate passed.
        import torch.utils.cpp_extension as ce

        original = ce.load_inline

        def load_inline(*args, **kwargs):
            kwargs["verbose"] = True
            return original(*args, **kwargs)

        ce.load_inline = load_inline
    spec = importlib.util.spec_from_file_location("kgen_candidate", code_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kgen_candidate"] = module
    spec.loader.exec_module(module)
    return module


def run_build(fd: int, code_path: str) -> int:
    if not apply_limits(None, True, [code_path], []):
        print("[kgen] landlock unavailable: the build runs without filesystem confinement", flush=True)
    try:
        import_candidate(code_path, force_verbose_build=True)
    except BaseException as exc:  # noqa: BLE001 - any failure of hostile code is a build failure
        traceback.print_exc()
        _send(fd, {"event": "build", "ok": False, "error": f"{type(exc).__name__}: {_first_line(exc)}"})
        return 1
    _send(fd, {"event": "build", "ok": True})
    return 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else ""


def _error(exc: BaseException) -> dict[str, Any]:
    return {"error": f"{type(exc).__name__}: {_first_line(exc)}", "traceback": traceback.format_exc()[-4000:]}


class Evaluator:
    def __init__(self, fd: int, job: dict[str, Any]):
        self.fd = fd
        self.job = job
        self.device = job["device"]
        self.task = tasks.load_file(Path(job["task_path"]))
        self.modules = {}  # size name -> task module with that size's globals

    def module(self, size: str | dict[str, Any]):
        key = json.dumps(size, sort_keys=True)
        if key not in self.modules:
            self.modules[key] = tasks.load_module(self.task, size)
        return self.modules[key]

    def poison(self) -> None:
        """Fill freed memory with NaN so an output that reuses a stale buffer is caught."""
        import torch

        if self.device.startswith("cuda"):
            free, _ = torch.cuda.mem_get_info()
            junk = torch.empty(max(1, min(free // 8, 1 << 30) // 4), device=self.device)
        else:
            junk = torch.empty(1 << 20)
        junk.fill_(float("nan"))
        del junk

    def trial(self, model, spec: dict[str, Any], plan: dict[str, Any], clock: Clock) -> dict[str, Any]:
        import torch

        module = self.module(spec["size"])
        inputs = tasks.make_inputs(module, spec["seed"], spec["variant"], self.device)
        result: dict[str, Any] = {"event": "trial", "index": spec["index"]}
        self.poison()
        with torch.no_grad():
            out = model(*inputs)
            result["output"] = wire.describe(out, plan["sample_seed"])  # before any sync a thread could use
            clock.sync()
            result["output_after_sync"] = wire.describe(out, plan["sample_seed"])
            if spec.get("repeat"):
                self.poison()
                result["repeat"] = wire.describe(model(*inputs), plan["sample_seed"])
        fresh = tasks.make_inputs(module, spec["seed"], spec["variant"], self.device)
        result["inputs_unchanged"] = all(
            not isinstance(a, torch.Tensor) or (a.shape == b.shape and torch.equal(a, b))
            for a, b in zip(inputs, fresh))
        return result

    def run(self, plan: dict[str, Any], clock: Clock) -> None:
        main = self.module(plan["size"])
        model = tasks.make_model(main, self.candidate.ModelNew, plan["init_seed"], self.device)
        if not self.trials(model, plan["trials"], plan, clock):
            return
        if plan.get("timed_calls"):
            self.time(model, main, plan, clock)
        if plan.get("profile"):
            try:
                _send(self.fd, {"event": "profile", **profile(model, main, plan, self.device)})
            except BaseException as exc:  # noqa: BLE001
                _send(self.fd, {"event": "profile", **_error(exc)})
        # Other sizes last: a kernel that faults at an unexpected shape cannot spoil the timing.
        for spec in plan.get("shape_trials", []):
            other = tasks.make_model(self.module(spec["size"]), self.candidate.ModelNew, plan["init_seed"],
                                     self.device)
            if not self.trials(other, [spec], plan, clock):
                return

    def trials(self, model, specs: list[dict[str, Any]], plan: dict[str, Any], clock: Clock) -> bool:
        """Run trials in order; False after the first that raised (a CUDA fault poisons the context)."""
        for spec in specs:
            try:
                message = self.trial(model, spec, plan, clock)
            except BaseException as exc:  # noqa: BLE001
                _send(self.fd, {"event": "trial", "index": spec["index"], **_error(exc)})
                return False
            _send(self.fd, message)
        return True

    def time(self, model, module, plan: dict[str, Any], clock: Clock) -> None:
        import torch

        inputs = tasks.make_inputs(module, plan["warm_seed"], "base", self.device)
        with torch.no_grad():
            for _ in range(plan["warmup"]):
                model(*inputs)
            clock.sync()
            one = clock.block_ms(lambda: model(*inputs), 1)
            calls = max(3, min(1000, math.ceil(50.0 / max(one, 1e-3))))
            # The parent brackets this block with its own clock: an upper bound on the time per call.
            _send(self.fd, {"event": "block_start", "calls": calls})
            block = clock.block_ms(lambda: model(*inputs), calls)
            _send(self.fd, {"event": "block_end", "calls": calls, "ms": block})
            outputs: list[dict[str, Any]] = []
            sets = tasks.block_sets(module, inputs, self.device)

            def seeds_for(first: int, count: int) -> list[int]:
                # A block's seeds arrive only now, so nothing can be computed ahead of it.
                _send(self.fd, {"event": "need_seeds", "index": first, "count": count})
                return json.loads(sys.stdin.readline())["seeds"]

            times = timing.time_blocks(clock, lambda x: model(*x), sets, plan["timed_calls"], seeds_for,
                                       lambda x, seed: tasks.refill_inputs(x, module, seed, self.device),
                                       lambda out: outputs.append(wire.describe(out, plan["sample_seed"])))
            del sets
        _send(self.fd, {"event": "timing", "times_ms": times, "outputs": outputs})


def profile(model, module, plan: dict[str, Any], device: str) -> dict[str, Any]:
    """Where one call's time went: the candidate's own code, or PyTorch's kernels and ops."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    inputs = tasks.make_inputs(module, plan["warm_seed"], "base", device)
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.no_grad(), torch_profile(activities=activities) as prof:
        model(*inputs)
        if cuda:
            torch.cuda.synchronize()
    return summarize_profile(prof.events(), cuda)


# Ops that only allocate or reshape: a custom kernel legitimately calls them.
_CHEAP_OPS = ("aten::empty", "aten::zeros", "aten::ones", "aten::view", "aten::reshape", "aten::contiguous",
              "aten::as_strided", "aten::resize", "aten::to", "aten::_to_copy", "aten::detach", "aten::lift",
              "aten::item", "aten::_local_scalar_dense", "aten::select", "aten::slice", "aten::expand",
              "aten::alias", "aten::unsqueeze", "aten::squeeze", "aten::fill_", "aten::zero_", "aten::copy_",
              "aten::empty_strided", "aten::empty_like", "aten::zeros_like", "aten::t", "aten::transpose",
              "aten::div", "aten::div_", "aten::mul", "aten::mul_", "aten::resolve")
_TORCH_KERNEL_MARKS = ("at::native", "at::cuda", "void at::", "cutlass", "cublas", "cudnn", "gemm", "triton_",
                       "cub::", "reduce_kernel", "elementwise_kernel", "vectorized_elementwise")


def summarize_profile(events, cuda: bool) -> dict[str, Any]:
    if cuda:
        kernels: dict[str, float] = {}
        for e in events:
            if str(e.device_type).endswith("CUDA") and not e.name.startswith(("Memcpy", "Memset")):
                kernels[e.name] = kernels.get(e.name, 0.0) + e.device_time_total
        total = sum(kernels.values())
        torch_time = sum(t for n, t in kernels.items() if any(m in n for m in _TORCH_KERNEL_MARKS))
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


def _read_line() -> dict[str, Any] | None:
    line = sys.stdin.readline()
    return json.loads(line) if line.strip() else None


def warm_profiler(device: str) -> None:
    """The first profiler session of a process costs 4-5 s (CUPTI starts); pay it before the job
    arrives, while this child is a spare, rather than inside the attempt."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    x = torch.ones(1024, device=device)
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        x.sum()
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)  # the working directory is the candidate's scratch space, never an import root
    parser = argparse.ArgumentParser(prog="pipeline.harness")
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("mode", choices=["build", "eval"])
    parser.add_argument("code_path", nargs="?")
    args = parser.parse_args(argv)
    fd = args.result_fd
    if args.mode == "build":
        return run_build(fd, args.code_path)
    import torch  # before the first line arrives: a spare child waits with torch already loaded

    init = _read_line()
    if init is None:
        return 0  # a spare the parent never used
    if init["device"].startswith("cuda"):
        # The driver opens its device nodes and sockets here; Landlock then confines the rest.
        torch.cuda.init()
        torch.empty(1, device=init["device"])
        if init.get("profiler"):
            warm_profiler(init["device"])
    job = _read_line()
    if job is None:
        return 0
    os.environ["TORCH_EXTENSIONS_DIR"] = job["extensions_dir"]
    confined = apply_limits(job.get("memory_gb"), job["device"].startswith("cuda"),
                            [job["task_path"], job["code_path"]], [])
    evaluator = Evaluator(fd, job)
    evaluator.module(job["size"])  # a broken task file fails here, before the candidate runs
    clock = Clock(job["device"])  # takes its references to the timers before any candidate code runs
    _send(fd, {"event": "ready", "landlock": confined})
    try:
        evaluator.candidate = import_candidate(job["code_path"])
        if not hasattr(evaluator.candidate, "ModelNew"):
            raise AttributeError("the code defines no ModelNew")
    except BaseException as exc:  # noqa: BLE001
        _send(fd, {"event": "load_failed", **_error(exc)})
        return 0
    _send(fd, {"event": "imported"})
    plan = json.loads(sys.stdin.readline())
    evaluator.run(plan, clock)
    _send(fd, {"event": "done"})
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown, which a candidate's atexit hooks could hijack


if __name__ == "__main__":
    sys.exit(main())
