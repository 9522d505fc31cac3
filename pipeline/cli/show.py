"""Rendering one stored attempt for `kgen show`.

Everything a model, a candidate or a compiler wrote is shown literally (plain.literal: never rich
markup, control characters written out as escapes). A failed build's compiler errors come first,
located in the candidate's file (pipeline.generate.diagnostics), before the log with its Python traceback."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax

from ..generate.diagnostics import compiler_errors
from .plain import literal, visible
from .tables import ERROR_CELL, short_error

FOLD = 1500  # characters of reasoning and logs shown unless --full


def _fold(text: str | None, full: bool) -> str:
    if not text:
        return "(none)"
    if full or len(text) <= FOLD:
        return text
    return text[: FOLD // 3] + f"\n... [{len(text) - FOLD} characters folded; --full shows them] ...\n" + text[-2 * FOLD // 3:]


def render_chain(console: Console, a: dict[str, Any], chain: list[dict[str, Any]]) -> None:
    """The search lineage an attempt belongs to: its earlier turns and the parents it was shown."""
    if len(chain) < 2 and not a.get("turn") and not a.get("generation"):
        return
    lines = []
    for row in chain:
        mark = "->" if row["id"] == a["id"] else "  "
        speed = f", {row['speedup_eager']:.3g}x eager" if row.get("speedup_eager") else ""
        lines.append(f"{mark} {row['id']}  gen {row['generation']} child {row['sample']} turn {row['turn'] + 1}: "
                     f"{row['verdict']}{speed}")
    console.print(Panel(literal("\n".join(lines)), title="search chain (oldest first)"))


def render_compiler_errors(console: Console, a: dict[str, Any], code: str | None) -> None:
    """A failed build's first compiler errors, each with the line of the candidate's file it is on."""
    build = a.get("build")
    if build is None or build.ok or not a.get("build_log"):
        return
    found = compiler_errors(a["build_log"], code or "", candidate_name=f"{a.get('code_hash')}.py")
    if not found:
        return
    lines = []
    for d in found:
        # The file's folders (the build's temp path) push the message off the line; its name is enough.
        where = ":".join(str(p) for p in (d.file.rsplit("/", 1)[-1], d.line, d.column) if p not in (None, ""))
        lines.append(f"{where}: error: {d.message}" if where else f"error: {d.message}")
        if d.candidate_line:
            lines.append(f"    line {d.candidate_line} of the candidate: {d.source_line or ''}".rstrip())
        elif d.source_line:
            lines.append(f"    {d.source_line}")
    console.print(Panel(literal("\n".join(lines), style="red"), title="compiler errors (first; full log below)"))


def render_attempt(console: Console, a: dict[str, Any], code: str | None, full: bool,
                   chain: list[dict[str, Any]] | None = None) -> None:
    """Everything a model, a candidate or a compiler wrote goes in as Text: shown literally, so a
    completion's "[link=...]" or "[/]" is text, never rich markup."""
    result = a["result"]
    head = literal(f"attempt {a['id']}  run {a['run_id']}\n"
                   f"task {a['task']}  model {a['model']}  sample {a['sample']}  backend {a['backend']}  size {a['size']}\n"
                   "verdict ")
    head.append(visible(a["verdict"]), style="bold")
    head.append(visible(f"  flags {flag_sources(result, a['flags'])}" if a.get("flags") else ""))
    if result.error:
        head.append("\nerror " + short_error(result.error, *ERROR_CELL))
    console.print(Panel(head, title="attempt"))
    render_compiler_errors(console, a, code)
    render_chain(console, a, chain or [])
    console.print(Panel(literal(_fold(a.get("prompt"), full)), title="prompt"))
    if a.get("messages_json"):
        later = json.loads(a["messages_json"])[1:]  # the first is the prompt above
        if later:
            text = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in later)
            console.print(Panel(literal(_fold(text, full)), title=f"conversation sent at turn {a['turn'] + 1}"))
    usage = a.get("usage")
    title = "completion" + (f" ({usage.prompt_tokens} in / {usage.completion_tokens} out tokens)" if usage else "")
    if a.get("reasoning"):
        console.print(Panel(literal(_fold(a["reasoning"], full)), title="reasoning (folded)" if not full else "reasoning"))
    console.print(Panel(literal(_fold(a.get("completion_text"), full)), title=title))
    if code:  # highlighted, but its text is the candidate's: control characters written out first
        console.print(Panel(Syntax(visible(code), "python", line_numbers=True, word_wrap=True), title=f"code {a['code_hash']}"))
    if a.get("build_log") is not None:
        console.print(Panel(literal(_fold(a["build_log"], full)), title="build log"))
    lines = [f"error: {result.error}"] if result.error else []
    if result.outcome.earlier:
        lines.append(f"judged again: the first evaluation's clock gave no figure ({result.outcome.earlier}); "
                     f"this verdict is the last's")
    if result.device_unfit:
        lines.append(f"device not fit to time: {result.device_unfit} (timing not trusted)")
    if not result.trusted:
        lines.append(f"not trusted: {result.untrusted_reason}")
    if result.policy:
        lines.append(f"judged under policy {result.policy} (pipeline/policy.py)")
    for t in result.trials:
        status = "ok" if t.ok else f"{t.verdict.value if t.verdict else 'failed'}: {t.error}"
        err = f" rel err {t.max_rel_err:.3g}" if t.max_rel_err is not None else ""
        lines.append(f"trial {t.index} {t.variant:<14} {status}{err}")
    for name, beside in (("eager", result.eager_beside), ("torch.compile", result.compiled_beside)):
        if beside:
            lines.append(f"{name} timed beside it {beside.median_ms:.4g} ms (p25 {beside.p25_ms:.4g}, "
                         f"p75 {beside.p75_ms:.4g}, n {beside.n})")
    if result.timing:
        tm = result.timing
        lines.append(f"time {tm.median_ms:.4g} ms (p25 {tm.p25_ms:.4g}, p75 {tm.p75_ms:.4g}, n {tm.n});"
                     f" parent wall clock {result.wall_ms_per_call or 0:.4g} ms per call")
    b = result.baselines
    if b:
        eager = f"{b.eager.median_ms:.4g}" if b.eager else "-"
        comp = f"{b.compiled.median_ms:.4g}" if b.compiled else "-"
        lines.append(f"eager {eager} ms, torch.compile {comp} ms, floor {b.floor_ms or 0:.4g} ms "
                     f"({b.input_bytes / 1e6:.1f} MB at {b.bandwidth_gbs or 0:.0f} GB/s)"
                     + (f", compute floor {b.compute_floor_ms:.4g} ms ({b.flops / 1e9:.3g} GFLOP at "
                        f"{b.flops_per_s / 1e12:.3g} TFLOP/s)" if b.compute_floor_ms else ""))
    for name, value, ratio in (("x eager", result.speedup_eager, result.eager_ratio),
                               ("x compile", result.speedup_compile, result.compiled_ratio),
                               ("floor fraction", result.floor_fraction, None)):
        if value is not None:
            pairs = f" (p25 {ratio.p25:.3g}, p75 {ratio.p75:.3g}, over {ratio.pairs} block pairs)" if ratio else ""
            lines.append(f"{name}: {value:.3g}{pairs}")
    lines += own_code_lines(result)
    if result.detail:
        lines.append(_fold(result.detail, full))
    console.print(Panel(literal("\n".join(lines) or "(no detail)"), title="verdict detail"))
    if a.get("feedback"):
        console.print(Panel(literal(_fold(a["feedback"], full)), title="feedback (the next user turn)"))


