"""The trust boundary as a package: nothing in pipeline/child imports the parent's side.

Everything in pipeline/child runs inside the candidate's process. If it imported store, config,
llm, run, evaluate, judge or records, the candidate could reach them (and what they hold) through
sys.modules; the parent's side may import the child's, never the other way round.
"""

from __future__ import annotations

import ast
from pathlib import Path

PIPELINE = Path(__file__).resolve().parent.parent / "pipeline"
CHILD = PIPELINE / "child"
PARENT_MODULES = {p.stem for p in PIPELINE.glob("*.py")} - {"__init__"}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in a child module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                found.append((node.lineno, node.module or ""))
            else:
                base = ["pipeline", "child"][: max(0, 2 - (node.level - 1))]
                name = ".".join(base + ([node.module] if node.module else []))
                found += [(node.lineno, name)] if node.module else [(node.lineno, f"{name}.{a.name}") for a in node.names]
    return found


def test_child_package_imports_nothing_of_the_parent():
    bad = []
    for path in sorted(CHILD.glob("*.py")):
        for line, name in imports_of(path):
            parts = name.split(".")
            if parts[0] == "pipeline" and (len(parts) < 2 or parts[1] != "child"):
                bad.append(f"{path.name}:{line} imports {name}")
    assert not bad, bad


def test_the_checker_sees_a_violation(tmp_path):
    """The rule can fail: a relative import of the parent's side is found."""
    sample = tmp_path / "sample.py"
    sample.write_text("from .. import store\nfrom ..config import EvalConfig\nfrom . import tasks\n")
    names = [name for _, name in imports_of(sample)]
    assert names == ["pipeline.store", "pipeline.config", "pipeline.child.tasks"]
    assert {"store", "config", "evaluate", "judge", "records"} <= PARENT_MODULES
