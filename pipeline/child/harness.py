"""The sandboxed child's side, the only module that imports candidate code (`python -m
pipeline.child.harness --result-fd N [--outbox-fd M] build [CODE_PATH] | eval`; requests on stdin).

It answers the parent's requests one at a time (pipeline.child.protocol). Until `Import` it is trusted:
it confines itself, reports how, and runs the calibration with a null model. From `Import` on everything
it says is a claim the parent checks: outputs go to the outbox, each call's inputs are revealed by the
request that uses them, and the parent times every request with its own clock.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import resource
import shlex
import sys
import traceback
from pathlib import Path
from typing import Any

from . import HARNESS, replays, tasks
from . import protocol as P
from . import memfd
from .grad import ForwardBackward, GradError, draw_upstream, null_model, reseed
from .jail import landlock
from .jail.seccomp import die_with_parent, install_filter
from .profiling import profile, warm_profiler


def readable_paths(extra: list[str]) -> list[str]:
    """What the child may read: the system, Python and its packages, our package, and the files of
    this job; not the project folder itself, where the database lives."""
    ours = str(Path(__file__).resolve().parent.parent)  # the pipeline package (its source is public)
    project = str(Path(ours).parent)
    proc = [f"/proc/{name}" for name in landlock.PROC_READ] + [f"/proc/{os.getpid()}"]
    paths = [*landlock.SYSTEM_READ, *proc, sys.prefix, sys.base_prefix, sys.exec_prefix, ours, *extra]
    paths += [p for p in sys.path if p and os.path.isdir(p) and os.path.abspath(p) != project]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            paths.append(os.environ[var])
    return paths


def apply_limits(memory_gb: float | None, cuda: bool, read: list[str], write: list[str],
                 shared_bytes: int = 0) -> P.Confinement:
    """Limits the child sets on itself before any candidate code runs, and how far they hold. Writable: its
    temp dir (HOME, TMPDIR) and `write`, never /dev/shm; on the cpu its address space is capped at
    `memory_gb` beside `shared_bytes` (the parent's memfd it maps)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    seccomp = install_filter()
    if not seccomp:
        print("[kgen] seccomp unavailable: a process of the candidate could leave the session", flush=True)
    if memory_gb and not cuda:  # CUDA reserves huge virtual ranges, so an address-space cap breaks it
        cap = int(memory_gb * (1 << 30)) + shared_bytes
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    home = os.environ.get("HOME", "")
    writable = [p for p in (home, *write) if p]
    abi = landlock.abi_version()
    held = os.environ.get("KGEN_LANDLOCK", "1") != "0" and landlock.restrict(readable_paths(read + writable), writable)
    private = held and bool(home) and os.environ.get("TMPDIR") == home and Path(home).name.startswith("kgen-child-")
    return P.Confinement(landlock_abi=abi if held else 0, filesystem=held, network=held and abi >= 4,
                         signals=held and abi >= 6, seccomp=seccomp, private_tmp=private, uid=os.getuid())


def _light_fits(sources: Any) -> bool:
    """Whether a load_inline call's .cu sources may get the light ATen header (pipeline/build/headers.py):
    there are some, and none mentions requires_grad (where torch's factories and ATen's differ)."""
    sources = [sources] if isinstance(sources, str) else list(sources or [])
    return bool(sources) and all(isinstance(s, str) and "requires_grad" not in s for s in sources)


def _split_nvcc(ce: Any) -> str:
    """The nvcc command ninja runs for a .cu: nvcc's own steps, host and device side by side
    (pipeline/build/nvcc_split.py, a file of the standard library alone, run without site packages)."""
    script = Path(__file__).resolve().parent.parent / "build" / "nvcc_split.py"
    return shlex.join([sys.executable, "-I", "-S", str(script), ce._join_cuda_home("bin", "nvcc")])


def import_candidate(code_path: str, force_verbose_build: bool = False, headers: str = "", light: bool = False,
                     split: bool = False):
    if force_verbose_build:
        # The build log holds the compiler's full text, whatever `verbose` the candidate passed. `headers`
        # (pipeline/build/headers.py) goes first on the include path; with `light` a .cu gets the light ATen
        # header; with `split` nvcc's host and device steps run side by side (pipeline/build/nvcc_split.py).
        import torch.utils.cpp_extension as ce

        original = ce.load_inline

        def load_inline(*args, **kwargs):
            try:  # by name, so a flag list the candidate passed by position is extended, not doubled
                call = inspect.signature(original).bind(*args, **kwargs).arguments
            except TypeError:
                return original(*args, **kwargs)  # torch's own error for the call as written
            call["verbose"] = True
            if headers:
                call["extra_include_paths"] = [headers, *(call.get("extra_include_paths") or [])]
            if light and _light_fits(call.get("cuda_sources")):
                call["extra_cuda_cflags"] = ["-DKGEN_LIGHT_ATEN", *(call.get("extra_cuda_cflags") or [])]
            if split and call.get("cuda_sources") and "PYTORCH_NVCC" not in os.environ:
                os.environ["PYTORCH_NVCC"] = _split_nvcc(ce)
            return original(**call)

        ce.load_inline = load_inline
    spec = importlib.util.spec_from_file_location("kgen_candidate", code_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kgen_candidate"] = module
    spec.loader.exec_module(module)
    return module


def run_build(fd: int, code_path: str) -> int:
    # The build dir (TORCH_EXTENSIONS_DIR) is this code's own, written by this build alone.
    # The fast-build headers are read here and never written (pipeline/build/headers.py).
    headers = os.environ.get("KGEN_HEADERS", "")
    confinement = apply_limits(None, True, [code_path, *([headers] if headers else [])],
                               [os.environ.get("TORCH_EXTENSIONS_DIR", "")])
    if not confinement.filesystem:
        print("[kgen] landlock unavailable: the build runs without filesystem confinement", flush=True)
    try:
        import_candidate(code_path, force_verbose_build=True, headers=headers,
                         light=bool(headers) and os.environ.get("KGEN_LIGHT_ATEN") == "1",
                         split=bool(headers) and os.environ.get("KGEN_NVCC_SPLIT") == "1")
    except BaseException as exc:  # noqa: BLE001 - any failure of hostile code is a build failure
        traceback.print_exc()
        P.send(fd, P.BuildDone(ok=False, error=f"{type(exc).__name__}: {_first_line(exc)}"))
        return 1
    P.send(fd, P.BuildDone(ok=True))
    return 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else ""


def _failed(op: str, exc: BaseException, index: int | None = None) -> P.Failed:
    if isinstance(exc, GradError):
        return P.Failed(op=op, index=index, error=str(exc), kind=exc.kind)
    return P.Failed(op=op, index=index, error=f"{type(exc).__name__}: {_first_line(exc)}",
                    traceback=traceback.format_exc()[-4000:])


class Evaluator:
    """Answers one request at a time. Before Import the model is a null one (zeros of the reference's
    shape), so the parent's calibration blocks measure exactly what a block costs besides the calls."""

    def __init__(self, job: P.Job, outbox: memfd.Outbox, inbox: memfd.Inbox | None = None):
        import torch

        self.job, self.outbox, self.inbox = job, outbox, inbox
        # Bound now, before any candidate code: a candidate that rebinds torch's synchronize changes nothing here.
        self.sync = torch.cuda.synchronize if job.device.startswith("cuda") else (lambda: None)
        self.device = job.device
        if self.device.startswith("cuda"):
            replays.unsplit_large_blocks()
        self.task = tasks.load_file(Path(job.task_path))
        self.modules: dict[str, Any] = {}
        self.candidate = None
        self.others: dict[str, tuple[Any, Any]] = {}  # held-out size -> (model, module): Evaluator.at
        self.main = self.module(job.size)  # a broken task file fails here, before the candidate runs
        self.model = self.null_model()
        self.like: list[Any] | None = None  # a set of the main size, made once: the inbox's views take its shapes
        self.views: list[list[Any]] = []  # the inbox's sets (inbox_sets)
        self.captured = None  # a Bound request's graphs, waiting for their Play
        self.graphs = None  # the last request's, played again for the next of its shape (Captured.rebase)
        self.armed: tuple[int, list[list[Any]]] | None = None  # an Arm's request index and sets

    def null_model(self):
        """Zeros of the reference's shape (pipeline.child.grad.null_model), made once an input set."""
        import torch

        return null_model(self.main, tuple(self.job.out_shape), self.main.__kgen_dtype__ or torch.float32, self.device,
                          self.job.grad)

    def candidate_model(self, module, init_seed: int):
        """ModelNew at a size, called as forward plus backward in gradient mode."""
        model = tasks.make_model(module, self.candidate.ModelNew, init_seed, self.device)
        return ForwardBackward(model, init_seed) if self.job.grad else model

    def at(self, size: str | dict[str, Any] | None):
        """(model, task module) at a size: the main ones, or a ModelNew built once per held-out size
        under the attempt's init seed (its trial, profile and timed block then call the same one)."""
        if size is None or size == self.job.size:
            return self.model, self.main
        key = json.dumps(size, sort_keys=True)
        if key not in self.others:  # the last size's only: the sizes are visited one after another
            module = self.module(size)
            self.others = {key: (self.candidate_model(module, self.init_seed), module)}
        return self.others[key]

    def module(self, size: str | dict[str, Any]):
        key = json.dumps(size, sort_keys=True)
        if key not in self.modules:
            self.modules[key] = tasks.load_module(self.task, size, self.job.dtype)
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

    def handle(self, req: P.Message) -> P.Message:
        import torch

        if isinstance(req, P.Import):
            self.candidate = import_candidate(self.job.code_path)
            if not hasattr(self.candidate, "ModelNew"):
                raise AttributeError("the code defines no ModelNew")
            return P.Imported()
        if isinstance(req, P.Setup):
            self.init_seed, self.warm_seed = req.init_seed, req.warm_seed
            if self.graphs is not None:  # the calibration's, of the null model: no candidate request rebases them
                self.graphs = None
                torch.cuda.empty_cache()
            self.model = self.candidate_model(self.main, req.init_seed)
            with torch.no_grad():
                inputs = tasks.make_inputs(self.main, req.warm_seed, "base", self.device)
                for _ in range(req.warmup):
                    self.model(*inputs)
                self.sync()
            return P.SetupDone()
        if isinstance(req, P.Trial):
            return self.trial(req)
        if isinstance(req, P.Bound):
            return self.bound(req)
        if isinstance(req, P.Arm):
            return self.arm(req)
        if isinstance(req, P.Play):
            return self.play(req)
        if isinstance(req, P.Profile):
            try:
                model, module = self.at(req.size)
                return P.ProfileDone(**profile(model, module, self.warm_seed, self.device, self.job.own_kernels,
                                               req.repeats, req.short_us))
            except Exception as exc:  # noqa: BLE001 - a profile that fails leaves the flag unset, not the verdict
                return P.ProfileDone(error=f"{type(exc).__name__}: {_first_line(exc)}")
        raise ValueError(f"unexpected request {req.op}")

    def trial(self, req: P.Trial) -> P.TrialDone:
        import torch

        model, module = self.at(req.size)
        inputs = tasks.make_inputs(module, req.seed, req.variant, self.device)
        reseed(model, inputs, req.seed)
        self.poison()
        with torch.no_grad():
            out = model(*inputs)
            first = P.put(self.outbox, 0, out)  # before any sync a side thread or stream could use
            self.sync()
            after = P.put(self.outbox, 1, out)
            again = None
            if req.repeat:
                self.poison()
                again = P.put(self.outbox, 2, model(*inputs))
        fresh = tasks.make_inputs(module, req.seed, req.variant, self.device)
        unchanged = all(not isinstance(a, torch.Tensor) or (a.shape == b.shape and torch.equal(a, b))
                        for a, b in zip(inputs, fresh))
        del inputs, fresh, out
        if self.device.startswith("cuda"):
            # The trial's blocks back to the driver: the reference's float64 compare of this output runs
            # next, beside this paused process (docs/decisions/memory-and-outputs.md).
            torch.cuda.empty_cache()
        return P.TrialDone(index=req.index, output=first, after_sync=after, repeat=again, inputs_unchanged=unchanged)

    def bound(self, req: P.Bound) -> P.BoundDone | P.BoundReady:
        """Inputs (in place in the inbox, or from a seed each), the calls back to back, one sync, the outputs:
        the parent times this request. Nothing copies the inputs, so all but the calls is what the null's
        calibration measured; on the cpu each output goes to its slot as its call returns (no fresh pages)."""
        import torch

        if req.replays:
            return self.bound_replays(req)
        with torch.no_grad():
            if req.inbox and self.job.grad:  # the sets, and their upstreams, the Arm before made
                if self.armed is None or self.armed[0] != req.index or len(self.armed[1]) != req.inbox:
                    raise ValueError(f"a Bound request {req.index} in gradient mode that no Arm prepared")
                sets, self.armed = self.armed[1], None
            elif req.inbox:
                sets = self.inbox_sets(req.inbox)
            else:
                sets = [tasks.make_inputs(self.main, seed, "base", self.device) for seed in req.seeds]
            if self.job.grad and not req.inbox:  # each call's upstream, from its seed (pipeline.child.grad)
                if len(req.seeds) != len(sets):
                    raise ValueError(f"a Bound request in gradient mode with {len(req.seeds)} seeds for {len(sets)} calls")
                for inputs, seed in zip(sets, req.seeds):
                    if isinstance(self.model, ForwardBackward):
                        self.model.reseed(inputs, seed)
                    else:  # the null model draws as much, so the calibration takes the draws out of the estimate
                        draw_upstream(seed, tuple(self.job.out_shape), self.main.__kgen_dtype__ or torch.float32, self.device)
            if self.device == "cpu":  # each output to its slot as it comes, and freed
                # The least Python between calls (memfd.copy_quick): all of it is in the parent's window,
                # and it ran slower after a real call than after the null's.
                kept, model, outbox = [], self.model, self.outbox
                for i, inputs in enumerate(sets):
                    out = model(*inputs)
                    kept.append(memfd.copy_quick(outbox, i, out))
                    del out
                return P.BoundDone(index=req.index, outputs=[P.OutputHeader(**memfd.fields_of(k)) for k in kept])
            else:
                outs = [self.model(*inputs) for inputs in sets]
                self.sync()
                headers = [P.put(self.outbox, i, out) for i, out in enumerate(outs)]
        return P.BoundDone(index=req.index, outputs=headers)

    def inbox_sets(self, count: int) -> list[list[Any]]:
        """`count` sets as views of the inbox, which the parent fills while the child is stopped: made once
        (the calibration's first request) and kept, as making them costs milliseconds in the window. A
        candidate that re-points a kept view only changes its own later calls' inputs."""
        if self.inbox is None or count > self.inbox.sets:
            raise ValueError(f"a Bound request for {count} inbox sets; this child's inbox holds "
                             f"{self.inbox.sets if self.inbox else 0}")
        if len(self.views) < count:
            if self.like is None:
                self.like = tasks.make_inputs(self.main, 0, "base", self.device)
            self.views += [self.inbox.inputs(i, self.like) for i in range(len(self.views), count)]
        return self.views[:count]

    def arm(self, req: P.Arm) -> P.BoundReady:
        """The next Bound request's sets, and each call's upstream drawn from its seed, untimed (P.Arm);
        the null model draws none, as none of this is in the window."""
        sets = self.inbox_sets(len(req.seeds))
        if isinstance(self.model, ForwardBackward):
            for inputs, seed in zip(sets, req.seeds):
                self.model.reseed(inputs, seed)
        self.armed = (req.index, sets)
        return P.BoundReady(index=req.index)

    def bound_replays(self, req: P.Bound) -> P.BoundReady:
        """Capture a Bound request's CUDA graphs (pipeline.child.replays) for the Play that follows;
        a forward that cannot be captured is said so."""
        import torch

        kept, self.captured, self.graphs = self.graphs, None, None
        try:
            if not (kept is not None and kept.keep[3] is self.model and kept.replays == req.replays
                    and kept.rebase(req.seeds, req.digest_seed)):
                kept = None
                torch.cuda.empty_cache()  # the last graphs' pool, which no new capture reuses (untimed)
                kept = replays.Captured(self.model, self.main, req.seeds, req.replays, req.digest_seed, self.device)
            self.graphs = self.captured = kept
        except Exception as exc:  # noqa: BLE001 - the parent falls back to eager requests
            free, total = torch.cuda.mem_get_info()
            return P.BoundReady(index=req.index, graph_error=f"{type(exc).__name__}: {_first_line(exc)[:200]} [this process: "
                                f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated, "
                                f"{torch.cuda.memory_reserved() / 2**30:.1f} GiB reserved; the device: {free / 2**30:.1f} "
                                f"of {total / 2**30:.1f} GiB free]")
        return P.BoundReady(index=req.index)

    def play(self, req: P.Play) -> P.BoundDone:
        if self.captured is None:
            raise ValueError("a Play with no captured Bound request")
        captured, self.captured = self.captured, None
        return P.BoundDone(index=req.index, outputs=[], digests=captured.play(req.factor_seed))


def serve(fd: int, evaluator: Evaluator, read_request) -> None:
    """One reply per request until Finish; a request whose work raises gets `Failed` and the child
    stops (a CUDA fault poisons the context, and the verdict is settled anyway)."""
    while (req := read_request()) is not None and not isinstance(req, P.Finish):
        try:
            reply = evaluator.handle(req)
        except BaseException as exc:  # noqa: BLE001 - anything the candidate raises ends the attempt
            P.send(fd, _failed(req.op, exc, getattr(req, "index", None)))
            return
        P.send(fd, reply)


def main(argv: list[str] | None = None) -> int:
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)  # the working directory is the candidate's scratch space, never an import root
    parser = argparse.ArgumentParser(prog=HARNESS)
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--outbox-fd", type=int)
    parser.add_argument("mode", choices=["build", "eval"])
    parser.add_argument("code_path", nargs="?")
    args = parser.parse_args(argv)
    die_with_parent()
    fd = args.result_fd
    stdin = sys.stdin

    def read_request() -> P.Message | None:
        line = stdin.readline()
        return P.REQUEST.validate_json(line) if line.strip() else None

    if args.mode == "build" and args.code_path:
        return run_build(fd, args.code_path)
    if args.mode == "build":  # a spare (pipeline.build): torch's import is paid before the build is known
        import torch.utils.cpp_extension  # noqa: F401

        build = read_request()
        if not isinstance(build, P.BuildJob):
            return 0  # a spare the parent never used
        os.environ.update(build.env)
        return run_build(fd, build.code_path)
    import torch  # before the first line arrives: a spare child waits with torch already loaded

    init = read_request()
    if not isinstance(init, P.Init):
        return 0  # a spare the parent never used
    if init.device.startswith("cuda"):
        # The driver opens its device nodes and sockets here; Landlock then confines the rest.
        torch.cuda.init()
        torch.empty(1, device=init.device)
        if init.profiler:
            warm_profiler(init.device)
    job = read_request()
    if not isinstance(job, P.Job):
        return 0
    if job.threads and not job.device.startswith("cuda"):
        torch.set_num_threads(job.threads)
    elif job.device.startswith("cuda"):
        # A spare may have started on other cores (sandbox.spares.Spares) and been moved to the lane's since:
        # as many CPU threads as the lane has cores, like the reference process.
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    os.environ["TORCH_EXTENSIONS_DIR"] = job.build_dir
    # In an evaluation the build directory is read-only: torch's load_inline must load what the build
    # stage compiled and never compile (pipeline.child.prebuilt), for the child's whole life.
    from .prebuilt import import_only

    import_only()
    confinement = apply_limits(job.memory_gb, job.device.startswith("cuda"),
                               [job.task_path, job.code_path, job.build_dir], [], os.fstat(args.outbox_fd).st_size)
    outbox = memfd.Outbox(args.outbox_fd, job.slot_values, job.slots)
    if job.device.startswith("cuda") and not outbox.pin():
        print("[kgen] the outbox could not be page-locked: output copies are pageable", flush=True)
    inbox = (memfd.Inbox(args.outbox_fd, memfd.inbox_offset(outbox.size), job.inbox_set_bytes, job.inbox_sets)
             if job.inbox_sets else None)
    evaluator = Evaluator(job, outbox, inbox)
    P.send(fd, P.Ready(confinement=confinement))
    serve(fd, evaluator, read_request)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown, which a candidate's atexit hooks could hijack


if __name__ == "__main__":
    sys.exit(main())
