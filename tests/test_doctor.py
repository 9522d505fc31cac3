"""`kgen doctor`, and a host that refuses a layer of the room: the candidate does not run, and one
line names the layer and how to allow it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A host whose seccomp profile refuses unshare (a container runtime's default does, without
# CAP_SYS_ADMIN): kgen started under a filter that refuses unshare(2) and nothing else.
UNDER_FILTER = """
import ctypes, errno, platform, struct
nr = {"x86_64": 272, "aarch64": 97}[platform.machine()]
insns = [(0x20, 0, 0, 0), (0x15, 0, 1, nr), (0x06, 0, 0, 0x00050000 | errno.EPERM), (0x06, 0, 0, 0x7FFF0000)]
code = b"".join(struct.pack("=HBBI", *i) for i in insns)
buf = ctypes.create_string_buffer(code, len(code))
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0
assert libc.prctl(22, 2, ctypes.byref(Prog(len(insns), ctypes.cast(buf, ctypes.c_void_p))), 0, 0) == 0
from pipeline.cli.main import main
main(["doctor"])
"""


def _doctor(code: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "pipeline.cli.main", "doctor"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.skipif(os.geteuid() != 0, reason="every layer, the cgroup included, needs root")
def test_doctor_lists_every_layer_held_here_and_the_tools():
    out = _doctor()
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for layer in ("filesystem", "seccomp", "netns", "pidns", "ipcns", "utsns", "cgroup", "limits", "not_root"):
        assert any(line.split()[:2] == ["ok", layer] for line in lines), (layer, out.stdout)
    for tool in ("gpu", "nvcc", "triton", "torch"):
        assert sum(line.startswith(tool + " ") for line in lines) == 1, (tool, out.stdout)


def test_a_host_that_refuses_namespaces_runs_no_candidate_and_says_which_layer():
    out = _doctor(UNDER_FILTER)
    assert out.returncode == 1, out.stdout + out.stderr
    missing = [line for line in out.stdout.splitlines() if line.startswith("MISSING")]
    assert any(line.split()[1] == "netns" and "to allow it:" in line for line in missing), out.stdout
    assert any(line.split()[1] == "pidns" for line in missing), out.stdout
    said = [line for line in out.stdout.splitlines() if "the jail said" in line]
    assert len(said) == 1 and "no netns" in said[0] and "the candidate does not run" in said[0], out.stdout
