"""The reference process (`python -m pipeline.judge.reference --result-fd N`, requests as JSON lines on
stdin): expected outputs in float64 and baseline timings, in a process that never imported candidate
code, so a candidate that patches torch cannot move them. It lives for a task's run: baselines once,
then per attempt its expected values as sealed memfds handed to the parent over a Unix socket or, past
POLICY.ahead_bytes, the comparison itself on its device (`compare`). Nothing is timed before the
compiler's warm-up ends (CompilerWarmup). Requests, events and memfds are pipeline.judge.refproto's."""

from __future__ import annotations

import argparse
import mmap
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..child import replays, tasks
from ..child.grad import ForwardBackward, Grads, reseed
from ..child.jail.seccomp import die_with_parent
from ..child.memfd import pack_set
from ..child.sizes import size_key
from ..child.protocol import write_line
from ..child.timing import (Clock, ColdPool, bandwidth_floor, calls_for, compute_floor, floors_again, hold_ms,
                            measure_bandwidth, plain_ms, summarize_blocks, time_cold, time_sides, warm_flop_count)
from ..sandbox.cores import spread
from . import clocks, refproto as R
from .judge import own_error, tensor_stats, tolerance_for
from .compiling import CompilerWarmup, Kept, one_line, stateless
from .health import IdleProbe, cpu_name
from ..policy import POLICY

warm_flop_count()  # here, in the reference's zygote, which imports this module: paid once, not by every task's reference


def _as64(inputs: list[Any]) -> list[Any]:
    return [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]


def _parts(result: Any) -> tuple[torch.Tensor, list[tuple[str, torch.Tensor]]]:
    """A call's output and what the judge compares part by part: the output alone, or in gradient
    mode the output and then each gradient."""
    if isinstance(result, Grads):
        return result.output, [("output", result.output), *zip((f"gradient of {l}" for l in result.labels), result.grads)]
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"the reference Model returns {type(result).__name__}, not a tensor")
    return result, [("output", result)]


