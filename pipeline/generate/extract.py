"""Pull the ModelNew code out of a model's completion.

    ex = extract(completion.text)
    if ex.error is None:
        path = save(ex, generated_dir)

Models answer in markdown with drafts, reasoning and side snippets; the rule is the LAST
fenced Python block that defines `class ModelNew` in the answer (reasoning excluded), because
models revise as they go and the final block is the one they stand behind.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from pipeline.records import Extraction

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)

# Any indentation is allowed (not CommonMark's 3 spaces) because models nest answers in
# list items. Backtick info strings cannot hold backticks, which keeps one-line
# "```x```" spans from opening a block.
_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n]*?)[ \t]*$")
_DEFINES_MODELNEW = re.compile(r"^\s*class\s+ModelNew\b", re.MULTILINE)

_PYTHON_TAGS = frozenset({"", "python", "py", "python3", "py3"})


@dataclass(frozen=True)
class _Block:
    lang: str
    code: str


def _split_reasoning(text: str) -> tuple[str, str]:
    """Return (answer, unclosed reasoning); closed <think> sections are dropped entirely."""
    text = _THINK_BLOCK.sub("", text)
    lower = text.lower()
    close = lower.find(_THINK_CLOSE)
    open_ = lower.find(_THINK_OPEN)
    # Chat templates that put <think> in the prompt leave the completion starting inside
    # the reasoning: an orphan </think> ends it.
    if close != -1 and (open_ == -1 or close < open_):
        text = text[close + len(_THINK_CLOSE):]
        lower = text.lower()
        open_ = lower.find(_THINK_OPEN)
    if open_ == -1:
        return text, ""
    return text[:open_], text[open_ + len(_THINK_OPEN):]


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return (len(stripped) >= len(fence) and stripped[0] == fence[0]
            and stripped == stripped[0] * len(stripped))


def _blocks(text: str) -> list[_Block]:
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if m is None or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        fence = m["fence"]
        body: list[str] = []
        i += 1
        # An unclosed fence (the model ran out of tokens) takes the rest of the text.
        while i < len(lines) and not _closes(lines[i], fence):
            body.append(lines[i])
            i += 1
        i += 1
        lang = m["info"].split()[0].lower() if m["info"].strip() else ""
        blocks.append(_Block(lang=lang, code=_normalise("\n".join(body))))
    return blocks


def _normalise(code: str) -> str:
    # One canonical form so the same code always hashes the same.
    return textwrap.dedent(code).strip("\n") + "\n"


def _choose(blocks: list[_Block]) -> _Block | None:
    defining = [b for b in blocks if _DEFINES_MODELNEW.search(b.code)]
    python = [b for b in defining if b.lang in _PYTHON_TAGS]
    # A C++ block can declare `class ModelNew` too; it only counts when nothing else does,
    # and then fails to parse with a clear message.
    chosen = python or defining
    return chosen[-1] if chosen else None


def extract(text: str) -> Extraction:
    """The last fenced block of the answer that defines ModelNew, checked to parse."""
    answer, reasoning = _split_reasoning(text)
    blocks = _blocks(answer)
    chosen = _choose(blocks)
    if chosen is None and reasoning:
        # The model never closed its reasoning; its code, if any, is all we have.
        reasoning_blocks = _blocks(reasoning)
        blocks += reasoning_blocks
        chosen = _choose(reasoning_blocks)
    if not blocks:
        return Extraction(error="no fenced code block in the completion")
    if chosen is None:
        return Extraction(error=f"no fenced code block defines class ModelNew "
                                f"({len(blocks)} block{'s' if len(blocks) != 1 else ''} seen)",
                          blocks_seen=len(blocks))
    try:
        ast.parse(chosen.code)
    except SyntaxError as exc:
        return Extraction(error=f"extracted code does not parse: line {exc.lineno}: {exc.msg}",
                          blocks_seen=len(blocks))
    except ValueError as exc:  # null bytes in the source
        return Extraction(error=f"extracted code does not parse: {exc}", blocks_seen=len(blocks))
    code_hash = hashlib.sha256(chosen.code.encode()).hexdigest()[:16]
    return Extraction(code=chosen.code, code_hash=code_hash, blocks_seen=len(blocks))


def save(extraction: Extraction, directory: Path) -> Path:
    """Write the code to <directory>/<code_hash>.py; a second save of the same code is a no-op."""
    if extraction.code is None or extraction.code_hash is None:
        raise ValueError(f"nothing to save: {extraction.error or 'extraction has no code'}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{extraction.code_hash}.py"
    if path.is_file() and path.read_text() == extraction.code:
        return path
    # Concurrent workers may save the same hash; a rename is atomic, a partial write is not.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{extraction.code_hash}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(extraction.code)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
