"""Fast builds (pipeline/build/headers.py): real g++ builds of C++ candidates on the cpu backend, against
kgen's precompiled subset of torch's headers, with the fallback to torch/extension.h as written.

The precompiled headers live in the user's cache (KGEN_CACHE_DIR, else ~/.cache/kgen), like the rest
of the suite's builds, so the suite makes them once (about a minute on 2 cores)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import torch

from pipeline.build import build, headers

pytestmark = pytest.mark.slow

REDTEAM = Path(__file__).parent / "redteam"

# A C++ kernel that needs torch's C++ frontend (torch::nn::functional), which the fast header leaves
# out: its fast build fails and the plain build must stand in.
NEEDS_FRONTEND = '''
import torch
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>
torch::Tensor mse(torch::Tensor a, torch::Tensor b) {
    return torch::nn::functional::mse_loss(a, b);
}
"""
_ext = load_inline(name="kgen_test_needs_frontend", cpp_sources=_SOURCE, functions=["mse"])


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        return _ext.mse(a, b)
'''

# Module-level code of a build child that tries to change the fast headers every later build reads.
PLANTS_A_HEADER = '''
import os
from pathlib import Path

from torch.utils.cpp_extension import load_inline  # noqa: F401 (code that builds gets the fast headers)

folder = Path(os.environ["KGEN_HEADERS"])
for target in (folder / "torch" / "extension.h", folder / "torch" / "planted.h"):
    try:
        with open(target, "a") as f:
            f.write("#error planted by a candidate\\n")
    except OSError:
        continue
    raise SystemExit(f"wrote {target}")


class ModelNew:
    pass
