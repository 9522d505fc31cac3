"""The results database: one SQLite file holding runs, prompts, completions, builds and attempts.

    store = Store.open("kgen.db")
    run_id = store.start_run(config_json, plan_json, "cuda", "H100", "2.6.0", "12.4")
    ...
    store.finish_run(run_id, "done")

This module (the writes, and lookups by key) and store_queries.py (the read-side queries over
attempts and runs, which Store inherits) are the only ones that know SQL. Generated code lives on
disk, named by its code_hash, and is not stored here.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
import threading
import time
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlite_utils

from pipeline.store.migrations import migrate, pending
from pipeline.records import BuildResult, Completion, EvalResult, Provenance, summary_fields
# StoreError is defined beside the queries only because they raise it too and store_queries.py
# cannot import this module; pipeline.store.store.StoreError stays its public name.
from pipeline.store.queries import StoreError, StoreQueries, _build, _completion, _locked

_SQLITE_HEADER = b"SQLite format 3\x00"

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_id_lock = threading.Lock()
_last_ms = 0
_last_rand = 0


def new_id() -> str:
    """A 26-character ULID: 48-bit ms timestamp then 80 random bits, in Crockford base32.

    Within one millisecond (or if the clock steps back) the random part is incremented
    instead of redrawn, so ids made by one process sort in the order they were made.
    """
    global _last_ms, _last_rand
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms, rand = _last_ms, _last_rand + 1
            if rand >> 80:
                ms, rand = ms + 1, 0
        else:
            rand = secrets.randbits(80)
        _last_ms, _last_rand = ms, rand
    value = (ms << 80) | rand
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _check_file(path: Path) -> None:
    """Refuse anything that is not empty and not SQLite before SQLite touches it.

    Opening a stray file with SQLite and enabling WAL would rewrite its header; reading
    the first bytes ourselves leaves it exactly as it was.
    """
    if not path.exists():
        return
    if not path.is_file():
        raise StoreError(f"{path}: not a kgen database (not a regular file)")
    try:
        with path.open("rb") as f:
            head = f.read(len(_SQLITE_HEADER))
    except OSError as e:
        raise StoreError(f"{path}: not a kgen database ({e.strerror or e})") from None
    if head and head != _SQLITE_HEADER:
        raise StoreError(f"{path}: not a kgen database (not an SQLite file)")


def _unwritable(path: Path) -> str | None:
    """Why the database at `path` cannot be written (its folder, or the file itself), or None.
    os.access answers as the kernel would for this process: a read-only mount is refused even to
    root, a mode bit only to others. SQLite needs the folder too: it writes a journal beside the file."""
    folder = path.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"its folder {folder} is not writable"
    if path.exists() and not os.access(path, os.W_OK):
        return "the file is read-only"
    return None


def check_writable(path: Path) -> None:
    """StoreError where the database at `path` could not be created or written; creates nothing (a
    command that then stops on bad input leaves no folder behind)."""
    if path.exists():
        reason = _unwritable(path)
    else:
        folder = next((p for p in path.parents if p.exists()), None)
        reason = None if folder is not None and os.access(folder, os.W_OK | os.X_OK) else f"its folder {folder} is not writable"
    if reason:
        raise StoreError(f"{path}: cannot write the database: {reason}")


def _open_read_only(path: Path) -> sqlite_utils.Database:
    """`path` opened read-only, for a database whose file or folder cannot be written. mode=ro reads
    a WAL database only where SQLite can still create or reach its -shm beside it; where it cannot,
    immutable=1 reads the file as it stands (nothing can be writing it, in a folder no one can write)."""
    uri = "file:" + urllib.parse.quote(str(path.resolve()))
    for query in ("mode=ro", "mode=ro&immutable=1"):
        conn = sqlite3.connect(f"{uri}?{query}", uri=True, check_same_thread=False)
        try:
            db = sqlite_utils.Database(conn)
            if "_kgen_migrations" not in db.table_names():
                raise StoreError(f"{path}: not a kgen database")
            missing = pending(db)
            if missing:
                raise StoreError(f"{path}: read-only, and its schema is older than this kgen's (it lacks "
                                 f"{missing[0]}): open it once where it can be written")
            return db
        except sqlite3.OperationalError as e:
            conn.close()
            failure = e
        except BaseException:
            conn.close()
            raise
    raise StoreError(f"{path}: cannot read the database read-only ({failure})")


class Store(StoreQueries):
    """One kgen database file. Safe to share between threads of one process. The read-side
    queries (attempts, attempt, chain, archive, slot_history, run_summary, ...) are inherited
    from store_queries.StoreQueries."""

    def __init__(self, db: sqlite_utils.Database, path: Path | None = None):
        self.db = db
        self.path = path
        self._lock = threading.RLock()

    @classmethod
    def open(cls, path: str | Path, reader: bool = False) -> Store:
        """The database at `path`, created where missing. A `reader` (a command that only reads)
        opens an existing file read-only where it or its folder cannot be written; anything else
        that cannot write there is one line naming the path and why."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"{path}: cannot create its folder ({e.strerror or e})") from None
        _check_file(path)
        unwritable = _unwritable(path)
        if unwritable and reader and path.is_file():
            return cls(_open_read_only(path), path)
        if unwritable:
            raise StoreError(f"{path}: cannot write the database: {unwritable} (commands that only read it, "
                             "such as kgen best and kgen attempts, still can)")
        # check_same_thread=False: the Store's own lock serialises use across threads.
        conn = sqlite3.connect(str(path), check_same_thread=False)
        try:
            db = sqlite_utils.Database(conn)
            tables = set(db.table_names())
            # Another program's database: adding our tables to it would be changing a
            # file that is not ours.
            if tables and "_kgen_migrations" not in tables:
                shown = ", ".join(sorted(tables)[:5])
                raise StoreError(f"{path}: not a kgen database (it holds other tables: {shown})")
            db.enable_wal()
            migrate(db)
        except sqlite3.OperationalError as e:  # locked, unreadable, disk full: not its content
            conn.close()
            raise StoreError(f"{path}: cannot open the database ({e})") from None
        except sqlite3.DatabaseError as e:  # not a database, or a corrupt one
            conn.close()
            raise StoreError(f"{path}: not a kgen database ({e})") from None
        except BaseException:
            conn.close()
            raise
        return cls(db, path)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # runs

    @_locked
    def start_run(
        self,
        config_json: str,
        plan_json: str,
        backend: str,
        device: str,
        torch_version: str,
        cuda_version: str | None,
        note: str | None = None,
        key: str | None = None,
        kind: str = "batch",
    ) -> str:
        """A new run; `kind` is "batch" (`kgen run`) or "eval" (one `kgen eval`, kept apart)."""
        run_id = new_id()
        self.db["runs"].insert(dict(
            id=run_id, started_utc=_now(), finished_utc=None, status="running",
            config_json=config_json, plan_json=plan_json, backend=backend, device=device,
            torch_version=torch_version, cuda_version=cuda_version, note=note, key=key, kind=kind,
        ))
        return run_id

    @_locked
    def find_run(self, key: str) -> str | None:
        """The newest run with this plan key, for resuming."""
        row = self._one("SELECT id FROM runs WHERE key = ? ORDER BY id DESC LIMIT 1", [key])
        return row["id"] if row else None

    @_locked
    def resume_run(self, run_id: str) -> None:
        self.db["runs"].update(run_id, {"status": "running", "finished_utc": None})

    @_locked
    def finish_run(self, run_id: str, status: str) -> None:
        self.db["runs"].update(run_id, {"finished_utc": _now(), "status": status})

    @_locked
    def note_unjudged(self, run_id: str, task: str, model: str, sample: int, backend: str, error: str,
                      turn: int = 0, generation: int = 0) -> None:
        """An attempt of the run that could not be judged, and why (one line): a resume judges it again."""
        self.db["unjudged"].insert(dict(run_id=run_id, task=task, model=model, sample=sample, backend=backend, turn=turn,
                                        generation=generation, error=error.splitlines()[0][:1000] if error else "",
                                        created_utc=_now()))

    @_locked
    def unjudged(self, run_id: str) -> list[dict[str, Any]]:
        """The run's attempts that could not be judged and have no stored attempt since: the newest reason each."""
        same = ("{0}.run_id = u.run_id AND {0}.task = u.task AND {0}.model = u.model AND {0}.sample = u.sample AND "
                "{0}.backend = u.backend AND {0}.turn = u.turn AND {0}.generation = u.generation")
        return list(self.db.query(
            "SELECT u.task, u.model, u.sample, u.backend, u.turn, u.generation, u.error, u.created_utc FROM unjudged u "
            f"WHERE u.run_id = ? AND u.id = (SELECT MAX(id) FROM unjudged v WHERE {same.format('v')}) "
            f"AND NOT EXISTS (SELECT 1 FROM attempts a WHERE {same.format('a')}) ORDER BY u.id", [run_id]))

    @_locked
    def get_run(self, run_id: str) -> dict[str, Any] | None:
        return self._one("SELECT * FROM runs WHERE id = ?", [run_id])

    @_locked
    def latest_run_id(self, evals: bool = False) -> str | None:
        """The newest batch run (or the newest run of either kind, with `evals`)."""
        where = "" if evals else "WHERE kind != 'eval' "
        row = self._one(f"SELECT id FROM runs {where}ORDER BY started_utc DESC, id DESC LIMIT 1")
        return row["id"] if row else None

    # tasks and prompts

    @_locked
    def upsert_task(self, name: str, path: str, source: str) -> str:
        # The id carries the source hash, so an edited task file becomes a new task and
        # old attempts keep pointing at the source they were actually run against.
        sha = _sha256(source)
        task_id = f"{name}:{sha[:16]}"
        self.db["tasks"].upsert(
            {"id": task_id, "name": name, "source_sha": sha, "source": source, "path": str(path)},
            pk="id",
        )
        return task_id

    @_locked
    def save_prompt(self, task_id: str, template: str, backend: str, text: str) -> str:
        prompt_id = _sha256(text)[:16]
        self.db["prompts"].insert(
            {"id": prompt_id, "task_id": task_id, "template": template, "backend": backend,
             "text": text},
            ignore=True,
        )
        return prompt_id

    # completions

    @_locked
    def save_completion(
        self,
        run_id: str,
        task_id: str,
        prompt_id: str,
        model_cfg_name: str,
        provider: str,
        base_url: str | None,
        sample: int,
        cache_key: str,
        completion: Completion,
        cost_usd: float,
    ) -> str:
        completion_id = new_id()
        self.db["completions"].insert(dict(
            id=completion_id, run_id=run_id, task_id=task_id, prompt_id=prompt_id,
            model=model_cfg_name, provider=provider, model_id=completion.model_id,
            base_url=base_url, sample=sample, cache_key=cache_key,
            text=completion.text, reasoning=completion.reasoning,
            **completion.usage.model_dump(),
            cost_usd=cost_usd, finish_reason=completion.finish_reason,
            seconds=completion.seconds, error=completion.error, created_utc=_now(),
        ))
        return completion_id

    @_locked
    def cached_completion(self, cache_key: str, run_id: str | None = None) -> tuple[str, Completion] | None:
        """The newest answer stored under `cache_key` (only in run `run_id`, where given: a resume
        reuses what it paid for, a new run draws new answers). A failed call says nothing about what
        the model would answer, so only answers that arrived are reused."""
        where, params = "cache_key = ? AND error IS NULL", [cache_key]
        if run_id is not None:
            where, params = where + " AND run_id = ?", params + [run_id]
        row = self._one(f"SELECT * FROM completions WHERE {where} ORDER BY created_utc DESC, id DESC LIMIT 1", params)
        return (row["id"], _completion(row)) if row else None

    # builds

    @_locked
    def save_build(self, result: BuildResult, backend: str, torch_version: str) -> None:
        # upsert, not INSERT OR REPLACE: an update keeps the FTS triggers in step.
        row = result.model_dump(exclude={"cached"})
        row.update(ok=int(result.ok), timed_out=int(result.timed_out), backend=backend,
                   torch_version=torch_version, created_utc=_now())
        self.db["builds"].upsert(row, pk="code_hash")

    @_locked
    def get_build(self, code_hash: str, torch_version: str | None = None) -> BuildResult | None:
        """The stored build of this code; with `torch_version`, only one built against that torch
        (an extension built for another is not loadable, or not the same)."""
        row = self._one("SELECT * FROM builds WHERE code_hash = ?", [code_hash])
        if row is None or (torch_version is not None and row.get("torch_version") != torch_version):
            return None
        return _build(row)

    # attempts

    @_locked
    def save_attempt(self, origin: Provenance, result: EvalResult) -> str:
        """Store one verdict with where it came from; returns the new attempt's id."""
        attempt_id = new_id()
        row = dict(
            id=attempt_id, **origin.model_dump(exclude={"parents", "messages"}),
            parents=json.dumps(origin.parents),
            messages_json=json.dumps(origin.messages) if origin.messages is not None else None,
            **summary_fields(result), detail=result.detail,
            confinement_json=result.confinement.model_dump_json() if result.confinement else None,
            result_json=result.model_dump_json(), device=result.device,
            torch_version=result.torch_version, cuda_version=result.cuda_version, created_utc=_now(),
        )
        # The unique slot index turns REPLACE into "drop the old verdict for this slot",
        # so a re-evaluated slot keeps one row (under the new id).
        self.db["attempts"].insert(row, replace=True)
        return attempt_id

    # baselines

    @_locked
    def all_baselines(self) -> dict[str, str]:
        """Every cached baseline by key, to hand to a worker that cannot open the database."""
        return {r["key"]: r["result_json"] for r in self.db.query("SELECT key, result_json FROM baselines")}

    @_locked
    def get_baseline(self, key: str) -> str | None:
        row = self._one("SELECT result_json FROM baselines WHERE key = ?", [key])
        return row["result_json"] if row else None

    @_locked
    def save_baseline(
        self, key: str, task: str, size: str, device: str, torch_version: str, result_json: str
    ) -> None:
        self.db["baselines"].upsert(
            {"key": key, "task": task, "size": size, "device": device,
             "torch_version": torch_version, "result_json": result_json,
             "created_utc": _now()},
            pk="key",
        )
