"""The Store's read side: queries over stored attempts (a listing, one attempt with everything
that explains it, a search conversation's turns, the archive of verified kernels, an attempt's
lineage) and per-run counts and spending, as a mixin that pipeline.store.store.Store inherits.

StoreError, the lock decorator and the row decoders are here too: both halves of the Store use
them, and this module cannot import store.py, which imports it. Use it through Store.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import sqlite_utils

from pipeline.records import BuildResult, Completion, EvalResult, Flag, Usage, Verdict

# Verdicts that mean the candidate never got as far as running; waiting_gpu is here too
# because such a slot has not been tried yet, so it cannot count as compiled.
_NOT_COMPILED = sorted(
    {v.value for v in Verdict if v.failed_before_running} | {Verdict.waiting_gpu.value}
)

# Large or internal columns kept out of list views; attempt() returns them.
_LIST_HIDDEN = ("result_json", "detail", "messages_json", "feedback")


class StoreError(Exception):
    """A database that cannot be used, or a lookup that cannot be answered; one line."""


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


class StoreQueries:
    """Read-side methods of Store, which provides `db` and `_lock` (the lock `_locked` takes)."""

    db: sqlite_utils.Database

    def _one(self, sql: str, params: list | tuple = ()) -> dict[str, Any] | None:
        return next(self.db.query(sql, params), None)

    # attempts

    @_locked
    def names(self, column: str) -> list[str]:
        """The distinct tasks or models (`column`) of every stored attempt: what --task and --model
        can match, so a misspelt one is an error rather than "No attempts match"."""
        if column not in ("task", "model"):
            raise ValueError(f"names: {column!r} is not task or model")
        return [r[column] for r in self.db.query(f"SELECT DISTINCT {column} FROM attempts ORDER BY 1")]

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
        """A task's verified kernels in an evolving search: correct, trusted and timed, from
        generations before `before_generation`, one row per code; those timed on a fit device first,
        fastest first, then those whose device was unfit to time them (no figure), oldest first. The
        unfit ones are parents, not winners (pipeline.run.search.reached): left out, a search on a busy
        box had no archive at all and every child was prompted from nothing."""
        rows = self.db.query(
            "SELECT a.*, c.text AS completion_text FROM attempts a JOIN completions c ON c.id = a.completion_id "
            "WHERE a.run_id = ? AND a.task = ? AND a.model = ? AND a.template = ? AND a.backend = ? "
            "AND a.generation < ? AND a.verdict = 'correct' AND coalesce(a.trusted, 1) = 1 "
            "AND (a.time_ms IS NOT NULL OR a.device_unfit IS NOT NULL) "
            "ORDER BY a.device_unfit IS NOT NULL, a.time_ms, a.created_utc, a.id",
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
        their run: one file judged by hand is not a batch result (leaderboard, report, library). Each
        row also has `untrusted_reason` (from its result; None unless trusted is 0)."""
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
            # Why an attempt is untrusted is kept only in its result: a listing says why it is not verified.
            row["untrusted_reason"] = _untrusted_reason(row["result_json"]) if row.get("trusted") == 0 else None
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

    # summaries

    @_locked
    def run_spending(self, run_id: str) -> tuple[int, float]:
        """(tokens, dollars) spent on this run's model calls so far."""
        row = self._one("SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) AS tokens, "
                        "COALESCE(SUM(cost_usd), 0) AS usd FROM completions WHERE run_id = ?", [run_id])
        return int(row["tokens"]), float(row["usd"])

    @_locked
    def run_summary(self, run_id: str) -> list[dict[str, Any]]:
        """Per (task, model) counts for one run, computed from the stored attempt rows. The best kernel
        is not here: leaderboard.rank_key decides it, for the summary as for `kgen best`."""
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
                    AS fast_compile
            FROM attempts
            WHERE run_id = ?
            GROUP BY task, model
            ORDER BY task, model
        """
        return list(self.db.query(sql, [*_NOT_COMPILED, run_id]))


def _untrusted_reason(result_json: str | None) -> str | None:
    """Why a result is untrusted: its outcome's (EvalResult.outcome), or a row's from before it."""
    stored = json.loads(result_json or "{}")
    return stored["outcome"].get("why") if "outcome" in stored else stored.get("untrusted_reason")