'''


def _copy(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return path


def test_a_candidate_builds_against_the_precompiled_headers_and_a_second_reuses_them(tmp_path):
    first = build.build(REDTEAM / "honest_cpp.py", "fasthonest000000", tmp_path / "builds",
                        build.BuildOptions(timeout_s=900, reuse=False))
    assert first.ok, first.log[-2000:]
    assert first.headers == "fast"
    folder = headers.ensure(False)
    assert folder is not None and (folder / "ready").is_file()
    variants = sorted(p.name for p in (folder / "torch" / "extension.h.gch").iterdir())
    assert variants == ["O3.gch", "plain.gch"]  # both passed g++'s own -Werror=invalid-pch check
    made = {p: p.stat().st_mtime_ns for p in (folder / "torch" / "extension.h.gch").iterdir()}
    ninja = (Path(first.build_dir) / "kgen_redteam_honest_mse" / "build.ninja").read_text()
    assert f"-I{folder}" in ninja  # the include folder the PCH sits in came first
    # honest_cpp.py passes -O3: g++ read the O3 variant; compiling it again with a variant that
    # does not match (-Werror=invalid-pch) must fail, which shows the check means something.
    cxx, flags = headers.compile_command(False)
    probe = tmp_path / "probe.cpp"
    probe.write_text("#include <torch/extension.h>\n")
    import subprocess

    only_plain = tmp_path / "only_plain" / "torch"
    only_plain.mkdir(parents=True)
    shutil.copy(folder / "torch" / "extension.h", only_plain)
    shutil.copy(folder / "torch" / "extension.h.gch" / "plain.gch", only_plain / "extension.h.gch")
    wrong = subprocess.run([cxx, f"-I{only_plain.parent}", *flags, "-O2", "-Winvalid-pch", "-Werror=invalid-pch",
                            "-fsyntax-only", str(probe)], capture_output=True, text=True)
    assert wrong.returncode != 0 and "pch" in wrong.stderr.lower()

    second_code = (REDTEAM / "honest_cpp.py").read_text().replace("kgen_redteam_honest_mse", "kgen_test_second")
    second = build.build(_copy(tmp_path, "second", second_code), "fastsecond000000", tmp_path / "builds",
                         build.BuildOptions(timeout_s=900, reuse=False))
    assert second.ok and second.headers == "fast"
    assert {p: p.stat().st_mtime_ns for p in (folder / "torch" / "extension.h.gch").iterdir()} == made


def test_a_changed_torch_or_compiler_gets_its_own_headers(tmp_path, monkeypatch):
    def folder_key() -> str:
        cxx, flags = headers.compile_command(False)
        return headers.key(cxx, flags)

    base = folder_key()
    assert folder_key() == base
    monkeypatch.setattr(torch, "__version__", torch.__version__ + "+other")
    assert folder_key() != base
    monkeypatch.undo()
    wrapper = tmp_path / "g++-other"
    wrapper.write_text(f"#!/bin/sh\nexec {shutil.which('g++') or 'g++'} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CXX", str(wrapper))
    assert folder_key() != base


def test_a_candidate_the_fast_headers_cannot_build_is_built_as_written(tmp_path):
    result = build.build(_copy(tmp_path, "frontend", NEEDS_FRONTEND), "needsfrontend000", tmp_path / "builds",
                         build.BuildOptions(timeout_s=900, reuse=False))
    assert result.ok, result.log[-2000:]
    assert result.headers == "plain"
    assert "built with torch/extension.h as written, after a build with kgen's fast headers (failed in" in result.log
    assert "nn::functional" not in build.failure_line(result)  # the log is the plain build's, which passed


def test_a_build_child_cannot_write_the_shared_headers(tmp_path):
    folder = headers.ensure(False)
    assert folder is not None
    before = (folder / "torch" / "extension.h").read_text()
    result = build.build(_copy(tmp_path, "plant", PLANTS_A_HEADER), "plantheader00000", tmp_path / "builds",
                         build.BuildOptions(timeout_s=300, reuse=False))
    if os.environ.get("KGEN_LANDLOCK") == "0":
        pytest.skip("Landlock switched off")
    assert result.ok, result.log[-2000:]  # every write was refused, so the module imported
    assert (folder / "torch" / "extension.h").read_text() == before
    assert not (folder / "torch" / "planted.h").exists()


# The host side of a .cu kernel as completions write it: factories, options, checks, dtype
# dispatch, Tensor's methods and its operators. Built against the light header by g++ here (nvcc's
# own host pass reads the same text); the .cu builds themselves run on the device (tests/test_gpu.py).
LIGHT_HOST_CODE = r"""
#include "kgen_light.h"
torch::Tensor host(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.sizes() == b.sizes() && a.scalar_type() == torch::kFloat32, "shapes");
    auto out = torch::empty({a.size(0)}, a.options().dtype(torch::kFloat64));
    auto zeros = torch::zeros_like(a).contiguous();
    AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "host", [&] { (void)a.data_ptr<scalar_t>(); });
    auto scale = at::tensor({0.5}, a.options());
    return (at::sum(a * b) / static_cast<float>(a.numel()) + zeros.mean() * scale).to(out.dtype());
}
"""


def test_the_light_aten_header_builds_a_kernels_host_code_but_not_torch_tensor(tmp_path):
    """torch::tensor({0.5}) is float32 with torch/types.h and at::tensor({0.5}) float64: the light
    header has at::tensor but must not let torch::tensor compile (a .cu that calls it is built with
    torch/types.h instead)."""
    text = headers.light_header()
    assert text is not None and "constexpr auto kFloat32" in text and "using namespace at" in text
    assert "<ATen/Functions.h>" not in text
    (tmp_path / "kgen_light.h").write_text(text)
    cxx, flags = headers.compile_command(False)
    for name, body, ok in (("host", LIGHT_HOST_CODE, True),
                           ("tensor", '#include "kgen_light.h"\nauto t = torch::tensor({0.5});\n', False)):
        (tmp_path / f"{name}.cpp").write_text(body)
        done = subprocess.run([cxx, *flags, "-fsyntax-only", str(tmp_path / f"{name}.cpp")], capture_output=True,
                              text=True, timeout=600)
        assert (done.returncode == 0) is ok, done.stderr[-2000:]
    assert re.search(r"use of deleted function .*torch::tensor", done.stderr), done.stderr[-800:]


def test_a_cu_built_light_reads_the_light_header_in_place_of_torch_types_h(tmp_path):
    """load_inline writes `#include <torch/types.h>` above a .cu's text, so a folder that shadowed
    only torch/extension.h would still bring in all of ATen (and clash with the light header's copy
    of torch's aliases: on the H100 every .cu fell back so). The headers a .cu reads,
    as nvcc's front end sees them (__CUDACC__), listed by the preprocessor."""
    folder = tmp_path / "inc"
    headers.write_shims(folder, headers.light_header() or "")
    cu = tmp_path / "cuda.cu"
    cu.write_text("#include <torch/types.h>\n#include <cuda.h>\n#include <torch/extension.h>\n")
    cxx, flags = headers.compile_command(False)

    def read(*defines: str) -> str:
        done = subprocess.run([cxx, f"-I{folder}", *flags, "-D__CUDACC__", *defines, "-x", "c++", "-M", "-MG", str(cu)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    types_h, everything = "torch/csrc/api/include/torch/types.h", "ATen/Functions.h"
    light = read("-DKGEN_LIGHT_ATEN")
    assert "kgen_light.h" in light and types_h not in light and everything not in light
    fast = read()
    assert "kgen_light.h" not in fast and types_h in fast and everything in fast


def test_the_light_header_is_asked_for_only_by_cu_sources_that_never_mention_requires_grad():
    from pipeline.child.harness import _light_fits

    assert _light_fits("__global__ void k() {}") and _light_fits(["a", "b"])
    assert not _light_fits(None) and not _light_fits([])  # a C++ extension: nothing to build light
    assert not _light_fits(["ok", "torch::zeros({2}, o.requires_grad(true))"])


def test_old_header_folders_are_pruned_past_the_last_used_and_never_while_being_made(tmp_path):
    """Every virtual environment gets a folder of some 1.2 GB (a box of fresh clones kept 13 GB in a
    day): when one is made, those past the KEEP_FOLDERS last used go, once idle, unless being made."""
    import fcntl
    import time

    now = time.time()
    ages = {"a": 10, "b": 20, "c": 30, "d": 7200, "e": 9000, "f": 600}  # seconds since last use
    for name, age in ages.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "ready").write_text("O3\n")
        os.utime(tmp_path / name / "ready", (now - age, now - age))
    (tmp_path / "half").mkdir()  # being made: no `ready` yet
    with open(tmp_path / "e.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another kgen holds e's lock
        removed = headers.prune(tmp_path, keep=3, idle_s=3600)
    assert removed == ["d"]  # f is past the three last used but used 10 minutes ago; e is locked
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["a", "b", "c", "e", "f", "half"]
    assert headers.prune(tmp_path, keep=3, idle_s=3600) == ["e"]  # its lock free now


def test_code_that_compiles_nothing_is_not_built_and_makes_no_headers(tmp_path, monkeypatch):
    """A pure-PyTorch candidate (a KernelBench reference dropped in) gets no build child (its import
    took 4-5 s) and no precompiled headers (a fresh clone's first evaluation of one made them once,
    28 s and 1.2 GB written): an empty folder of its own, a stale one's files gone."""
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(headers, "_ready", {})
    code = tmp_path / "plain.py"
    code.write_text("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                    "        return torch.relu(x)\n")
    (tmp_path / "builds" / "plainhash" / "old").mkdir(parents=True)
    result = build.build(code, "plainhash", tmp_path / "builds", build.BuildOptions(timeout_s=300, reuse=False))
    assert result.ok and result.log == build.NOTHING_TO_BUILD and result.seconds == 0, result.log[-2000:]
    assert not any(Path(result.build_dir).iterdir())
    assert not list((tmp_path / "cache").rglob("ready")) and not list((tmp_path / "cache").rglob("*.gch"))


def test_a_build_is_kept_for_the_next_project_and_judged_from_there(tmp_path, monkeypatch):
    """A build of the same code in another builds folder is the kept one, copied (no build child ran:
    the candidate's module-level note is not in the log twice), byte for byte, and judged correct
    from its new folder; other code, another route or reuse=False builds afresh."""
    from pipeline.build import cache
    from pipeline.child import tasks
    from pipeline.config import EvalConfig
    from pipeline.judge import evaluate
    from pipeline.judge.bench import prepare
    from pipeline.records import Verdict

    monkeypatch.setenv("KGEN_BUILD_CACHE", str(tmp_path / "kept"))
    code = _copy(tmp_path, "honest", (REDTEAM / "honest_cpp.py").read_text() + f"\nprint('built {tmp_path.name}')\n")
    first = build.build(code, "keptfirst0000000", tmp_path / "a", build.BuildOptions(timeout_s=900))
    assert first.ok and not first.cached, first.log[-2000:]
    second = build.build(code, "keptsecond000000", tmp_path / "b", build.BuildOptions(timeout_s=900))
    assert second.ok and second.cached and second.code_hash == "keptsecond000000"
    assert second.build_dir == str((tmp_path / "b" / "keptsecond000000").resolve())
    assert second.log == first.log and second.log.count(f"built {tmp_path.name}") == 1
    so = "kgen_redteam_honest_mse/kgen_redteam_honest_mse.so"
    assert (Path(second.build_dir) / so).read_bytes() == (Path(first.build_dir) / so).read_bytes()
    assert len(list((tmp_path / "kept").iterdir())) == 1

    task = tasks.discover(Path(__file__).resolve().parent.parent / "reference_tasks", ["mse"])[0]
    settings = EvalConfig(compile_baseline=False, trials=2, timed_calls=5, timed_ms=0, warmup_calls=1, timeout_s=120)
    bench = prepare(task, "small", "cpu", settings)
    try:
        result = evaluate.evaluate(bench, code, Path(second.build_dir), settings)
    finally:
        bench.close()
    assert result.verdict is Verdict.correct and result.own_code.holds_own, (result.error, result.detail)

    env = {"KGEN_CORES": "0"}  # where a build runs does not change what it makes
    assert cache.key(b"x", env, fast=True) == cache.key(b"x", {}, fast=True)
    assert len({cache.key(b"x", {}, fast=True), cache.key(b"y", {}, fast=True), cache.key(b"x", {}, fast=False),
                cache.key(b"x", {"TORCH_CUDA_ARCH_LIST": "9.0"}, fast=True)}) == 4
    third = build.build(code, "keptthird0000000", tmp_path / "c", build.BuildOptions(timeout_s=900, reuse=False))
    assert third.ok and not third.cached and third.log.count(f"built {tmp_path.name}") == 1


def test_a_kept_build_holds_plain_files_alone(tmp_path, monkeypatch):
    """A build tree holding a link (to a file a later attempt must not get) or a FIFO is not kept,
    nor one of too many files, nor a failed build; a kept entry whose record is unreadable is a miss, not an error."""
    from pipeline.build import cache
    from pipeline.records import BuildResult

    monkeypatch.setenv("KGEN_BUILD_CACHE", str(tmp_path / "kept"))
    for n, plant in enumerate([lambda d: (d / "x.so").symlink_to("/etc/passwd"), lambda d: os.mkfifo(d / "pipe")]):
        tree = tmp_path / f"tree{n}"
        (tree / "ext").mkdir(parents=True)
        (tree / "ext" / "ext.so").write_bytes(b"\x7fELF")
        plant(tree / "ext")
        cache.save(f"entry{n}", BuildResult(code_hash="h", ok=True, build_dir=str(tree)))
        assert not (tmp_path / "kept" / f"entry{n}").exists()
    many = tmp_path / "many"
    many.mkdir()
    for n in range(cache.MAX_FILES + 1):
        (many / str(n)).touch()
    cache.save("many", BuildResult(code_hash="h", ok=True, build_dir=str(many)))
    assert not (tmp_path / "kept" / "many").exists()
    plain = tmp_path / "plain"
    (plain / "ext").mkdir(parents=True)
    (plain / "ext" / "ext.so").write_bytes(b"\x7fELF")
    cache.save("failed", BuildResult(code_hash="h", ok=False, build_dir=str(plain)))
    assert not (tmp_path / "kept" / "failed").exists()
    cache.save("good", BuildResult(code_hash="h", ok=True, build_dir=str(plain), seconds=20.0))
    got = cache.load("good", tmp_path / "out" / "h2", "h2")
    assert got is not None and got.cached and got.seconds == 20.0
    assert (tmp_path / "out" / "h2" / "ext" / "ext.so").read_bytes() == b"\x7fELF"
    (tmp_path / "kept" / "good" / "result.json").write_text("{not json")
    assert cache.load("good", tmp_path / "out" / "h3", "h3") is None and not (tmp_path / "out" / "h3").exists()
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["good"]  # no half-made copy left behind


def test_the_build_cache_prunes_while_other_builds_rename_and_remove_their_entries(tmp_path):
    """Builds in parallel share one cache: one's prune lists a `.new-` folder that another renames or
    removes before it is stat'ed (a GPU call's eight parallel builds failed on that, FileNotFoundError)."""
    import threading
    import time

    from pipeline.build import cache

    stale = tmp_path / ".new-stale"
    stale.mkdir()
    os.utime(stale, (time.time() - 7200, time.time() - 7200))  # left by a killed process two hours ago
    for n in range(cache.MAX_ENTRIES + 10):  # a full cache: every prune removes some
        (tmp_path / f"kept-{n}").mkdir()
    done = threading.Event()

    def churn():
        n = 0
        while not done.is_set():
            new = tmp_path / f".new-{n}"
            new.mkdir()
            os.rename(new, tmp_path / f"entry-{n}") if n % 2 else new.rmdir()
            n += 1

    other = threading.Thread(target=churn)
    other.start()
    try:
        for _ in range(500):
            cache._prune(tmp_path)
    finally:
        done.set()
        other.join()
    assert not stale.exists()
    cache._prune(tmp_path)  # and, with none beside it, only the last MAX_ENTRIES kept
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == cache.MAX_ENTRIES
