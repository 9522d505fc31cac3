"""The reference process: expected outputs in float64 and baseline timings, in a process that never
imported candidate code, so a candidate that patches torch cannot move them.

    python -m pipeline.reference --result-fd N      (the job arrives as one JSON line on stdin)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from . import tasks, wire
from .timing import Clock, calls_for, measure_bandwidth, plain_ms, summarize_blocks, time_blocks


def _as64(inputs: list[Any]) -> list[Any]:
    return [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    diff = (a.double() - b.double()).abs().max().item()
    return diff / max(b.double().abs().max().item(), 1e-30)


class Reference:
    def __init__(self, job: dict[str, Any]):
        self.job = job
        self.device = job["device"]
        self.task = tasks.load_file(Path(job["task_path"]))
        self.models: dict[str, tuple[Any, Any]] = {}

    def models_for(self, size: str):
        """(task module, float32 model, float64 model) at a size, built under the shared init seed."""
        key = json.dumps(size, sort_keys=True)
        if key not in self.models:
            module = tasks.load_module(self.task, size)
            m32 = tasks.make_model(module, module.Model, self.job["init_seed"], self.device)
            m64 = tasks.make_model(module, module.Model, self.job["init_seed"], self.device)
            if isinstance(m64, torch.nn.Module):
                m64 = m64.double()
            self.models[key] = (module, m32, m64)
        return self.models[key]

    def expected(self, size: str, seed: int, variant: str) -> dict[str, Any]:
        module, m32, m64 = self.models_for(size)
        inputs = tasks.make_inputs(module, seed, variant, self.device)
        with torch.no_grad():
            ref = m64(*_as64(inputs))
            desc = wire.describe(ref, self.job["sample_seed"])
            out32 = m32(*inputs)
            # How far PyTorch's own float32 lands from float64 here: evidence for the tolerance.
            desc["fp32_rel_err"] = _rel_err(out32, ref) if isinstance(out32, torch.Tensor) else None
            desc["ref_dtype"] = str(out32.dtype).removeprefix("torch.") if isinstance(out32, torch.Tensor) else None
        return desc

    def baselines(self, send) -> None:
        job = self.job
        module, m32, _ = self.models_for(job["size"])
        clock = Clock(self.device)
        seeds = job["baseline_seeds"]
        inputs = tasks.make_inputs(module, seeds[0], "base", self.device)
        result: dict[str, Any] = {"event": "baselines", "input_bytes": tasks.input_bytes(inputs)}
        result["eager"] = self._time(m32, module, seeds, clock, job["warmup"])
        cuda = self.device.startswith("cuda")
        if cuda:
            with torch.no_grad():
                result["eager_plain_ms"] = plain_ms(lambda: m32(*inputs))
        if job.get("compile_baseline"):
            try:
                compiled = torch.compile(m32)
                result["compiled"] = self._time(compiled, module, seeds, clock, job["warmup"] + 2)
                if cuda:
                    with torch.no_grad():
                        result["compiled_plain_ms"] = plain_ms(lambda: compiled(*inputs))
            except Exception as exc:  # noqa: BLE001 - a baseline that cannot compile is reported, not fatal
                result["compile_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        bandwidth = measure_bandwidth(self.device, clock)
        result["bandwidth_gbs"] = bandwidth
        result["floor_ms"] = result["input_bytes"] / (bandwidth * 1e9) * 1e3
        send(result)

    def _time(self, model, module, seeds: list[int], clock: Clock, warmup: int) -> dict[str, float]:
        """The candidate's protocol exactly (pipeline.timing.time_blocks), with as many calls as the
        same rule gives a candidate this fast (timing.calls_for)."""
        inputs = tasks.make_inputs(module, seeds[0], "base", self.device)
        with torch.no_grad():
            for _ in range(warmup):
                model(*inputs)
            job = self.job
            count = calls_for(clock.block_ms(lambda: model(*inputs), 3) / 3, job["timed_ms"], job["timed_calls"],
                              min(job["max_timed_calls"], len(seeds)))
            sets = tasks.block_sets(module, inputs, self.device)
            times = time_blocks(clock, lambda x: model(*x), sets, count, lambda i, n: seeds[i:i + n],
                                lambda x, seed: tasks.refill_inputs(x, module, seed, self.device))
        return summarize_blocks(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pipeline.reference")
    parser.add_argument("--result-fd", type=int, required=True)
    args = parser.parse_args(argv)
    fd = args.result_fd
    job = json.loads(sys.stdin.readline())
    if job["device"].startswith("cuda"):
        torch.cuda.init()

    def send(message: dict[str, Any]) -> None:
        wire.send(fd, message)

    ref = Reference(job)
    env = {"device_name": torch.cuda.get_device_name() if job["device"].startswith("cuda") else _cpu_name(),
           "torch_version": torch.__version__, "cuda_version": torch.version.cuda}
    send({"event": "ready", **env})
    job.update(json.loads(sys.stdin.readline()))  # whether baselines are cached; their seeds if not
    for spec in job["trials"]:
        send({"event": "expected", "index": spec["index"], **ref.expected(spec["size"], spec["seed"], spec["variant"])})
    if job.get("baselines"):
        ref.baselines(send)
    # The parent sizes the timed run from the baselines (timing.calls_for), so its seeds come last.
    send({"event": "need_timed"})
    for i, seed in enumerate(json.loads(sys.stdin.readline())["timed"]):
        send({"event": "expected_timed", "index": i, **ref.expected(job["size"], seed, "base")})
    send({"event": "done"})
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


if __name__ == "__main__":
    sys.exit(main())
