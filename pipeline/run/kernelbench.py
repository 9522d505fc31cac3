"""KernelBench as a task source: the `tasks:` keys kernelbench, levels, problems and names.

    files = select_tasks(cfg)          # the config's tasks, from a KernelBench checkout or a folder
    task = find_task(cfg, "19_ReLU")   # one task by name (kgen eval --task)

KernelBench (ScalingIntelligence/KernelBench) lays its tasks out as KernelBench/levelN/ID_Name.py;
the number before the first underscore is the problem id, unique within a level. File stems are
unique across levels 1-3, so a task keeps its stem as its name, and its level and problem id ride
along on the TaskFile into every attempt stored (pipeline/child/tasks.kernelbench_ids).

Bad input is a one-line ConfigError naming the key: a missing checkout, a level it lacks, a problem
id or name pattern that matches no file.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from ..child import tasks
from ..child.tasks import TaskFile
from ..config import Config, ConfigError, problem_range


def checkout_levels(cfg: Config) -> tuple[Path, dict[int, Path]]:
    """The folder holding the levelN/ folders of `tasks.kernelbench`, and those folders by level."""
    given = cfg.path(cfg.tasks.kernelbench or "")
    if not given.is_dir():
        raise ConfigError(f"tasks.kernelbench: {given}: no such folder")
    for root in (given / "KernelBench", given):  # the repository's root, or its KernelBench/ folder
        found = {int(m.group(1)): p for p in root.glob("level*")
                 if p.is_dir() and (m := re.fullmatch(r"level(\d+)", p.name))}
        if found:
            return root.resolve(), dict(sorted(found.items()))
    raise ConfigError(f"tasks.kernelbench: {given} is not a KernelBench checkout (no level1/, level2/... folders "
                      f"in it or in its KernelBench/)")


def _files(folder: Path) -> list[TaskFile]:
    files = [tasks.task_file(p) for p in folder.resolve().glob("*.py") if not p.name.startswith("_")]
    return sorted((f for f in files if f.problem is not None), key=lambda f: f.problem)


def _ranges(ranges: list[tuple[int, int]]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def select_tasks(cfg: Config) -> list[TaskFile]:
    """The config's tasks: from `tasks.directory` by name (tasks.discover), or from the KernelBench
    checkout: the chosen levels' files whose problem id is in `problems` and whose stem matches a
    pattern of `names`, by level then problem id."""
    sel = cfg.tasks
    if sel.kernelbench is None:
        return tasks.discover(cfg.path(sel.directory), sel.names)
    root, levels = checkout_levels(cfg)
    missing = [n for n in sel.levels if n not in levels]
    if missing:
        raise ConfigError(f"tasks.levels: no level{missing[0]} folder in {root} (has levels "
                          f"{', '.join(map(str, levels))})")
    pool: list[TaskFile] = []
    for n in sel.levels:
        files = _files(levels[n])
        if not files:  # level4 is a git submodule: an empty folder where it was not checked out
            raise ConfigError(f"tasks.levels: {levels[n]} holds no task files (ID_Name.py)")
        pool += files
    if sel.problems is not None:
        ranges = [problem_range(item) for item in sel.problems]
        for first, last in ranges:
            if not any(first <= f.problem <= last for f in pool):
                have = sorted({f.problem for f in pool})
                raise ConfigError(f"tasks.problems: {_ranges([(first, last)])} matches no file in level "
                                  f"{', '.join(map(str, sel.levels))} (problems {have[0]}-{have[-1]})")
        pool = [f for f in pool if any(first <= f.problem <= last for first, last in ranges)]
    for pattern in sel.names:
        if not any(fnmatch.fnmatchcase(f.name, pattern) for f in pool):
            raise ConfigError(f"tasks.names: '{pattern}' matches no file of the chosen levels and problems "
                              f"({len(pool)} files in {root})")
    chosen = [f for f in pool if any(fnmatch.fnmatchcase(f.name, p) for p in sel.names)]
    seen: dict[str, TaskFile] = {}
    for f in chosen:  # a name labels attempts, so two files may not share one
        if f.name in seen:
            raise ConfigError(f"tasks.levels: {f.name} is both level {seen[f.name].level} and level {f.level} "
                              f"problem {f.problem}: choose one level")
        seen[f.name] = f
    return chosen


def find_task(cfg: Config, name: str) -> TaskFile:
    """One task of the config's source by name (every level of a KernelBench checkout, whatever the
    levels and problems chosen for batches)."""
    if cfg.tasks.kernelbench is None:
        return tasks.discover(cfg.path(cfg.tasks.directory), [name])[0]
    root, levels = checkout_levels(cfg)
    for folder in levels.values():
        for f in _files(folder):
            if f.name == name or fnmatch.fnmatchcase(f.name, name):
                return f
    raise ConfigError(f"--task: no task {name!r} in the KernelBench checkout {root}")
