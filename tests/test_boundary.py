"""The house's walls: each folder of pipeline/ imports only what its __init__ says it may.

Every package under pipeline/ says in one line of its __init__'s docstring what it may import
("May import: core, child, sandbox." or "May import: nothing"). A module may always import its own
package and the packages below it; anything else must be named. "core" is the modules directly in
pipeline/ (records, config, backends, ...). The rule that matters most: pipeline/child runs inside
the candidate's process, so it imports nothing of the parent's side (the candidate could reach it
through sys.modules), and child/jail, run by path before any package exists, only the standard
library.

The import graph is every import statement, at module level, inside functions and under
TYPE_CHECKING alike: a circle through a type-only import is still two modules that each need the
other to be read. It has no circle between modules nor between packages.

    python tests/test_boundary.py      # each folder's rule and the package-level graph
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PIPELINE = Path(__file__).resolve().parent.parent / "pipeline"
MAX_MODULES = 12  # per folder, __init__ and __main__ not counted


def modules(root: Path = PIPELINE) -> dict[str, Path]:
    """Every module under root by dotted name (a package by its own name, its __init__'s path)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) for every import of the package's own modules in `path`: anywhere in the file.
    `from X import y` counts as an import of X.y where that is a module, else of X."""
    top = name.split(".")[0]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == top]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != top:
                continue
            found += [(node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in known else base) for a in node.names]
    return found


def graph(root: Path = PIPELINE) -> dict[str, list[tuple[int, str]]]:
    mods = modules(root)
    return {name: [(line, target) for line, target in imports_of(name, path, set(mods)) if target != name]
            for name, path in mods.items()}


def package_of(name: str, root: Path = PIPELINE) -> str:
    """The folder a module lives in, relative to the top package ("core" for the top itself)."""
    mods = modules(root)
    path = mods[name]
    folder = path.parent.relative_to(root)
    return ".".join(folder.parts) or "core"


def rules(root: Path = PIPELINE) -> dict[str, set[str] | None]:
    """Each folder's rule from its __init__: the set it may import; None where it states none."""
    out: dict[str, set[str] | None] = {}
    for folder in sorted({p.parent for p in root.rglob("*.py")}):
        key = ".".join(folder.relative_to(root).parts) or "core"
        init = folder / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) if init.is_file() else None
        line = re.search(r"^May import: (.*?)(?:\.|\s\(|$)", doc or "", re.M)
        if line is None:
            out[key] = None
        elif line.group(1).strip().startswith("nothing"):
            out[key] = set()
        else:
            out[key] = {part.strip() for part in line.group(1).split(",")}
    return out


def within(package: str, other: str) -> bool:
    """`package` is `other` or below it ("core" is only itself)."""
    return package == other or (other != "core" and package.startswith(other + "."))


def violations(root: Path = PIPELINE) -> list[str]:
    table = rules(root)
    bad = [f"{folder}: its __init__ has no 'May import:' line" for folder, rule in table.items() if rule is None]
    for folder, rule in table.items():
        for name in rule or ():
            if name != "core" and name not in table:
                bad.append(f"{folder}: its rule names {name!r}, which is no folder here")
    mods = modules(root)
    for name, edges in graph(root).items():
        own = package_of(name, root)
        allowed = table.get(own) or set()
        for line, target in edges:
            theirs = package_of(target, root) if target in mods else "core"
            if not (within(theirs, own) or any(within(theirs, r) for r in allowed)):
                bad.append(f"{mods[name].relative_to(root.parent)}:{line} imports {target} ({own} may import "
                           f"{', '.join(sorted(allowed)) or 'nothing'})")
    return bad


def stdlib_violations(root: Path = PIPELINE, folder: str = "child/jail") -> list[str]:
    """Imports in `folder` of anything but the standard library (jail.py runs with -I -S)."""
    bad = []
    for path in sorted((root / folder).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else
                     ["(relative)"] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}:{node.lineno} imports {n}" for n in names
                    if n.split(".")[0] not in sys.stdlib_module_names and n != "__future__"]
    return bad


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One circle in a directed graph, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def module_edges(root: Path = PIPELINE) -> dict[str, set[str]]:
    mods = modules(root)
    # A package's __init__ runs before any module in it: importing a.b needs a too (but a's own
    # __init__ importing its modules is the package's business, not an edge back up).
    return {name: {t for _, t in edges if t in mods} for name, edges in graph(root).items()}


def package_edges(root: Path = PIPELINE) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, targets in module_edges(root).items():
        own = package_of(name, root)
        out.setdefault(own, set())
        out[own] |= {p for p in (package_of(t, root) for t in targets) if p != own}
    return out


# --- the house as it is ---

def test_every_folder_states_its_rule_and_keeps_it():
    assert not (bad := violations()), "\n".join(bad)


def test_the_child_imports_nothing_of_the_parent():
    """The trust boundary, spelled out: the rule table says so, and no module of child/ breaks it."""
    table = rules()
    assert table["child"] == set() and table["child.jail"] == set()
    mods = modules()
    for name, edges in graph().items():
        if within(package_of(name), "child"):
            assert all(within(package_of(t), "child") for _, t in edges if t in mods), (name, edges)
    assert not (bad := stdlib_violations()), bad


