"""Writing and reading a self-contained, hash-locked package of the best verified kernels.

    manifest = export_best("db/kgen.db", "dist/kgen-kernels")
    manifest, read = open_export("dist/kgen-kernels")   # read(rel) -> text, checked against kgen.lock

Layout of an export:
    kernels/<task>/<code_hash>.py    the kernel sources, as evaluated
    tasks/<task>/<sha16>.py          the reference files they were validated against
    manifest.json                    per task, best first: provenance, numbers, validated envelope,
                                     whether it beats torch.compile too; what was left out, and why
    kgen.lock                        every file above -> sha256
    builds/<code_hash>/              created on first load: the per-hash extension build cache

Only kernels verified faster than eager are exported (leaderboard.faster, the rule the library
uses); each records whether it is also faster than torch.compile (beats_compile), which decides
whether the library runs it in compiled callers.

The lock guards against files changed or swapped after export (an edit, a bad merge, a partial
copy). It is not a signature: whoever can rewrite the files can rewrite the lock.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from pydantic import Field

from ..child.tasks import TaskError
from ..leaderboard import is_verified, not_faster_reason, rank_key
from .kernels import EVALUATOR_VERSION, KernelEntry, LibraryError, _Record, device_kind, entry_from_attempt, sha256_text

LOCK = "kgen.lock"
MANIFEST = "manifest.json"


class ExportedKernel(KernelEntry):
    """A manifest entry: a KernelEntry plus where its files are in the export."""

    source: str
    """The kernel source, relative to the export folder."""
    reference: str
    """The reference task file, relative to the export folder."""


class Manifest(_Record):
    """manifest.json of an export."""

    kgen_export: int = 2
    """Format version of this file (1: kernels carry no beats_eager/beats_compile verdicts)."""
    evaluator_version: str = EVALUATOR_VERSION
    """Version of the checks every kernel here passed."""
    created_utc: str = ""
    """When the export was written."""
    tasks: dict[str, list[ExportedKernel]] = Field(default_factory=dict)
    """Per task, one kernel per device kind and torch version, best first; each verified faster than eager."""
    skipped: list[str] = Field(default_factory=list)
    """Verified attempts that were left out, and why (a source file missing or changed, or not
    verified faster than eager: one line per task and device kind, naming the best of those)."""


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _prepare(out_dir: Path) -> None:
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / LOCK).is_file():
        raise LibraryError(f"{out_dir}: not empty and not a kgen export; choose a new folder")
    # Re-exporting into an export replaces its files but keeps builds/, the compiled cache.
    for sub in ("kernels", "tasks"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
    for name in (MANIFEST, LOCK):
        (out_dir / name).unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)


def export_best(db: str | Path, out_dir: str | Path, *, generated_dir: str | Path = "generated") -> Manifest:
    """Write the best verified kernel faster than eager per task, device kind and torch version into `out_dir`."""
    from ..store.store import Store

    db, out_dir, generated_dir = Path(db), Path(out_dir), Path(generated_dir)
    if not db.is_file():
        raise LibraryError(f"{db}: no database")
    store = Store.open(db, reader=True)
    try:
        groups: dict[tuple, list[dict]] = {}
        for row in store.attempts(verdict="correct"):
            if is_verified(row):
                key = (row["task"], row["backend"], device_kind(row["backend"], row["device"] or ""),
                       row["torch_version"], row["cuda_version"])
                groups.setdefault(key, []).append(row)
        manifest = Manifest(created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        files: dict[str, str] = {}
        _prepare(out_dir)
        for key in sorted(groups, key=lambda k: tuple(str(v) for v in k)):
            slow: list[str] = []  # "attempt: reason" of each verified kernel here not faster than eager
            for row in sorted(groups[key], key=rank_key):  # the best one faster than eager, source intact
                kernel = _export_one(store, row, generated_dir, out_dir, files, manifest.skipped, slow)
                if kernel:
                    manifest.tasks.setdefault(row["task"], []).append(kernel)
                    break
            if slow:  # one line per group: a long run can hold dozens of slow kernels for one task
                more = f" (and {len(slow) - 1} more left out for the same reason)" if len(slow) > 1 else ""
                manifest.skipped.append(f"{key[0]} {slow[0]}{more}")
        for kernels in manifest.tasks.values():
            kernels.sort(key=lambda k: rank_key({"speedup_eager": k.speedup_eager, "time_ms": k.time_ms,
                                                 "id": k.attempt_id}))
    finally:
        store.close()
    text = manifest.model_dump_json(indent=2) + "\n"
    (out_dir / MANIFEST).write_text(text)
    files[MANIFEST] = sha256_text(text)
    (out_dir / LOCK).write_text(json.dumps(dict(sorted(files.items())), indent=2) + "\n")
    return manifest


def _export_one(store, row: dict, generated_dir: Path, out_dir: Path, files: dict[str, str],
                skipped: list[str], slow: list[str]) -> ExportedKernel | None:
    path = generated_dir / f"{row['code_hash']}.py"
    if not path.is_file():
        skipped.append(f"{row['task']} attempt {row['id']}: {path} is missing")
        return None
    source = path.read_text()
    sha = sha256_text(source)
    if sha[:16] != row["code_hash"]:
        skipped.append(f"{row['task']} attempt {row['id']}: {path} was changed after evaluation")
        return None
    task_row = task_row_of(store, row["task_id"])
    if task_row is None:
        skipped.append(f"{row['task']} attempt {row['id']}: its reference source is not in the database")
        return None
    try:
        entry = entry_from_attempt(store.attempt(row["id"]), task_row["source"], sha)
    except (LibraryError, TaskError) as exc:  # a reference that cannot be described at that size
        skipped.append(f"{row['task']} attempt {row['id']}: {exc}")
        return None
    if not entry.beats_eager:
        slow.append(f"attempt {row['id']}: " + not_faster_reason(entry.code_hash, entry.device, "eager", entry.time_ms,
                                                                 entry.time_p75_ms, entry.eager_ms))
        return None
    rel_source = f"kernels/{row['task']}/{row['code_hash']}.py"
    rel_task = f"tasks/{row['task']}/{entry.task_sha256[:16]}.py"
    for rel, text in ((rel_source, source), (rel_task, task_row["source"])):
        (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (out_dir / rel).write_text(text)
        files[rel] = sha256_text(text)
    return ExportedKernel(**entry.model_dump(), source=rel_source, reference=rel_task)


def task_row_of(store, task_id: str | None) -> dict | None:
    """The tasks row (name, path, source) an attempt was judged against, or None."""
    import sqlite_utils

    if not task_id:
        return None
    try:
        return store.db["tasks"].get(task_id)  # the Store has no getter for this one row yet
    except sqlite_utils.db.NotFoundError:
        return None


def open_export(export_dir: str | Path) -> tuple[Manifest, Callable[[str], str]]:
    """The manifest, and a reader that returns a file's text only if it matches kgen.lock."""
    root = Path(export_dir).resolve()
    if not (root / LOCK).is_file():
        raise LibraryError(f"{root}: not a kgen export (no {LOCK})")
    try:
        lock = json.loads((root / LOCK).read_text())
    except json.JSONDecodeError as exc:
        raise LibraryError(f"{root / LOCK}: not valid JSON ({exc})") from None

    def read(rel: str) -> str:
        path = (root / rel).resolve()
        if rel not in lock or not path.is_relative_to(root):
            raise LibraryError(f"{root / rel}: not listed in {LOCK}; refusing to load it")
        if not path.is_file():
            raise LibraryError(f"{path}: missing from the export")
        data = path.read_bytes()
        if _sha256_bytes(data) != lock[rel]:
            raise LibraryError(f"{path}: sha256 does not match {LOCK} (changed after export); refusing to load it")
        return data.decode()

    return Manifest.model_validate_json(read(MANIFEST)), read
