"""What this host allows a candidate's room, and the tools kgen builds and times with (`kgen doctor`).

Each layer is read the way an attempt reads it: a real jailed child is started (the harness, which
exits at once for want of work), and the parent checks it for itself (pipeline.sandbox.confine.verified).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

# The room's layers, in the order a reader meets them, each with what it stops.
LAYERS = [
    ("filesystem", "Landlock: reads and writes only where the attempt needs"),
    ("seccomp", "no new namespaces, keyrings, io_uring, Unix sockets, mounts or setsid"),
    ("netns", "a network namespace: no address of the host, its loopback included"),
    ("pidns", "a pid namespace: nothing the attempt starts outlives it"),
    ("ipcns", "an IPC namespace: no System V object or queue shared with the host or another attempt"),
    ("utsns", "a UTS namespace"),
    ("cgroup", "cgroups: a limit on its processes and memory"),
    ("limits", "a limit on the size of any file it writes"),
    ("not_root", "an unprivileged uid"),
]


def _layers() -> tuple[dict[str, bool], str]:
    from .. import sandbox
    from ..child import HARNESS
    child = sandbox.start(HARNESS, ["eval"], 60, jail=sandbox.Jail(gpu=False))
    try:
        confinement = child.confinement()
    finally:
        code, log = child.finish(grace=5.0)
    held = {name: bool(getattr(confinement, name, False)) for name, _ in LAYERS}
    status = child.status or {}
    if status.get("missing") is not None or status.get("error"):  # refused: what the jail itself saw
        held = {name: bool(status.get(name)) for name, _ in LAYERS}
        held["not_root"] = status.get("uid") not in (None, 0)
    said = [line for line in log.splitlines() if line.startswith("[kgen] jail:")]
    return held, said[-1] if said else ""


def _tool(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout or out.stderr).strip() if out.returncode == 0 else None


def report() -> tuple[list[str], bool]:
    """The lines `kgen doctor` prints, and whether every layer holds."""
    from ..child.jail.jail import HOW
    from ..sandbox import cgroup, confine

    lines = []
    if not confine.enabled():
        held, why = {name: False for name, _ in LAYERS}, "KGEN_JAIL=0: the jail is off"
    else:
        held, why = _layers()
    for name, what in LAYERS:
        if held[name]:
            extra = f" (cgroup {cgroup.available()})" if name == "cgroup" else ""
            lines.append(f"ok       {name:<10} {what}{extra}")
        else:
            lines.append(f"MISSING  {name:<10} {what}; to allow it: {HOW.get(name, 'run as root')}")
    if why:
        lines.append(f"         the jail said: {why}")
    smi = _tool(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    lines.append(f"gpu      {smi.splitlines()[0] if smi else 'none visible (the cpu backend judges here)'}")
    nvcc = _tool(["nvcc", "--version"])
    lines.append(f"nvcc     {nvcc.splitlines()[-1] if nvcc else 'not found (cuda candidates cannot build)'}")
    try:
        import triton

        lines.append(f"triton   {triton.__version__}")
    except Exception:  # noqa: BLE001 - any failure to import is "not usable"
        lines.append("triton   not installed (triton candidates cannot run)")
    import torch

    lines.append(f"torch    {torch.__version__}" + (f", CUDA {torch.version.cuda}" if torch.version.cuda else ", cpu build"))
    lines.append(f"python   {sys.version.split()[0]}, uid {os.geteuid()}")
    required = [name for name, _ in LAYERS if name != "cgroup" or os.geteuid() == 0]
    return lines, all(held[name] for name in required)
