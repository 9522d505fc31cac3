"""Is the GPU fit to time? Checked before a task's baselines and around every attempt, not assumed: a GPU
can go bad under a run and still answer (docs/decisions/gpu-timing.md). The lane's reference process
measures its device (bandwidth, a 1 ms hold between CUDA events) and the parent asks the driver for
foreign compute processes and held-down clocks. Fit: within POLICY.bandwidth_tol and POLICY.hold_tol of
the lane's first check (and POLICY.stored_bandwidth), nothing else computing. An unfit device stops
timing: attempts are judged for correctness only or marked (EvalResult.device_unfit), its baselines are
not cached, and a resume re-times them. The cpu is not checked: there both sides are timed side by side.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from ..policy import POLICY
from . import refproto as R

# clocks_event_reasons bits that mean the device is slowed by something other than its work: HW
# slowdown, SW and HW thermal slowdown, HW power brake (nvidia-smi --help-query-gpu).
THROTTLE_BITS = {0x8: "hardware slowdown", 0x20: "thermal slowdown (software)", 0x40: "thermal slowdown (hardware)",
                 0x80: "power brake"}


class Probe(BaseModel):
    """One check of a lane's device."""

    bandwidth_gbs: float
    """Memory bandwidth the reference process measured (timing.measure_bandwidth)."""
    hold_ms: float | None = None
    """How long a 1 ms hold took between CUDA events (timing.hold_ms)."""
    others: list[str] = []
    """Compute processes on this GPU that are not kgen's, as 'pid command'."""
    throttle: list[str] = []
    """Clock limits the driver reports as active (THROTTLE_BITS)."""


def unfit_reason(probe: Probe, start: Probe | None, device_name: str) -> str | None:
    """Why `probe` shows a device unfit to time, or None."""
    if probe.others:
        return f"another compute process is on the GPU ({', '.join(probe.others[:3])})"
    if probe.throttle:
        return f"the driver reports clocks held down ({', '.join(probe.throttle)})"
    if probe.hold_ms is not None and probe.hold_ms > 1.0 * (1 + POLICY.hold_tol):
        return f"a 1 ms hold took {probe.hold_ms:.3f} ms: the GPU is shared or every launch has slowed"
    for figure, where in ((start.bandwidth_gbs if start else None, "when the run began"),
                          (POLICY.stored_bandwidth.get(device_name), f"on a healthy {device_name}")):
        if figure and probe.bandwidth_gbs < figure * (1 - POLICY.bandwidth_tol):
            return f"bandwidth {probe.bandwidth_gbs:.0f} GB/s against {figure:.0f} GB/s {where}"
    return None


@dataclass
class Watch:
    """One GPU lane's checks over a run: the first fit probe is what later ones are held to."""

    lane: str | None
    start: Probe | None = None
    uuid: str | None = None  # the lane's GPU as the driver names it ("" where nvidia-smi cannot say)
    history: list[tuple[Probe | None, str | None]] = field(default_factory=list)
    fit_at: float | None = None  # time.monotonic() of the last check that found the device fit

    def check(self, bench: Any, env: dict[str, str] | None) -> str | None:
        """Probe the lane's device through `bench`'s reference process; why it is unfit, or None."""
        try:
            msgs = bench.request(R.CheckHealth(), 120, env)
        except RuntimeError as exc:  # the reference process died on its device (EvaluationError)
            return self._record(None, f"the reference process failed its health check: {str(exc)[-300:]}")
        found = [m for m in msgs if isinstance(m, R.HealthFigures)]
        if not found:
            return self._record(None, "the reference process sent no health figures")
        if self.uuid is None:
            self.uuid = _uuid(self.lane) or ""
        probe = Probe(bandwidth_gbs=found[0].bandwidth_gbs, hold_ms=found[0].hold_ms,
                      others=foreign_compute_processes(self.uuid), throttle=throttled(self.uuid))
        reason = unfit_reason(probe, self.start, bench.env.get("device_name", ""))
        if reason is None and self.start is None:
            self.start = probe
        return self._record(probe, reason)

    def _record(self, probe: Probe | None, reason: str | None) -> str | None:
        self.history.append((probe, reason))
        self.fit_at = time.monotonic() if probe is not None and reason is None else None
        return reason

    def recent(self, within_s: float | None = None) -> bool:
        """Whether the last check found the device fit within `within_s` seconds, so the check before an
        attempt may take it for its own: in a batch only kgen's work ran since, and the check after that
        attempt still sees whatever came up meanwhile."""
        within_s = POLICY.recent_s if within_s is None else within_s
        return self.fit_at is not None and time.monotonic() - self.fit_at < within_s

    @property
    def failure(self) -> str | None:
        """Why the last check found the device unfit; None if it was fit (or nothing was checked)."""
        return self.history[-1][1] if self.history else None


def cpu_name() -> str:
    """The cpu's model name, as the device's name for a cpu run."""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(("cpu: " + x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), "cpu")
    return "cpu"


