import os
import shutil
import subprocess
import textwrap
import time

import pytest

from pipeline.generate.diagnostics import MESSAGE_CAP, SOURCE_CAP, Diagnostic, compiler_errors

# C++ as a candidate writes it: tabs in one line (gcc echoes tabs expanded), a one-line declaration.
CPP = """\
#include <torch/extension.h>

torch::Tensor scale(torch::Tensor x) {
\tauto y = x.clone();
    float acc = 0;
    acc += d * dd;
    return y * acc
}
"""


def candidate(cpp: str) -> str:
    """A candidate file as models write them: the C++ inside a load_inline cpp_sources string."""
    return ("import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
            f'cpp_src = r"""\n{cpp}"""\n\n'
            'ext = load_inline(name="cand_ext", cpp_sources=cpp_src, functions=["scale"])\n\n\n'
            "class ModelNew(nn.Module):\n    def forward(self, x):\n        return ext.scale(x)\n")


def line_of(source: str, text: str) -> int:
    return next(n for n, line in enumerate(source.splitlines(), start=1) if text in line)


def gxx(tmp_path, cpp: str) -> str:
    """Real g++ output for `cpp`. From a file, not stdin (`-x c++ -`): gcc echoes the source line
    (`  5 | text`) only when it can reread the file."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    path = tmp_path / "main.cpp"
    path.write_text(cpp)
    run = subprocess.run(["g++", "-fsyntax-only", "-x", "c++", str(path)], check=False,
                         capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    assert run.returncode != 0
    return run.stderr


def test_gxx_errors_are_located_in_the_candidates_python_file(tmp_path):
    # The same code with a two-line stand-in for torch's header, so g++ checks it in milliseconds.
    cpp = CPP.replace("#include <torch/extension.h>",
                      "namespace torch { struct Tensor { Tensor clone(); Tensor operator*(float); }; }")
    log = gxx(tmp_path, cpp)
    src = candidate(cpp)
    errors = compiler_errors(log, src)
    first = errors[0]
    assert first.file.endswith("main.cpp") and first.line == 6 and first.column is not None
    assert first.message == "'d' was not declared in this scope"
    assert first.source_line == "acc += d * dd;"
    assert first.candidate_line == line_of(src, "acc += d * dd;") == 11
    assert [e.message for e in errors[1:]] == ["'dd' was not declared in this scope",
                                               "expected ';' before '}' token"]
    assert errors[1].candidate_line == 11 and errors[2].candidate_line == line_of(src, "return y * acc")


def test_tab_expanded_echo_and_one_line_declaration_are_found(tmp_path):
    # gcc expands the tab in "\tauto y = ..."; the declaration sits inside a one-line Python string.
    cpp = "struct T { int clone(); };\nint scale(T x) {\n\tauto y = x.clone(1);\n\treturn y;\n}\n"
    src = candidate(cpp) + 'decl = "int other(int a) { return undeclared_thing(a); }"\n'
    log = gxx(tmp_path, cpp + "int other(int a) { return undeclared_thing(a); }\n")
    errors = compiler_errors(log, src)
    assert errors[0].line == 3 and "no matching function" in errors[0].message
    assert errors[0].candidate_line == line_of(src, "auto y = x.clone(1);")
    other = next(e for e in errors if "undeclared_thing" in e.message)
    assert other.candidate_line == len(src.splitlines())


def test_warnings_and_notes_skipped_limit_respected(tmp_path):
    cpp = "#warning first\n" + "".join(f"int f{i}() {{ return missing{i}; }}\n" for i in range(6))
    log = gxx(tmp_path, cpp)
    assert "warning: #warning first" in log
    errors = compiler_errors(log, candidate(cpp))
    assert [e.message for e in errors] == [f"'missing{i}' was not declared in this scope" for i in range(3)]
    assert [e.line for e in errors] == [2, 3, 4]
    assert len(compiler_errors(log, candidate(cpp), limit=5)) == 5
    assert compiler_errors("x.cpp:1:1: warning: unused\nx.cpp:2:1: note: here\n", "") == []


def test_repeated_errors_are_deduped():
    # load_inline's RuntimeError repeats ninja's whole output, so each error appears twice.
    block = "/b/main.cpp:6:12: error: 'd' was not declared in this scope\n    6 |     acc += d * dd;\n"
    log = block + "ninja: build stopped\nRuntimeError: Error building extension 'x': " + block + block
    errors = compiler_errors(log, candidate(CPP))
    assert len(errors) == 1 and errors[0].candidate_line == line_of(candidate(CPP), "acc += d * dd;")


def test_nvcc_format():
    log = textwrap.dedent("""\
        [1/3] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -c /b/cuda.cu -o cuda.cuda.o
        FAILED: cuda.cuda.o
        /b/cuda.cu(21): warning #177-D: variable "unused" was declared but never referenced
              int unused;
                  ^

        /b/cuda.cu(14): error: identifier "blockDimx" is undefined
              int i = blockIdx.x * blockDimx + threadIdx.x;
                                   ^

        /b/cuda.cu(17): error #20-D: identifier "outp" is undefined
        /b/cuda.cu(30) : error : expected a ";"
        2 errors detected in the compilation of "/b/cuda.cu".
        ptxas error   : Entry function '_Z6kernelPf' uses too much shared data (0x20000 bytes, 0xc000 max)
        """)
    src = 'cuda_src = r"""\n__global__ void k(float* out) {\n    int i = blockIdx.x * blockDimx + threadIdx.x;\n"""\n'
    errors = compiler_errors(log, src, limit=5)
    assert [(e.file, e.line, e.message) for e in errors] == [
        ("/b/cuda.cu", 14, 'identifier "blockDimx" is undefined'),
        ("/b/cuda.cu", 17, 'identifier "outp" is undefined'),
        ("/b/cuda.cu", 30, 'expected a ";"'),
        ("ptxas", None, "Entry function '_Z6kernelPf' uses too much shared data (0x20000 bytes, 0xc000 max)")]
    assert errors[0].source_line == "int i = blockIdx.x * blockDimx + threadIdx.x;"
    assert errors[0].candidate_line == 3
    assert errors[1].source_line is None and errors[1].candidate_line is None


def test_link_errors():
    log = ("/usr/bin/ld: main.o: in function `f()': main.cpp:(.text+0x9): undefined reference to `g()'\n"
           "collect2: error: ld returned 1 exit status\n"
           "ImportError: /b/cand_ext.so: undefined symbol: _Z5scaleN2at6TensorE\n")
    errors = compiler_errors(log, "", limit=2)
    assert [(e.file, e.line, e.message) for e in errors] == [
        ("", None, "undefined reference to `g()'"), ("", None, "undefined symbol: _Z5scaleN2at6TensorE")]


def test_python_exception_without_compiler_error():
    log = textwrap.dedent("""\
        Traceback (most recent call last):
          File "/w/pipeline/child/harness.py", line 172, in run_build
            import_candidate(code_path, force_verbose_build=True)
          File "/w/runs/x/ab3f.py", line 9, in <module>
            ext = make()
          File "/w/runs/x/ab3f.py", line 7, in make
            return load_inline(name="e", cpp_sources=cpp_src, functions=fns)
        NameError: name 'fns' is not defined
        [kgen] NameError: name 'fns' is not defined
        """)
    [d] = compiler_errors(log, "", candidate_name="ab3f.py")
    assert d == Diagnostic(file="ab3f.py", line=7, message="NameError: name 'fns' is not defined", candidate_line=7)
    # A file whose name merely ends the same way is not the candidate's.
    assert compiler_errors(log, "", candidate_name="3f.py")[0].candidate_line is None
    assert compiler_errors("ninja: no work to do\n", "") == []


def test_python_syntax_error_frame():
    log = ('  File "/w/runs/x/ab3f.py", line 12\n    def forward(self, x)\n                        ^\n'
           "SyntaxError: expected ':'\n")
    [d] = compiler_errors(log, "", candidate_name="ab3f.py")
    assert d.message == "SyntaxError: expected ':'" and d.candidate_line == 12


def test_huge_hostile_log_is_fast_and_capped():
    # Junk that names "error" on every line, so each line reaches the patterns.
    junk = "".join(f"[{i}/9] c++ -c error{i}.cpp -o error{i}.o -O3 -DXXXX\n" for i in range(60_000))
    junk += ("a" * 3_000_000) + "\n"  # one enormous line
    junk += "a(1): error #" + "9" * 5000 + "x\n"  # near-miss for the nvcc pattern
    error = "/b/main.cpp:3:1: error: " + "m" * 10_000 + "\n    3 | " + "s" * 10_000 + "\n"
    log = junk + error + junk[:1_000_000]
    assert len(log) > 5_000_000
    # The process's cpu time, not the wall's: a busy box's other work does not count against it.
    started = time.process_time()
    [d] = compiler_errors(log, "s" * 10_000)
    assert time.process_time() - started < 1.0
    assert d.message == "m" * MESSAGE_CAP and d.source_line == "s" * SOURCE_CAP and d.line == 3
    # No error at all: the whole log is scanned for an exception, still quickly.
    started = time.process_time()
    assert compiler_errors(junk, "", candidate_name="c.py") == []
    assert time.process_time() - started < 1.0


# A real load_inline build failure, end to end through the build stage and into the feedback, is
# tests/test_search.py's refine test (the scripted model fixes mse only from the line it is shown).
