"""Untrusted text made safe to print: shown exactly as written, never obeyed.

    console.print(literal(completion_text))       # a rich Text: "[/x]" and "pp[i]" stay as written
    print(visible(build_log_line))                 # ESC, BEL, CR ... as \\x1b, \\x07, \\r

Completions, reasoning, build logs, candidate output and error strings came from a model, a
compiler or a candidate. Two things could go wrong when they reach a terminal: rich reads "[...]" as
markup (text disappears, or "[/x]" raises MarkupError), and control characters are obeyed (ESC[2J
clears the screen, CR overwrites the line it is on, a bidi override reorders what is shown). rich's
Text solves the first and not the second (it passes ESC through), so every such string goes through
`visible` first.
"""

from __future__ import annotations

import re

from rich.text import Text

# C0 controls but tab and newline, DEL, C1 controls, and the bidi embedding/override/isolate marks
# (the "Trojan Source" characters): each would change what is displayed rather than be displayed.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\r": "\\r", "\x0b": "\\v", "\x0c": "\\f"}


def _escape(m: re.Match) -> str:
    ch = m[0]
    code = ord(ch)
    return _NAMED.get(ch) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def visible(text: str | None) -> str:
    """`text` with every control character (but newline and tab) written out as an escape, e.g.
    ESC as the four characters \\x1b; None as ""."""
    return _CONTROL.sub(_escape, text or "")


def literal(text: str | None, style: str = "") -> Text:
    """A rich Text of `visible(text)`: printed as written, never read as markup."""
    return Text(visible(text), style=style)
