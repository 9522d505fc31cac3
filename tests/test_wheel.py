"""kgen as a user gets it: a wheel built from this tree, installed without -e into a fresh venv, run
from an empty folder. An editable install (CI's) reads the checkout, so it cannot see a subpackage or
a bundled file missing from the wheel; this can."""

from __future__ import annotations

import importlib.util
import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The user's own kernel for mse, in plain PyTorch: judged correct (flagged no_custom_kernel) with no
# C++ build, so the test's minutes go to the install and the evaluator, not a compiler.
CANDIDATE = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
'''


def _venv(where: Path) -> Path:
    """A fresh venv that sees this interpreter's packages (torch and the other dependencies) through a
    .pth, not its kgen: an editable install's finder is a .pth of its own, which Python runs only in a
    site folder, never in one a .pth names. (`venv --system-site-packages` would see the base
    interpreter's packages, not this venv's.)"""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    purelib = Path(subprocess.run([str(where / "bin" / "python"), "-c", "import sysconfig; "
                                   "print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    (purelib / "_kgen_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return where / "bin"


@pytest.mark.slow
def test_wheel_installs_and_judges_from_an_empty_folder(tmp_path):
    wheels = tmp_path / "wheels"
    # Offline where this venv has setuptools (the build backend pyproject names); else pip fetches it.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(wheels), str(ROOT)],
                   check=True, cwd=tmp_path)
    (wheel,) = wheels.glob("kgen-*.whl")
    # Every module of the tree is in it, each stage folder's included, and the report's template.
    with zipfile.ZipFile(wheel) as archive:
        held = set(archive.namelist())
    wanted = {str(p.relative_to(ROOT)) for p in (ROOT / "pipeline").rglob("*")
              if p.suffix in (".py", ".j2") and "__pycache__" not in p.parts}
    assert wanted - held == set() and "pipeline/report/templates/report.html.j2" in held, sorted(wanted - held)
    bin_dir = _venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # --force-reinstall: the new venv sees this one's kgen (an editable install's record) and
    # would otherwise call the wheel installed already.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "-q", "--no-deps",
                    "--force-reinstall", str(wheel)], check=True, env=env)

    empty = tmp_path / "empty"
    empty.mkdir()
    where = subprocess.run([str(bin_dir / "python"), "-c", "import pipeline.judge.evaluate, pipeline.child.harness, pipeline.cli.main; "
                            "from pipeline import bundled; print(bundled.ROOT); "
                            "print(all(bundled.path(p).exists() for p in ('reference_tasks/mse.py', "
                            "'prompts/one_shot.j2', 'fixtures/replay/demo.jsonl', 'config.yaml')))"],
                           cwd=empty, env=env, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr
    root, found = where.stdout.split()
    assert Path(root).is_relative_to(tmp_path / "venv"), root  # the wheel's copy, not this checkout
    assert found == "True"

    (empty / "candidate.py").write_text(CANDIDATE)
    judged = subprocess.run([str(bin_dir / "kgen"), "eval", "candidate.py", "--task", "mse", "--backend", "cpu",
                             "--json"], cwd=empty, env=env, capture_output=True, text=True, timeout=240)
    result = json.loads(judged.stdout.splitlines()[-1])
    assert judged.returncode == 1 and result["flags"] == ["no_custom_kernel"], judged.stdout + judged.stderr[-3000:]
    # The bundled config's size (config.yaml: small with 1024 rows, where the demo's fused kernels are timed).
    assert result["verdict"] == "correct" and result["size"] == "small(batch_size=1024)", result
    assert (empty / "db" / "kgen.db").is_file()  # stored where this folder's commands look
