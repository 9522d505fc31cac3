"""nvcc's steps with host and device side by side (pipeline/build/nvcc_split.py), against nvcc itself on
real .cu files. nvcc only compiles here, so no GPU is needed; without nvcc these are skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.build import nvcc_split

NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no nvcc on this machine")
SCRIPT = Path(nvcc_split.__file__)
ARCH = ["-gencode", "arch=compute_90,code=sm_90"]

SOURCE = r"""
#include <cuda_runtime.h>
#include <vector>
template <typename T> __global__ void scale(T* x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + static_cast<T>(1);
}
std::vector<int> launch(float* x, double* y, int n) {
    scale<float><<<(n + 255) / 256, 256>>>(x, 2.0f, n);
    scale<double><<<(n + 255) / 256, 256>>>(y, 3.0, n);
    return {n, 2};
}
"""


def section(obj: Path, name: str) -> bytes:
    out = obj.with_name(obj.name + name)
    subprocess.run(["objcopy", "-O", "binary", f"--only-section={name}", str(obj), str(out)], check=True)
    return out.read_bytes()


def compile_both(tmp_path: Path, source: str, flags: list[str]) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    cu = tmp_path / "k.cu"
    cu.write_text(source)
    plain = subprocess.run([NVCC, *flags, "-c", str(cu), "-o", str(tmp_path / "plain.o")], capture_output=True, text=True)
    split = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), NVCC, *flags, "-c", str(cu), "-o", str(tmp_path / "split.o")],
                           capture_output=True, text=True)
    return plain, split


@needs_nvcc
def test_the_object_holds_what_nvcc_alone_compiles(tmp_path):
    plain, split = compile_both(tmp_path, SOURCE, [*ARCH, "-O3", "--use_fast_math"])
    assert plain.returncode == 0, plain.stderr
    assert split.returncode == 0, split.stdout + split.stderr
    assert f"{nvcc_split.MARK} host and device steps side by side" in split.stdout
    # nvcc names temporary files after its pid, so two objects of one source never match byte for byte
    # (a static initialiser's name); the device code and the host code do.
    for name in (".nv_fatbin", ".text", ".rodata"):
        assert section(tmp_path / "split.o", name) == section(tmp_path / "plain.o", name), name
    # It leaves no intermediate file behind.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith((".nv_fatbin", ".text", ".rodata"))) == \
        ["k.cu", "plain.o", "split.o"]


@needs_nvcc
def test_a_broken_cu_fails_with_the_front_ends_error_once(tmp_path):
    broken = SOURCE.replace("x[i] * a", "x[i] * undeclared_name")
    plain, split = compile_both(tmp_path, broken, ARCH)
    assert plain.returncode != 0 and split.returncode != 0
    assert "undeclared_name" in plain.stdout + plain.stderr
    # cudafe++ and cicc would both report it; only the host front end's output is shown, as nvcc shows it.
    assert (split.stdout + split.stderr).count('identifier "undeclared_name" is undefined') == 1
    assert not (tmp_path / "split.o").exists()


@needs_nvcc
def test_a_device_only_error_is_nvccs_own_device_chain(tmp_path):
    # Calling a host function from a kernel passes cudafe++ and fails in cicc: the device chain is run
    # again as nvcc wrote it (from cudafe++'s module id) and its error stands.
    host_call = SOURCE.replace("template <typename T> __global__", "int host_only() { return 1; }\ntemplate <typename T> __global__") \
        .replace("static_cast<T>(1)", "static_cast<T>(host_only())")
    plain, split = compile_both(tmp_path, host_call, ARCH)
    assert plain.returncode != 0 and split.returncode != 0
    assert "host_only" in split.stdout + split.stderr
    assert nvcc_split.MARK not in split.stdout


@needs_nvcc
def test_a_plan_it_does_not_know_is_nvccs_to_run(tmp_path):
    # Two architectures: two device chains, which this does not split; nvcc builds it as ever.
    two = ["-gencode", "arch=compute_80,code=sm_80", *ARCH]
    plain, split = compile_both(tmp_path, SOURCE, two)
    assert plain.returncode == 0 and split.returncode == 0, split.stdout + split.stderr
    assert nvcc_split.MARK not in split.stdout
    assert section(tmp_path / "split.o", ".nv_fatbin") == section(tmp_path / "plain.o", ".nv_fatbin")


def test_the_dry_run_plan_is_read_by_role():
    # nvcc 13.0's dry run for one .cu and one architecture, cut to what read_dry_run() reads.
    dry = "\n".join([
        "#$ _NVVM_BRANCH_=nvvm", "#$ CICC_PATH=/cuda/nvvm/bin", '#$ LIBRARIES=  "-L/cuda/lib"',
        '#$ gcc -E -x c++ -D__CUDACC__ "k.cu" -o "/t/x-5_k.cpp4.ii"',
        '#$ cudafe++ --gen_c_file_name "/t/x-6_k.cudafe1.cpp" --gen_module_id_file --module_id_file_name "/t/x-4_k.module_id" "/t/x-5_k.cpp4.ii"',
        '#$ gcc -D__CUDA_ARCH__=900 -E -x c++ "k.cu" -o "/t/x-7_k.cpp1.ii"',
        '#$ "$CICC_PATH/cicc" -arch compute_90 --module_id_file_name "/t/x-4_k.module_id" "/t/x-7_k.cpp1.ii" -o "/t/x-6_k.ptx"',
        '#$ ptxas -arch=sm_90 "/t/x-6_k.ptx" -o "/t/x-8_k.cubin"',
        '#$ fatbinary -64 "--image3=kind=elf,sm=90,file=/t/x-8_k.cubin" --embedded-fatbin="/t/x-3_k.fatbin.c"',
        '#$ rm /t/x-3_k.fatbin',
        '#$ gcc -D__CUDA_ARCH__=900 -c -x c++ "/t/x-6_k.cudafe1.cpp" -o "k.o"',
    ])
    assignments, steps, other = nvcc_split.read_dry_run(dry)
    assert assignments[1] == "CICC_PATH=/cuda/nvvm/bin" and other == []
    assert steps["host_pre"].endswith('"/t/x-5_k.cpp4.ii"') and steps["device_pre"].endswith('"/t/x-7_k.cpp1.ii"')
    assert nvcc_split.own_id(steps["cicc"], "/t/x-4_k.module_id") == \
        '"$CICC_PATH/cicc" -arch compute_90 --gen_module_id_file --module_id_file_name "/t/x-4_k.module_id.cicc" "/t/x-7_k.cpp1.ii" -o "/t/x-6_k.ptx"'
    # Dependency files are a step nvcc does itself: such a plan is nvcc's to run.
    assert nvcc_split.read_dry_run(dry.replace("#$ rm", "#$ -- Filter Dependencies -- > k.o.d\n#$ rm")) is None
    # A second device chain (two architectures) too.
    assert nvcc_split.read_dry_run(dry.replace("#$ rm", '#$ ptxas -arch=sm_80 "a.ptx" -o "b.cubin"\n#$ rm')) is None
