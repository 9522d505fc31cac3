"""A build log's first compiler errors, located in the candidate's own source, as typed records.

    errors = compiler_errors(build.log, candidate_code, candidate_name="3f2a....py")
    errors[0].candidate_line, errors[0].message   # 15, "'dd' was not declared in this scope"

A load_inline build log holds ninja's lines, the compiler's diagnostics for the sources it wrote
(main.cpp, cuda.cu), then a Python traceback. A model fixing its kernel needs the first errors and
where they are in the code it wrote, not the traceback around them. load_inline prepends includes and
appends bindings, so the compiled file's line numbers are not the candidate's: instead the echoed
source text (gcc's `  12 |   return foo(x);`, nvcc's and clang's line above a caret) is looked up in
the candidate's file. The log is hostile text: every kept string is capped, nothing is interpreted,
and parsing is one pass of anchored regular expressions (no nested or adjacent open-ended
repetition, so no backtracking blow-up) over lines cut to a bounded length.
"""

from __future__ import annotations

import re

from ..records import Record

MESSAGE_CAP = 300
SOURCE_CAP = 200
FILE_CAP = 200
LINE_CAP = 2000  # longer log lines are cut before matching: no regex ever sees a megabyte line

# gcc/clang: "/path/main.cpp:12:5: error: message" (also "fatal error:"). The file part cannot hold
# a colon, so there is exactly one way to split the line.
_GCC = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? (?:fatal )?error: (?P<msg>.*)$")
# nvcc: "/path/cuda.cu(12): error: message", also "(12) : error : ", "catastrophic error:", "error #20-D:".
_NVCC = re.compile(r"^(?P<file>[^(\s][^(]*)\((?P<line>\d+)\) ?: (?:catastrophic )?error(?: #\d+(?:-[A-Z])?)? ?: "
                   r"(?P<msg>.*)$")
# Errors with no source location that still say what to fix: "nvcc fatal   : Unsupported gpu
# architecture", "ptxas error   : Entry function ... uses too much shared data", "c++: fatal error:
# Killed signal terminated program cc1plus" (out of memory).
_TOOL = re.compile(r"^(?P<file>nvcc|ptxas|cc1plus|g\+\+|c\+\+|gcc)(?: (?:fatal|error) +|: (?:fatal )?error): "
                   r"(?P<msg>.*)$")
_GCC_ECHO = re.compile(r"^ *\d+ \| ?(?P<text>.*)$")
_CARET = re.compile(r"^[ \t|]*\^[~^ ]*$")  # "      ^" (nvcc, clang) or "   |   ^~~~" (gcc)
# Link errors: ld's "undefined reference to `foo'", the loader's "undefined symbol: _Z3foov".
_LINKER = re.compile(r"(undefined reference to .*|undefined symbol: \S+)")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')
_EXCEPTION = re.compile(r"^(?P<msg>[A-Za-z_][\w.]*(?:Error|Exception)\b.*)$")


class Diagnostic(Record):
    """One compiler error, located in the candidate's source where possible."""

    file: str
    """The compiled file's name as the compiler gave it (main.cpp, cuda.cu, ...); the tool (nvcc,
    ptxas) for an error with no source location; "" for a link error."""
    line: int | None = None
    """Line in the compiled file (not the candidate's: load_inline adds lines around its sources)."""
    column: int | None = None
    """Column there, where the compiler gives one."""
    message: str
    """The compiler's message, e.g. "'foo' was not declared in this scope" (capped)."""
    source_line: str | None = None
    """The offending source text as the compiler echoed it, stripped (capped)."""
    candidate_line: int | None = None
    """1-based line of the candidate's Python file that holds that text, where it is found."""


def compiler_errors(log: str, candidate_source: str, limit: int = 3,
                    candidate_name: str | None = None) -> list[Diagnostic]:
    """The first `limit` distinct compiler or linker errors in `log`; if there are none, the last
    Python exception, at the line of the candidate's file (`candidate_name`) its traceback names."""
    lines = [line[:LINE_CAP] for line in log.splitlines()]
    source = [" ".join(line.split()) for line in candidate_source.splitlines()]
    found: list[Diagnostic] = []
    seen: set[tuple] = set()
    for i, line in enumerate(lines):
        if len(found) >= limit:
            break
        # Most of a log is command lines and warnings: a substring test (fast, in C) skips them
        # before any pattern runs. Every error pattern below needs one of these words.
        if "error" not in line and "fatal" not in line and "undefined" not in line:
            continue
        if m := _GCC.match(line) or _NVCC.match(line):
            file, where, col = m["file"][-FILE_CAP:], int(m["line"]), m.groupdict().get("col")
        elif m := _TOOL.match(line):
            file, where, col = m["file"], None, None
        elif m := _LINKER.search(line):
            file, where, col = "", None, None
        else:
            continue
        message = m.groupdict().get("msg", m[0]).strip()[:MESSAGE_CAP]
        # load_inline's RuntimeError repeats the whole compiler output: dedupe before the
        # (comparatively costly) lookup in the candidate's source, so repeats cost nothing.
        if (file, where, message) in seen:
            continue
        seen.add((file, where, message))
        echo = _echo(lines, i) if where is not None else None
        found.append(Diagnostic(file=file, line=where, column=int(col) if col else None, message=message,
                                source_line=echo[:SOURCE_CAP] if echo else None,
                                candidate_line=_locate(echo, source)))
    return found or _python_error(lines, candidate_name)


def _echo(lines: list[str], i: int) -> str | None:
    """The source line the compiler printed after the message at `i`, if it did: gcc's numbered
    `  12 | text`, or (nvcc, clang) the bare text with a caret line under it."""
    nxt = lines[i + 1] if i + 1 < len(lines) else ""
    if m := _GCC_ECHO.match(nxt):
        return m["text"].strip() or None
    caret = lines[i + 2] if i + 2 < len(lines) else ""
    return nxt.strip() if nxt.strip() and _CARET.match(caret) else None


def _locate(text: str | None, source: list[str]) -> int | None:
    """The candidate's line holding the echoed text: the first whose text is that text (whitespace
    runs collapsed, as gcc expands tabs), else the first that contains it (a one-line declaration
    string such as `cpp_src = "torch::Tensor f(torch::Tensor x);"`). Short lines such as "}" or
    "};" would match anywhere, so they locate nothing."""
    want = " ".join((text or "").split())
    if len(want) < 4:
        return None
    exact = next((n for n, line in enumerate(source, start=1) if line == want), None)
    return exact or next((n for n, line in enumerate(source, start=1) if want in line), None)


def _python_error(lines: list[str], candidate_name: str | None) -> list[Diagnostic]:
    """No compiler error: the last exception line, and the candidate's line its traceback names
    (the last frame in the candidate's file, the one nearest the failure)."""
    message = next((m["msg"] for line in reversed(lines) if (m := _EXCEPTION.match(line))), None)
    if message is None:
        return []
    where = None
    for line in lines:
        if candidate_name and (f := _FRAME.match(line)) and _same_file(f["file"], candidate_name):
            where = int(f["line"])
    return [Diagnostic(file=candidate_name[-FILE_CAP:] if where and candidate_name else "", line=where,
                       message=message.strip()[:MESSAGE_CAP], candidate_line=where)]


def _same_file(path: str, name: str) -> bool:
    # Whole path components only: "x/a3f2.py" is not the candidate "3f2.py".
    return path == name or path.endswith("/" + name.lstrip("/"))