def test_no_import_circle_between_modules():
    assert (found := cycle(module_edges())) is None, " -> ".join(found)


def test_no_import_circle_between_packages():
    assert (found := cycle(package_edges())) is None, " -> ".join(found)


def test_no_folder_holds_more_than_a_dozen_modules():
    for folder in sorted({p.parent for p in PIPELINE.rglob("*.py")}):
        count = len([p for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")])
        assert count <= MAX_MODULES, f"{folder.relative_to(PIPELINE.parent)}: {count} modules"


def test_no_module_is_over_five_hundred_lines():
    """The house's size rule (docs/design.md): a module past it is split by what it does."""
    long = {str(p.relative_to(PIPELINE.parent)): n for p in PIPELINE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_the_package_never_imports_the_probes_or_the_tests():
    """bench/ and tests/ sit beside the package, not in it: a wheel has neither."""
    bad = []
    for path in sorted(PIPELINE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            bad += [f"{path}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in ("bench", "tests", "scripts")]
    assert not bad, bad


def test_a_candidates_process_loads_nothing_of_the_parents_side():
    """What the harness's import brings into the candidate's process, read from sys.modules in a fresh
    interpreter: the package's own __init__ files included (pipeline/__init__ names its public face
    but imports it only on first use)."""
    import subprocess

    loaded = subprocess.run([sys.executable, "-c", "import sys, pipeline.child.harness; "
                             "print(' '.join(m for m in sys.modules if m.startswith('pipeline')))"],
                            cwd=PIPELINE.parent, capture_output=True, text=True, check=True).stdout.split()
    assert "pipeline.child.harness" in loaded
    assert [m for m in loaded if m != "pipeline" and not within(m.removeprefix("pipeline."), "child")] == []


# --- the checker can fail ---

def _house(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pipeline"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


RULED = {
    "__init__.py": '"""The top.\n\nMay import: child.\n"""\n',
    "records.py": "from .child import protocol\n",
    "child/__init__.py": '"""The boundary.\n\nMay import: nothing (its own modules only).\n"""\n',
    "child/protocol.py": "import json\n",
    "store/__init__.py": '"""Storage.\n\nMay import: core.\n"""\n',
    "store/store.py": "from ..records import x\n",
    "judge/__init__.py": '"""Judging.\n\nMay import: core, child, store.\n"""\n',
    "judge/evaluate.py": "from ..store import store\nfrom . import session\n",
    "judge/session.py": "import os\n",
}


def test_a_clean_synthetic_house_passes(tmp_path):
    root = _house(tmp_path, RULED)
    assert violations(root) == []
    assert cycle(module_edges(root)) is None and cycle(package_edges(root)) is None


def test_the_checker_sees_a_forbidden_edge_anywhere_in_a_module(tmp_path):
    """A child module reaching the parent's side, at module level, inside a function and under
    TYPE_CHECKING: each is found."""
    root = _house(tmp_path, {**RULED, "child/tasks.py": (
        "from typing import TYPE_CHECKING\nfrom .. import records\n"
        "if TYPE_CHECKING:\n    from ..judge.evaluate import Result\n"
        "def f():\n    import pipeline.store.store\n")})
    bad = violations(root)
    assert [b.split(" (")[0] for b in bad] == ["pipeline/child/tasks.py:2 imports pipeline.records",
                                               "pipeline/child/tasks.py:4 imports pipeline.judge.evaluate",
                                               "pipeline/child/tasks.py:6 imports pipeline.store.store"]


def test_the_checker_sees_an_unruled_folder_and_an_upward_edge(tmp_path):
    root = _house(tmp_path, {**RULED, "report/page.py": "import os\n",
                             "store/queries.py": "from ..judge import evaluate\n"})
    bad = violations(root)
    assert "report: its __init__ has no 'May import:' line" in bad
    assert any(b.startswith("pipeline/store/queries.py:1 imports pipeline.judge.evaluate") for b in bad)


def test_the_checker_sees_circles_type_only_ones_included(tmp_path):
    root = _house(tmp_path, {**RULED, "judge/session.py": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .evaluate import Result\n")})
    assert cycle(module_edges(root)) == ["pipeline.judge.evaluate", "pipeline.judge.session", "pipeline.judge.evaluate"]
    root = _house(tmp_path / "b", {**RULED, "store/__init__.py": '"""S.\n\nMay import: core, judge.\n"""\n',
                                   "store/store.py": "from ..judge import session\n"})
    assert cycle(package_edges(root)) == ["judge", "store", "judge"]


def test_the_jail_may_import_only_the_standard_library(tmp_path):
    root = _house(tmp_path, {"child/jail/jail.py": "import os, json\nimport torch\nfrom .. import tasks\n"})
    assert stdlib_violations(root) == ["jail.py:2 imports torch", "jail.py:3 imports (relative)"]


if __name__ == "__main__":
    table, edges = rules(), package_edges()
    for folder in sorted(table, key=lambda f: (f != "core", f)):
        uses = sorted(edges.get(folder, ()))
        print(f"{folder:12} may import: {', '.join(sorted(table[folder] or ())) or 'nothing':58} imports: "
              f"{', '.join(uses) or 'nothing'}")
    print("circles: modules", cycle(module_edges()) or "none", "; packages", cycle(package_edges()) or "none")
    print("\n".join(violations()) or "every rule kept")
