"""The results database: one SQLite file holding runs, prompts, completions, builds and attempts.

    store = Store.open("kgen.db")
    run_id = store.start_run(config_json, plan_json, "cuda", "H100", "2.6.0", "12.4")
    ...
    store.finish_run(run_id, "done")

This is the only module that knows SQL. Generated code lives on disk, named by its
code_hash, and is not stored here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
import sqlite3
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlite_utils

from pipeline.migrations import migrate
from pipeline.records import (BuildResult, Completion, EvalResult, Flag, Usage, Verdict,
                              summary_fields)

_SQLITE_HEADER = b"SQLite format 3\x00"

# Verdicts that mean the candidate never got as far as running; waiting_gpu is here too
# because such a slot has not been tried yet, so it cannot count as compiled.
_NOT_COMPILED = sorted(
    {v.value for v in Verdict if v.failed_before_running} | {Verdict.waiting_gpu.value}
)

# Large or internal columns kept out of list views; attempt() returns them.
_LIST_HIDDEN = ("result_json", "detail", "messages_json", "feedback")


class StoreError(Exception):
    """A database that cannot be used, or a lookup that cannot be answered; one line."""


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


def _value(x: Any) -> Any:
    """Accept an enum member wherever its string value is stored."""
    return getattr(x, "value", x)


def _locked(method):
    # One connection is shared by every thread that holds the Store; the lock keeps one
    # method's statements (and any transaction it opens) from interleaving with another's.
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


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


def _completion(row: dict[str, Any]) -> Completion:
    usage = Usage(**{k: row[k] or 0 for k in Usage.model_fields})
    return Completion(text=row["text"] or "", reasoning=row["reasoning"], usage=usage,
                      model_id=row["model_id"] or "", finish_reason=row["finish_reason"],
                      seconds=row["seconds"] or 0.0, error=row["error"])


def _build(row: dict[str, Any]) -> BuildResult:
    return BuildResult(code_hash=row["code_hash"], ok=bool(row["ok"]),
                       timed_out=bool(row["timed_out"]), log=row["log"] or "",
                       seconds=row["seconds"] or 0.0, build_dir=row["build_dir"] or "",
                       headers=row.get("headers") or "plain")


def _attempt_row(row: dict[str, Any]) -> dict[str, Any]:
    row["run"] = row["run_id"]
    row["flags"] = [f for f in (row["flags"] or "").split(",") if f]
    return row


class Store:
    """One kgen database file. Safe to share between threads of one process."""

    def __init__(self, db: sqlite_utils.Database, path: Path | None = None):
        self.db = db
        self.path = path
        self._lock = threading.RLock()

    @classmethod
    def open(cls, path: str | Path) -> Store:
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"{path}: cannot create its folder ({e.strerror or e})") from None
        _check_file(path)
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

    def _one(self, sql: str, params: list | tuple = ()) -> dict[str, Any] | None:
        return next(self.db.query(sql, params), None)

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
    def cached_completion(self, cache_key: str) -> tuple[str, Completion] | None:
        # A failed call says nothing about what the model would answer, so only answers
        # that arrived are reused.
        row = self._one(
            "SELECT * FROM completions WHERE cache_key = ? AND error IS NULL "
            "ORDER BY created_utc DESC, id DESC LIMIT 1",
            [cache_key],
        )
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
    def get_build(self, code_hash: str) -> BuildResult | None:
        row = self._one("SELECT * FROM builds WHERE code_hash = ?", [code_hash])
        return _build(row) if row else None

    # attempts

    @_locked
    def save_attempt(
        self,
        *,
        run_id: str,
        task_id: str,
        task: str,
        model: str,
        sample: int,
        backend: str,
        template: str,
        completion_id: str | None,
        code_hash: str | None,
        result: EvalResult,
        size: str,
        turn: int = 0,
        generation: int = 0,
        parents: list[str] | None = None,
        messages: list[dict[str, str]] | None = None,
        feedback: str | None = None,
    ) -> str:
        attempt_id = new_id()
        row = dict(
            id=attempt_id, run_id=run_id, task_id=task_id, task=task, model=model,
            sample=sample, backend=backend, template=template, completion_id=completion_id,
            turn=turn, generation=generation, parents=json.dumps(parents or []),
            messages_json=json.dumps(messages) if messages is not None else None, feedback=feedback,
            code_hash=code_hash, **summary_fields(result), detail=result.detail,
            confinement_json=result.confinement.model_dump_json() if result.confinement else None,
            result_json=result.model_dump_json(), device=result.device,
            torch_version=result.torch_version, cuda_version=result.cuda_version, size=size,
            created_utc=_now(),
        )
        # The unique slot index turns REPLACE into "drop the old verdict for this slot",
        # so a re-evaluated slot keeps one row (under the new id).
        self.db["attempts"].insert(row, replace=True)
        return attempt_id

    @_locked
    def attempt_slots(self, run_id: str) -> set[tuple[str, str, str, int, str]]:
        rows = self.db.query(
            "SELECT task, model, template, sample, backend FROM attempts WHERE run_id = ?",
            [run_id],
        )
        return {(r["task"], r["model"], r["template"], r["sample"], r["backend"]) for r in rows}

    @_locked
    def slot_history(self, run_id: str, task: str, model: str, template: str, sample: int, backend: str,
                     generation: int = 0) -> list[dict[str, Any]]:
        """One conversation's stored turns in order, each with its completion's text (a resumed
        search rebuilds its messages from these, so its model calls hit the cache)."""
        rows = self.db.query(
            "SELECT a.*, c.text AS completion_text FROM attempts a LEFT JOIN completions c "
            "ON c.id = a.completion_id WHERE a.run_id = ? AND a.task = ? AND a.model = ? AND a.template = ? "
            "AND a.sample = ? AND a.backend = ? AND a.generation = ? ORDER BY a.turn",
            [run_id, task, model, template, sample, backend, generation])
        return [_attempt_row(dict(r)) for r in rows]

    @_locked
    def archive(self, run_id: str, task: str, model: str, template: str, backend: str,
                before_generation: int) -> list[dict[str, Any]]:
        """A task's verified kernels in an evolving search: correct, trusted and timed on a fit
        device, from generations before `before_generation`; fastest first, one row per code."""
        rows = self.db.query(
            "SELECT a.*, c.text AS completion_text FROM attempts a JOIN completions c ON c.id = a.completion_id "
            "WHERE a.run_id = ? AND a.task = ? AND a.model = ? AND a.template = ? AND a.backend = ? "
            "AND a.generation < ? AND a.verdict = 'correct' AND coalesce(a.trusted, 1) = 1 "
            "AND a.device_unfit IS NULL AND a.time_ms IS NOT NULL ORDER BY a.time_ms, a.id",
            [run_id, task, model, template, backend, before_generation])
        out, seen = [], set()
        for r in rows:
            if r["code_hash"] not in seen:
                seen.add(r["code_hash"])
                out.append(_attempt_row(dict(r)))
        return out

    @_locked
    def chain(self, attempt_id: str) -> list[dict[str, Any]]:
        """The attempts an attempt descends from, oldest first, ending with itself: its earlier
        turns, and through `parents`, the archive kernels it was prompted with."""
        seen: dict[str, dict[str, Any]] = {}
        todo = [attempt_id]
        while todo and len(seen) < 200:  # a lineage is a DAG; the cap only bounds a corrupt one
            row = self._one("SELECT id, task, turn, generation, sample, verdict, speedup_eager, parents, "
                            "created_utc FROM attempts WHERE id = ?", [todo.pop()])
            if row is None or row["id"] in seen:
                continue
            seen[row["id"]] = row
            todo.extend(json.loads(row["parents"] or "[]"))
        return sorted(seen.values(), key=lambda r: (r["generation"], r["sample"], r["turn"], r["created_utc"]))

    @_locked
    def attempts(
        self,
        run: str | None = None,
        task: str | None = None,
        model: str | None = None,
        verdict: str | Verdict | None = None,
        flag: str | Flag | None = None,
        limit: int | None = None,
        turn: int | None = None,
        evals: bool = False,
    ) -> list[dict[str, Any]]:
        """Attempts, newest first. `kgen eval` results are left out unless `evals` or `run` names
        their run: one file judged by hand is not a batch result (leaderboard, report, library)."""
        where, params = [], []
        for column, value in (("run_id", run), ("task", task), ("model", model),
                              ("verdict", verdict), ("turn", turn)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(_value(value))
        if flag is not None:
            # flags is stored comma-joined; the padding stops one flag matching inside another.
            where.append("instr(',' || coalesce(flags, '') || ',', ?) > 0")
            params.append(f",{_value(flag)},")
        if run is None and not evals:
            where.append("run_id NOT IN (SELECT id FROM runs WHERE kind = 'eval')")
        sql = "SELECT * FROM attempts"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_utc DESC, id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        out = []
        for row in self.db.query(sql, params):
            for column in _LIST_HIDDEN:
                row.pop(column)
            out.append(_attempt_row(row))
        return out

    @_locked
    def attempt(self, id_or_prefix: str) -> dict[str, Any] | None:
        """One attempt with everything that explains it; the id may be a unique prefix."""
        row = self._one("SELECT * FROM attempts WHERE id = ?", [id_or_prefix])
        if row is None:
            # substr, not LIKE: an id prefix must not be read as a pattern.
            matches = list(self.db.query(
                "SELECT * FROM attempts WHERE substr(id, 1, ?) = ? LIMIT 2",
                [len(id_or_prefix), id_or_prefix],
            ))
            if len(matches) > 1:
                raise StoreError(f"attempt id prefix {id_or_prefix!r} is ambiguous")
            if not matches:
                return None
            row = matches[0]
        row = _attempt_row(row)
        row["result"] = EvalResult.model_validate_json(row.pop("result_json"))

        comp = None
        if row["completion_id"]:
            comp = self._one("SELECT * FROM completions WHERE id = ?", [row["completion_id"]])
        prompt = None
        if comp and comp["prompt_id"]:
            prompt = self._one("SELECT text FROM prompts WHERE id = ?", [comp["prompt_id"]])
        build = None
        if row["code_hash"]:
            build = self._one("SELECT * FROM builds WHERE code_hash = ?", [row["code_hash"]])

        completion = _completion(comp) if comp else None
        row.update({
            "prompt_id": comp["prompt_id"] if comp else None,
            "prompt": prompt["text"] if prompt else None,
            "completion": completion,
            "completion_text": completion.text if completion else None,
            "reasoning": completion.reasoning if completion else None,
            "usage": completion.usage if completion else None,
            "cost_usd": comp["cost_usd"] if comp else None,
            "build": _build(build) if build else None,
            "build_log": build["log"] if build else None,
        })
        return row

    # baselines

    @_locked
    def all_baselines(self) -> dict[str, str]:
        """Every cached baseline by key, to hand to a worker that cannot open the database."""
        return {r["key"]: r["result_json"] for r in self.db.query("SELECT key, result_json FROM baselines")}

    @_locked
    def run_spending(self, run_id: str) -> tuple[int, float]:
        """(tokens, dollars) spent on this run's model calls so far."""
        row = self._one("SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) AS tokens, "
                        "COALESCE(SUM(cost_usd), 0) AS usd FROM completions WHERE run_id = ?", [run_id])
        return int(row["tokens"]), float(row["usd"])

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

    # summaries

    @_locked
    def run_summary(self, run_id: str) -> list[dict[str, Any]]:
        """Per (task, model) counts for one run, computed from the stored attempt rows."""
        not_compiled = ", ".join("?" for _ in _NOT_COMPILED)
        sql = f"""
            SELECT
                task,
                model,
                count(*) AS attempts,
                count(CASE WHEN verdict NOT IN ({not_compiled}) THEN 1 END) AS compiled,
                count(CASE WHEN verdict = 'correct' THEN 1 END) AS correct,
                count(CASE WHEN verdict = 'correct' AND speedup_eager > 1 THEN 1 END) AS fast_1,
                count(CASE WHEN verdict = 'correct' AND speedup_compile > 1 THEN 1 END)
                    AS fast_compile,
                max(CASE WHEN verdict = 'correct' THEN speedup_eager END) AS best_speedup_eager,
                max(CASE WHEN verdict = 'correct' THEN speedup_compile END)
                    AS best_speedup_compile
            FROM attempts
            WHERE run_id = ?
            GROUP BY task, model
            ORDER BY task, model
        """
        return list(self.db.query(sql, [*_NOT_COMPILED, run_id]))