def _smi(*args: str) -> list[list[str]]:
    """Rows of an nvidia-smi CSV query; none where nvidia-smi is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, *args, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_free_bytes(lane: str | None) -> int | None:
    """Free memory on a lane's GPU (its CUDA_VISIBLE_DEVICES; None: this process's first visible GPU)
    as the driver reports it; None where nvidia-smi cannot say. Not torch's cudaMemGetInfo, which would
    open a CUDA context in a parent that never computes on a device."""
    rows = _smi("-i", _gpu_id(lane), "--query-gpu=memory.free")
    try:
        return int(float(rows[0][0])) << 20 if rows and rows[0] else None  # MiB
    except ValueError:
        return None


def memory_by_process(lane: str | None) -> dict[int, int]:
    """MiB of GPU memory each compute process holds on a lane's GPU, as the driver reports it (host pids)."""
    uuid, held = _uuid(lane), {}
    for row in _smi("--query-compute-apps=gpu_uuid,pid,used_memory"):
        with contextlib.suppress(ValueError, IndexError):
            if row[0] == uuid:
                held[int(row[1])] = int(float(row[2]))
    return held


def _gpu_id(lane: str | None) -> str:
    """The GPU a lane computes on, as nvidia-smi names it (its first CUDA_VISIBLE_DEVICES entry; no
    lane: this process's first visible GPU)."""
    return (lane or os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()


def _uuid(lane: str | None) -> str | None:
    index = _gpu_id(lane)
    for row in _smi("--query-gpu=index,uuid"):
        if row and (row[0] == index or row[-1] == index):
            return row[-1]
    return None


def descendants(root: int) -> set[int]:
    """Every live process started by `root`, at any depth (from /proc's parent links)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parent[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, grew = {root}, True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    return found - {root}


def ours() -> set[int]:
    """This process and every process it started (reference processes, children)."""
    return {os.getpid()} | descendants(os.getpid())


def foreign_compute_processes(uuid: str) -> list[str]:
    """Compute processes the driver lists on this lane's GPU that are not ours. A pid this machine's
    /proc does not show (another container's) cannot be named, so it is not counted: the bandwidth
    and hold figures still see what it does to the device. `uuid` "": every GPU's."""
    mine = ours()
    found = []
    for row in _smi("--query-compute-apps=gpu_uuid,pid,process_name"):
        if len(row) < 3 or (uuid and row[0] != uuid) or not row[1].isdigit():
            continue
        pid = int(row[1])
        if pid in mine or not Path(f"/proc/{pid}").exists():
            continue
        found.append(f"{pid} {row[2]}")
    return found


def throttled(uuid: str) -> list[str]:
    rows = _smi(*(["-i", uuid] if uuid else []), "--query-gpu=clocks_event_reasons.active")
    if not rows:
        rows = _smi(*(["-i", uuid] if uuid else []), "--query-gpu=clocks_throttle_reasons.active")
    try:
        bits = int(rows[0][0], 16) if rows else 0
    except ValueError:
        return []
    return [name for bit, name in THROTTLE_BITS.items() if bits & bit]


class IdleProbe:
    """Whether the GPU runs other work than ours, checked around each eager block with the child stopped: a
    spinner left on a side stream is stopped on the host, not the device (docs/decisions/gpu-timing.md). The
    probe is a tiny kernel's wall time, which waits milliseconds for a time slice where the SMs are held."""

    SLACK_MS = 0.2  # above the idle time; a time slice of another context costs more than this
    WAIT_S = 2.0  # how long a busy device is waited for before the block is timed anyway

    def __init__(self):
        import torch  # here, not above: the parent imports this module and never needs torch for it

        self.torch = torch
        self.x = torch.zeros(256, device="cuda")
        for _ in range(3):
            self.probe()
        self.idle_ms = min(self.probe() for _ in range(20))

    def probe(self) -> float:
        self.torch.cuda.synchronize()
        start = time.perf_counter()
        self.x.add_(1.0)
        self.torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    def busy_ms(self) -> float | None:
        """The fastest of three probes where it says the device is busy, else None."""
        fastest = min(self.probe() for _ in range(3))
        return fastest if fastest > self.idle_ms + self.SLACK_MS else None

    def wait(self) -> float | None:
        end = time.monotonic() + self.WAIT_S
        while (busy := self.busy_ms()) is not None and time.monotonic() < end:
            time.sleep(0.01)
        return busy

    def timed(self, block) -> tuple[list[float], dict[str, Any] | None]:
        """`block()`'s times, taken on an idle device: waited for before, checked after, timed
        again once where it was busy after; and what the probe saw where the device was still busy
        after that (the times stand on a busy device), else None."""
        self.wait()
        times = block()
        if self.busy_ms() is not None:
            self.wait()
            times = block()
            if (again := self.busy_ms()) is not None:
                return times, {"after_ms": again, "idle_ms": self.idle_ms}
        return times, None