def flag_sources(result, flags: list[str]) -> str:
    """Each flag with what it rests on: the parent's own finding, or the child's claim (its profile)."""
    if result.own_code is None:  # a row from before flags had sources
        return ",".join(flags)
    claimed = {f.value for f in result.outcome.claims}
    source = {True: "the child's claim", False: "the parent's finding"}
    return ", ".join(f"{f} ({source[f in claimed]})" for f in flags)


def own_code_lines(result) -> list[str]:
    """The parent's look at the built code, and per held-out size whose code ran there; what
    rests on the child's word says so."""
    lines = []
    own = result.own_code
    if own is not None:
        found = {True: "holds code of its own", False: "holds no code of its own", None: "could not tell"}[own.holds_own]
        parts = [f"{len(own.extensions)} extension file(s)"] + (
            [f"functions {', '.join(own.functions[:5])}"] if own.functions else []) + (
            [f"CUDA kernels {', '.join(own.device_kernels[:5])}"] if own.device_kernels else []) + (
            [f"Triton kernels {', '.join(own.triton_kernels[:5])}"] if own.triton_kernels else [])
        lines.append(f"built code (the parent's look): {found}; {'; '.join(parts)}" + (f" ({own.error})" if own.error else ""))
    if result.own_fraction is not None:
        lines.append(f"own kernels: {result.own_fraction:.0%} of the call's time, the rest in PyTorch's ops "
                     "(the child's claim, from its profile)")
    for run in result.shapes:
        ran = {True: "its own kernel ran", False: "its own kernel did not run", None: "not profiled"}[run.own_ran]
        if run.own_ran is not None and not (own is not None and own.holds_own is False):
            ran += " (the child's claim"
            ran += f", {run.torch_fraction:.0%} in PyTorch)" if run.torch_fraction is not None else ")"
        served = "served by the library" if run.served else "the reference there"
        lines.append(f"size {run.size}: {'correct' if run.correct else 'wrong'}; {ran}; {served}"
                     + (f" ({run.error})" if run.error else ""))
    return lines
