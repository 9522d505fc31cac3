"""Rendering one stored attempt for `kgen show`."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

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
    console.print(Panel(Text("\n".join(lines)), title="search chain (oldest first)"))


def render_attempt(console: Console, a: dict[str, Any], code: str | None, full: bool,
                   chain: list[dict[str, Any]] | None = None) -> None:
    """Everything a model, a candidate or a compiler wrote goes in as Text: shown literally, so a
    completion's "[link=...]" or "[/]" is text, never rich markup."""
    result = a["result"]
    head = escape(f"attempt {a['id']}  run {a['run_id']}\n"
                  f"task {a['task']}  model {a['model']}  sample {a['sample']}  backend {a['backend']}  size {a['size']}\n"
                  "verdict ") + f"[bold]{escape(a['verdict'])}[/]" + escape(
                      f"  flags {','.join(a['flags'])}" if a.get('flags') else "")
    console.print(Panel(head, title="attempt"))
    render_chain(console, a, chain or [])
    console.print(Panel(Text(_fold(a.get("prompt"), full)), title="prompt"))
    if a.get("messages_json"):
        later = json.loads(a["messages_json"])[1:]  # the first is the prompt above
        if later:
            text = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in later)
            console.print(Panel(Text(_fold(text, full)), title=f"conversation sent at turn {a['turn'] + 1}"))
    usage = a.get("usage")
    title = "completion" + (f" ({usage.prompt_tokens} in / {usage.completion_tokens} out tokens)" if usage else "")
    if a.get("reasoning"):
        console.print(Panel(Text(_fold(a["reasoning"], full)), title="reasoning (folded)" if not full else "reasoning"))
    console.print(Panel(Text(_fold(a.get("completion_text"), full)), title=title))
    if code:
        console.print(Panel(Syntax(code, "python", line_numbers=True), title=f"code {a['code_hash']}"))
    if a.get("build_log") is not None:
        console.print(Panel(Text(_fold(a["build_log"], full)), title="build log"))
    lines = [f"error: {result.error}"] if result.error else []
    if result.device_unfit:
        lines.append(f"device not fit to time: {result.device_unfit} (timing not trusted)")
    if not result.trusted:
        lines.append(f"not trusted: {result.untrusted_reason}")
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
                     f"({b.input_bytes / 1e6:.1f} MB at {b.bandwidth_gbs or 0:.0f} GB/s)")
    for name, value in (("x eager", result.speedup_eager), ("x compile", result.speedup_compile),
                        ("floor fraction", result.floor_fraction)):
        if value is not None:
            lines.append(f"{name}: {value:.3g}")
    if result.detail:
        lines.append(_fold(result.detail, full))
    console.print(Panel(Text("\n".join(lines) or "(no detail)"), title="verdict detail"))
    if a.get("feedback"):
        console.print(Panel(Text(_fold(a["feedback"], full)), title="feedback (the next user turn)"))