def _described(out: torch.Tensor, parts: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """A call's shapes and dtypes as the judge lays out its output (judge.Expected); float64's are the same."""
    return {"shape": list(out.shape), "numel": sum(t.numel() for _, t in parts),
            "ref_dtype": str(out.dtype).removeprefix("torch."), "parts": [[label, list(t.shape)] for label, t in parts],
            "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in parts]}


class Reference:
    def __init__(self, start: R.Start):
        self.device = start.device
        self.task = tasks.load_file(Path(start.task_path))
        self.models: dict[str, tuple[Any, Any]] = {}
        self.grad = start.grad  # a call is forward plus backward (pipeline.child.grad)
        self.dtype = start.dtype  # the run's dtype: inputs and weights cast to it
        self.init_seed: int | None = None
        self.sets: list[list[Any]] | None = None  # an attempt's eager blocks' input sets
        self.sets_size = ""  # the size they are of
        # The cold blocks' sets beside the cpu's Bound requests, kept where small.
        self.cold = ColdPool(POLICY.large_sets_bytes)
        self.clock: Clock | None = None
        self.compiled: dict[str, Any] = {}  # torch.compile of the attempt's model, per size
        self.plays: dict[str, tuple[str, replays.Captured]] = {}  # play's graphs by kind, and what they were made for
        # Per size, a model without weights and its torch.compile, kept across attempts, so no attempt's first
        # block pays a fresh compile (docs/decisions/spares-and-startup.md); one with weights is built per init seed.
        self.kept: dict[str, Kept] = {}
        self.warmed: set[str] = set()  # sizes whose torch.compile had this attempt's warm-up calls

    def models_for(self, size: str, init_seed: int):
        """(task module, model in the run's dtype, float64 model) at a size, built under the attempt's
        init seed; in gradient mode each called as forward plus backward."""
        if init_seed != self.init_seed:
            self.models, self.compiled, self.warmed, self.init_seed = {}, {}, set(), init_seed
        key = size_key(size)
        if key not in self.models:
            module = tasks.load_module(self.task, size, self.dtype)
            m32 = tasks.make_model(module, module.Model, init_seed, self.device)
            made = None if self.grad else stateless(m32)
            if made is not None and key in self.kept and self.kept[key].made == made:
                m32 = self.kept[key].model  # the same computation as the fresh one, and compiled already
            elif made is not None:
                self.kept[key] = Kept(m32, made)
            m64 = tasks.make_model(module, module.Model, init_seed, self.device)  # the dtype's weights, in float64
            if isinstance(m64, torch.nn.Module):
                m64 = m64.double()
            self.models[key] = (module, self.wrap(m32, init_seed), self.wrap(m64, init_seed, module.__kgen_dtype__ or torch.float32))
        return self.models[key]

    def digest(self, size: str, init_seed: int, item: R.DigestItem) -> dict[str, float]:
        """A replayed Bound call's expected digest and its scale (pipeline.child.replays) from the float64
        output for the replay's own inputs; in gradient mode from the output and every gradient, with
        the upstream of the replay's set's seed, as the child's set draws it."""
        module, _, m64 = self.models_for(size, init_seed)
        inputs, seed = replays.inputs_for(module, item.seeds, item.replay, item.replays, item.factor_seed, self.device)
        reseed(m64, inputs := _as64(inputs), seed)
        with torch.no_grad():
            parts = replays.parts(m64(*inputs))
        w = replays.weights(sum(p.numel() for p in parts), item.digest_seed, self.device)  # float32, as the child's
        return replays.expected_digest(parts, w, POLICY.digest_chunk)

    def play(self, request: R.Play) -> dict[str, float]:
        """Milliseconds on this clock to play, as the candidate's request is, a null model shaped as the
        candidate's and the asked models (eager, compiled), each captured untimed at its shape's first request
        and kept for the attempt (docs/decisions/gpu-timing.md); one that cannot be captured is left out."""
        times = {}
        key = request.model_dump_json(exclude={"models"})  # what a capture was made for
        for kind in ("null", *request.models):
            if kind not in self.plays or self.plays[kind][0] != key:
                self.plays.pop(kind, None)
                shared = next((c.keep[:2] for k, c in self.plays.values() if k == key), None)
                try:
                    self.plays[kind] = key, self._capture(kind, request, shared)
                except Exception:  # noqa: BLE001 - the null's failure is the request's (PlayFailed)
                    if kind == "null":
                        raise
                    if kind == "compiled":
                        self.drop_compiled(size_key(request.size))
                    continue
            start = time.perf_counter()
            self.plays[kind][1].play(int.from_bytes(os.urandom(4), "little"))
            times[kind] = (time.perf_counter() - start) * 1e3
        return times

    def _capture(self, kind: str, request: R.Play, shared: tuple[list, list] | None) -> replays.Captured:
        if kind == "null":
            module = tasks.load_module(self.task, request.size, self.dtype)
            return replays.null_request(module, request.n_seeds, request.replays, request.out_shape, self.device, self.grad,
                                        shared)
        module, m32, _ = self.models_for(request.size, request.init_seed)
        model = m32 if kind == "eager" else self.compiled_for(size_key(request.size), m32)
        seeds = [int.from_bytes(os.urandom(4), "little") for _ in range(request.n_seeds)]
        return replays.Captured(model, module, seeds, request.replays, 0, self.device, shared)

    def wrap(self, model, init_seed: int, upstream_dtype: torch.dtype | None = None):
        if not self.grad:
            return model
        return ForwardBackward(model, init_seed, upstream_dtype)

    def expected(self, size: str, init_seed: int, seed: int, variant: str, pack_inputs: bool = False,
                 output: bool = True, values: bool = True, errors: bool = True) -> dict[str, Any]:
        """The reference's output for one call in float64, its parts one after another in a sealed memfd
        (`values_fd`, the caller's to close); with `values` False only its shapes and dtypes. With
        `pack_inputs`, the call's inputs too, packed as the inbox holds them (`inputs_fd`)."""
        module, m32, m64 = self.models_for(size, init_seed)
        inputs = tasks.make_inputs(module, seed, variant, self.device)
        meta: dict[str, Any] = {}
        if pack_inputs:
            meta["inputs_fd"] = R.sealed_memfd("kgen-inputs", pack_set(inputs))
        if not output:
            return meta
        if not values:
            # Only what describes the call (it sizes the outbox's slots): the run dtype's forward alone; the
            # float64 forward comes when the call is checked (Session.fetch).
            reseed(m32, inputs, seed)
            with torch.no_grad():
                out32, parts32 = _parts(m32(*inputs))
            return {**meta, **_described(out32, parts32)}
        held = [inputs]
        del inputs  # _forward64 drops them before the float64 forward, where it can
        parts, described = self._forward64(m32, m64, held, module, seed, variant, errors)
        meta["values_fd"] = R.sealed_memfd("kgen-expected", *(
            t.detach().reshape(-1).to(device="cpu", dtype=torch.float64).numpy() for _, t in parts))
        return {**meta, **described}

    def compare(self, request: R.Compare, fd: int) -> R.Compared:
        """A checked call's output, read from the outbox memfd `fd` where the request says, against its float64
        forward here (tensor_stats), so large float64 values never leave the device. Tolerances by the parent's
        rule (tolerance_for) on the errors of the call's trial (request.errs) or, for a trial, its own."""
        spec = request.spec
        module, m32, m64 = self.models_for(spec.size, request.init_seed)
        inputs = [tasks.make_inputs(module, spec.seed, spec.variant, self.device)]
        parts, described = self._forward64(m32, m64, inputs, module, spec.seed, spec.variant, request.errs is None)
        errs = request.errs or list(zip(described["rel_errs"], described["own_errs"]))
        tols = [tolerance_for(request.tol, self.dtype, e, o) for e, o in errs]
        view = mmap.mmap(fd, os.fstat(fd).st_size, access=mmap.ACCESS_COPY)  # private: nothing written back
        try:
            got = [torch.frombuffer(view, dtype=getattr(torch, dtype), count=count, offset=at) if count
                   else torch.empty(0, dtype=getattr(torch, dtype)) for at, dtype, count in request.parts]
            stats = tensor_stats(got, [t for _, t in parts], tols)
            del got
        finally:
            view.close()
        return R.Compared(key=spec.key, stats=stats, **described)

    def _forward64(self, m32, m64, held: list, module, seed: int, variant: str, errors: bool):
        """One call's float64 parts (on this device) and what describes them; with `errors`, PyTorch's own
        error in the run's dtype too. `held`: [the call's inputs], emptied here, so they can go during the
        float64 forward (drawn again from the seed after, where there is no room: _room)."""
        inputs = held.pop()
        inputs64 = _as64(inputs)
        if not errors:  # the float64 values alone (refproto.Spec.errors): no run-dtype forward to keep inputs for
            del inputs
            reseed(m64, inputs64, seed)
            with torch.no_grad():
                out64, parts = _parts(m64(*inputs64))
            return parts, _described(out64, parts)
        kept = self._room(inputs, inputs64)
        if not kept:
            del inputs
        reseed(m64, inputs64, seed)  # gradient mode: this call's upstream, as the candidate's child draws it
        with torch.no_grad():
            _, parts = _parts(m64(*inputs64))
        del inputs64
        if not kept:
            inputs = tasks.make_inputs(module, seed, variant, self.device)
        reseed(m32, inputs, seed)
        with torch.no_grad():
            out32, parts32 = _parts(m32(*inputs))
        del inputs
        # How far PyTorch's own run dtype lands from float64 here, part by part: evidence for the
        # tolerance, and in bfloat16 and float16 the tolerance itself (pipeline.judge.judge.tolerance_for).
        errs, own = map(list, zip(*(own_error(a, b) for (_, a), (_, b) in zip(parts32, parts))))
        return parts, {**_described(out32, parts32), "fp32_rel_err": errs[0], "rel_errs": errs, "own_errs": own}

    def _room(self, inputs: list[Any], inputs64: list[Any]) -> bool:
        """Whether `inputs` may stay while the float64 forward runs, not be drawn again after it: where
        every tensor of them was copied into `inputs64` and a tenth of the free memory holds them."""
        if any(a is b for a, b in zip(inputs, inputs64) if isinstance(a, torch.Tensor)):
            return False  # shared: the float64 forward may have written into it
        free = torch.cuda.mem_get_info()[0] // 10 if self.device.startswith("cuda") else POLICY.large_sets_bytes
        return tasks.input_bytes(inputs) <= free

    def time_block(self, size, init_seed: int, seeds: list[int], warmup: int = 0,
                   pair: bool = False, cold: bool = False) -> list[float] | list[list[float]]:
        """One block of eager calls timed exactly as the candidate's, between its blocks (timing.time_sides).
        `pair`: each set timed eager then compiled, [eager times, compiled times]. `cold`: as the cpu's Bound
        request beside it, every set drawn first, then a call on each in turn (timing.time_cold)."""
        module, m32, _ = self.models_for(size, init_seed)
        if self.clock is None:
            self.clock = Clock(self.device)
        with torch.no_grad():
            # The attempt's first block: sets of its size, and the warm-up the candidate had; at least one call
            # after an `expect` released the models (a rebuilt model's first call in gradient mode draws its upstream).
            if self.sets is None or self.sets_size != size_key(size):
                self.sets = tasks.block_sets(module, tasks.make_inputs(module, seeds[0], "base", self.device), self.device)
                self.sets_size = size_key(size)
                for _ in range(max(1, warmup)):
                    m32(*self.sets[0])
                self.clock.sync()
            models = [m32]
            if pair:
                key = size_key(size)
                models.append(self.compiled_for(key, m32))
                if key not in self.warmed:  # warmed as the baseline was, at the attempt's first block
                    self.warmed.add(key)
                    for _ in range(warmup + 2):
                        models[-1](*self.sets[0])
                    self.clock.sync()
            if cold:
                sets = self.cold.take(size_key(size), lambda seed: tasks.make_inputs(module, seed, "base", self.device), seeds)
                times = clocks.unloaded_run(lambda: time_cold(self.clock, [lambda x, m=m: m(*x) for m in models], sets),
                                            len(sets), torch.get_num_threads())
                del sets
            else:
                times = self._blocks(models, module, self.sets, seeds, len(seeds), self.clock)
            return times if pair else times[0]

    def compiled_for(self, key: str, m32):
        """torch.compile of the size's model `m32`: the kept one where `m32` is kept (Reference.kept)."""
        if key not in self.compiled:
            kept = self.kept.get(key)
            if kept is not None and kept.model is m32:
                if kept.compiled is None:
                    kept.compiled = self.compile(m32)
                self.compiled[key] = kept.compiled
            else:
                self.compiled[key] = self.compile(m32)
        return self.compiled[key]

    def drop_compiled(self, key: str) -> None:
        """Forget a size's torch.compile that failed: kept, a failure once would be every attempt's."""
        self.compiled.pop(key, None)
        if key in self.kept:
            self.kept[key].compiled = None

    def compile(self, model):
        """torch.compile of the model; in gradient mode of the model inside the forward-backward
        call, so inductor compiles the backward too (AOTAutograd)."""
        if isinstance(model, ForwardBackward):
            return ForwardBackward(torch.compile(model.model), model.seed, model.round_to)
        return torch.compile(model)

    def drop_sets(self) -> None:
        """Free the eager blocks' and null replays' input sets where large (made again when needed): on a
        task of gigabytes they were, beside a checked call's float64 forward, more than the judge's
        budget (POLICY.memory_factor)."""
        if self.sets and tasks.input_bytes(self.sets[0]) * len(self.sets) >= POLICY.large_sets_bytes:
            self.sets = None
        for kind in [k for k, (_, c) in self.plays.items() if c.sets_bytes >= POLICY.large_sets_bytes]:
            del self.plays[kind]  # made again at the next play

    def release(self) -> None:
        """Free what an attempt's blocks kept (models, compiled models, input sets, the clock's buffers)."""
        self.models, self.compiled, self.sets, self.clock, self.warmed = {}, {}, None, None, set()

    def baselines(self, request: R.MeasureBaselines, send) -> None:
        module, m32, _ = self.models_for(request.size, request.init_seed)
        clock = Clock(self.device)
        inputs = tasks.make_inputs(module, request.baseline_seeds[0], "base", self.device)
        result: dict[str, Any] = {"input_bytes": tasks.input_bytes(inputs)}
        marks = [("", time.monotonic())]  # (part, when it ended): the seconds of each part, for the run's line
        result["eager"] = self._time(m32, module, request, clock, request.warmup)
        if cuda := self.device.startswith("cuda"):
            with torch.no_grad():
                result["eager_plain_ms"] = plain_ms(lambda: m32(*inputs))
        marks.append(("eager", time.monotonic()))
        if request.compile_baseline:
            try:
                compiled = self.compiled_for(size_key(request.size), m32)
                result["compiled"] = self._time(compiled, module, request, clock, request.warmup + 2)
                if cuda:
                    with torch.no_grad():
                        result["compiled_plain_ms"] = plain_ms(lambda: compiled(*inputs))
            except Exception as exc:  # noqa: BLE001 - a baseline that cannot compile is reported, not fatal
                result["compile_error"] = one_line(exc)
                self.drop_compiled(size_key(request.size))
            marks.append(("compiled", time.monotonic()))
        known = request.rates if cuda else None  # a GPU's rates are the device's, whatever the task
        floors = bandwidth_floor(self.device, clock, result["input_bytes"], known and known.bandwidth_gbs)
        marks.append(("bandwidth_floor", time.monotonic()))
        own = min(t["p25_ms"] for t in (result["eager"], result.get("compiled")) if t)
        result |= compute_floor(self.device, clock, lambda: m32(*inputs), own_ms=own, rate=known and known.flops_per_s)
        marks.append(("compute_floor", time.monotonic()))
        seconds = {part: round(t - marks[i][1], 2) for i, (part, t) in enumerate(marks[1:])}
        send(R.Measured(baselines=result | floors | {"seconds": seconds}))

    def _time(self, model, module, request: R.MeasureBaselines, clock: Clock, warmup: int) -> dict[str, float]:
        """The candidate's protocol exactly (pipeline.child.timing.time_sides), with as many calls as the
        same rule gives a candidate this fast (timing.calls_for)."""
        seeds = request.baseline_seeds
        inputs = tasks.make_inputs(module, seeds[0], "base", self.device)
        with torch.no_grad():
            for _ in range(warmup):
                model(*inputs)
            count = calls_for(clock.block_ms(lambda: model(*inputs), 3) / 3, request.timed_ms, request.timed_calls,
                              min(request.max_timed_calls, len(seeds)))
            times = self._blocks([model], module, tasks.block_sets(module, inputs, self.device), seeds, count, clock)[0]
        return summarize_blocks(times)

    def _blocks(self, models, module, sets: list[list[Any]], seeds: list[int], count: int, clock: Clock) -> list[list[float]]:
        """`count` calls of each of `models` timed in blocks, each set drawn anew from the next seeds
        (timing.time_sides, tasks.redraw_inputs): one list of times per model."""
        return time_sides(clock, [lambda x, m=m: m(*x) for m in models], sets, count, lambda i, n: seeds[i:i + n],
                          lambda x, seed: tasks.redraw_inputs(x, module, seed, self.device))


BESIDE_WARMUP = (R.Expect, R.Digests, R.Release)  # may run while the compiler warms up: none times anything


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pipeline.judge.reference")
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--fd-socket", type=int, help="a Unix socket to the parent: expected values' memfds go there")
    args = parser.parse_args(argv)
    die_with_parent()  # a killed kgen must not leave this process holding the GPU
    fd = args.result_fd
    handover = socket.socket(fileno=args.fd_socket) if args.fd_socket is not None else None
    start = R.parse(R.Start, sys.stdin.readline(), "a start line")
    cuda = start.device.startswith("cuda")
    if cuda:
        replays.unsplit_large_blocks()
    if cuda and not start.off_lane:  # off its lane: no GPU work until it is moved there (TaskBench.early)
        torch.cuda.init()
    elif not cuda and start.threads:
        torch.set_num_threads(start.threads)  # the candidate's child times with the same count

    def send(event: R.Message) -> None:
        write_line(fd, R.EVENT.dump_json(event).decode())

    ref = Reference(start)
    idle: IdleProbe | None = None  # made at the first block or play, before any candidate has run
    warming = CompilerWarmup(start.device, start.grad, start.off_lane) if start.warm_compiler else None
    warmed = R.Settled()
    send(R.Ready(device_name=torch.cuda.get_device_name() if cuda else cpu_name(), torch_version=torch.__version__,
                 cuda_version=torch.version.cuda))
    while (line := sys.stdin.readline()).strip():
        request = R.parse(R.REQUEST, line, "a request")  # none: this process ends, and the parent sees it failed
        if cuda and isinstance(request, (R.MeasureBaselines, R.TimeBlock)):
            # Started on other cores and moved to its lane's since (executor.LocalExecutor.prepare): as
            # many CPU threads as the lane has cores, like the candidate's child.
            if torch.get_num_threads() != (lane_cores := max(1, len(os.sched_getaffinity(0)))):
                torch.set_num_threads(lane_cores)
        if warming is not None and not isinstance(request, BESIDE_WARMUP):
            warmed = R.Settled(**warming.join())  # nothing is timed beside the warm-up (nor a child's calibration)
            warming = None
        if isinstance(request, R.MeasureBaselines):
            ref.baselines(request, send)
            ref.release()  # the compiled model and its caches: this process lives on, idle, for the run
        elif isinstance(request, R.CheckHealth):
            clock = Clock(ref.device)
            send(R.HealthFigures(bandwidth_gbs=measure_bandwidth(ref.device, clock),
                                 hold_ms=hold_ms(clock) if clock.cuda else None))
            del clock
        elif isinstance(request, R.TimeBlock):
            idle = idle or (IdleProbe() if cuda else None)
            send(_block(ref, request, idle))
        elif isinstance(request, R.Expect):
            ref.drop_sets()  # a call's float64 forward needs the room more than the next eager block does
            with spread(start.spread_cores if ref.device == "cpu" else None):
                for spec in request.specs:
                    meta = ref.expected(spec.size, request.init_seed, spec.seed, spec.variant, spec.inputs, spec.output,
                                        spec.values, spec.errors)
                    fds = {name: meta.pop(name) for name in ("values_fd", "inputs_fd") if name in meta}
                    if fds:  # first: the parent takes them as it reads the line below (a line naming none takes none)
                        R.give(handover, list(fds.values()))
                    send(R.ExpectedCall(key=spec.key, fds=list(fds), **meta))
            ref.release()
        elif isinstance(request, R.Compare):  # the outbox's memfd came just before this line (TaskBench.request)
            _, fds, _, _ = socket.recv_fds(handover, 1, 1)
            try:
                ref.drop_sets()
                with spread(start.spread_cores if ref.device == "cpu" else None):
                    send(ref.compare(request, fds[0]))
            finally:
                for got in fds:
                    os.close(got)
            ref.release()
        elif isinstance(request, R.Digests):  # the replayed Bound calls the parent checks (pipeline.child.replays)
            for item in request.items:
                send(R.Digest(key=item.key, **ref.digest(request.size, request.init_seed, item)))
            ref.release()
        elif isinstance(request, R.Play):  # beside a replayed Bound request (Reference.play)
            try:
                idle = idle or IdleProbe()
                played, busy = idle.timed(lambda: [ref.play(request)])
                send(R.Played(ms=played[0], busy=busy))
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory beside the paused child, or a forward
                ref.plays = {}  # that cannot be captured: the parent says so; empty_cache below
                send(R.PlayFailed(error=one_line(exc)))
        elif isinstance(request, R.Release):
            ref.release()
            ref.plays = {}
        elif isinstance(request, R.Floor):  # the floors again, beside a time below one (TaskBench.floor_now)
            send(R.Floors(**floors_again(ref.device, ref.clock, request.input_bytes, request.flops)))
        elif isinstance(request, R.Settle):  # sent before a child's calibration, which must see a quiet machine
            send(warmed)
        if cuda and not isinstance(request, (R.TimeBlock, R.Play)):
            # This process lives beside every candidate of its task: it keeps no device memory between requests
            # (but an attempt's eager blocks, until its timing ends), so references never starve a candidate.
            torch.cuda.empty_cache()
        send(R.Done(op=request.op, memory_mib=(torch.cuda.memory_allocated() >> 20, torch.cuda.memory_reserved() >> 20)
                    if cuda else None))
    return 0


def _block(ref: Reference, request: R.TimeBlock, idle: IdleProbe | None) -> R.Block:
    """A TimeBlock's block, on an idle GPU (IdleProbe) where it is one."""
    def block(pair: bool = request.pair) -> list[float]:
        return ref.time_block(request.size, request.init_seed, request.seeds, request.warmup, pair, request.cold)
    try:
        times, busy = idle.timed(block) if idle else (block(), None)
    except Exception as exc:  # noqa: BLE001 - torch.compile failing here costs its ratio, not the run
        if not request.pair:
            raise  # eager failing is the reference's own fault, as it always was
        ref.drop_compiled(size_key(request.size))  # the next attempt compiles anew
        # torch.compile failed beside eager: eager alone (were it eager, it raises again here)
        times, busy = idle.timed(lambda: block(False)) if idle else (block(False), None)
        return R.Block(times_ms=times, compile_error=one_line(exc), busy=busy)
    if request.pair:
        return R.Block(times_ms=times[0], compiled_ms=times[1], busy=busy)
    return R.Block(times_ms=times, busy=busy)


if __name__ == "__main__":
    sys.exit(main())
