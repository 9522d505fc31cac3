"""The kgen database schema, as an append-only list of numbered migrations.

    migrate(db)   # safe on every open; applies only what this file has not yet seen

Never edit or reorder a migration that has shipped: databases in the wild have recorded
its name as applied and will not run it again. Add a new function at the end instead.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

import sqlite_utils

MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = []
migration = MIGRATIONS.append

_APPLIED = "_kgen_migrations"


def migrate(db: sqlite_utils.Database) -> None:
    db[_APPLIED].create({"name": str, "applied_at": str}, pk="name", if_not_exists=True)
    applied = {row["name"] for row in db[_APPLIED].rows}
    for fn in MIGRATIONS:
        if fn.__name__ in applied:
            continue
        # A crash mid-migration must not leave a half-built schema recorded as applied.
        with db.atomic():
            fn(db)
            # ignore=True: a second process opening the same fresh file may have raced us
            # here; every migration is written to be harmless when repeated.
            db[_APPLIED].insert(
                {"name": fn.__name__, "applied_at": datetime.now(timezone.utc).isoformat()},
                ignore=True,
            )


def pending(db: sqlite_utils.Database) -> list[str]:
    """The migrations `db` has not had, by name (reading only: for a database opened read-only)."""
    applied = {row["name"] for row in db[_APPLIED].rows} if _APPLIED in db.table_names() else set()
    return [fn.__name__ for fn in MIGRATIONS if fn.__name__ not in applied]


def _fts(db: sqlite_utils.Database, table: str, columns: list[str]) -> None:
    # Triggers keep the index current without the store having to remember to update it.
    if not db[table].detect_fts():
        db[table].enable_fts(columns, create_triggers=True)


@migration
def m001_initial(db: sqlite_utils.Database) -> None:
    # Every create is if_not_exists so that a process which lost a race to migrate the
    # same new file can run this again harmlessly.
    db["runs"].create(
        {
            "id": str,
            "started_utc": str,
            "finished_utc": str,
            "config_json": str,
            "plan_json": str,
            "status": str,
            "backend": str,
            "device": str,
            "torch_version": str,
            "cuda_version": str,
            "note": str,
        },
        pk="id",
        not_null=["started_utc", "status"],
        if_not_exists=True,
    )

    db["tasks"].create(
        {"id": str, "name": str, "source_sha": str, "source": str, "path": str},
        pk="id",
        not_null=["name", "source_sha", "source"],
        if_not_exists=True,
    )

    db["prompts"].create(
        {"id": str, "task_id": str, "template": str, "backend": str, "text": str},
        pk="id",
        not_null=["text"],
        if_not_exists=True,
    )

    db["completions"].create(
        {
            "id": str,
            "run_id": str,
            "task_id": str,
            "prompt_id": str,
            "model": str,
            "provider": str,
            "model_id": str,
            "base_url": str,
            "sample": int,
            "cache_key": str,
            "text": str,
            "reasoning": str,
            "prompt_tokens": int,
            "completion_tokens": int,
            "reasoning_tokens": int,
            "cost_usd": float,
            "finish_reason": str,
            "seconds": float,
            "error": str,
            "created_utc": str,
        },
        pk="id",
        not_null=["created_utc"],
        if_not_exists=True,
    )
    db["completions"].create_index(["cache_key"], if_not_exists=True)
    _fts(db, "completions", ["text", "reasoning"])

    db["builds"].create(
        {
            "code_hash": str,
            "ok": int,
            "timed_out": int,
            "log": str,
            "seconds": float,
            "build_dir": str,
            "backend": str,
            "torch_version": str,
            "created_utc": str,
        },
        pk="code_hash",
        not_null=["ok", "timed_out"],
        if_not_exists=True,
    )
    _fts(db, "builds", ["log"])

    db["attempts"].create(
        {
            "id": str,
            "run_id": str,
            "task_id": str,
            "task": str,
            "model": str,
            "sample": int,
            "backend": str,
            "template": str,
            "completion_id": str,
            "code_hash": str,
            "verdict": str,
            "flags": str,
            "error": str,
            "detail": str,
            "time_ms": float,
            "eager_ms": float,
            "compile_ms": float,
            "floor_ms": float,
            "speedup_eager": float,
            "speedup_compile": float,
            "floor_fraction": float,
            "result_json": str,
            "device": str,
            "torch_version": str,
            "cuda_version": str,
            "size": str,
            "created_utc": str,
        },
        pk="id",
        not_null=["run_id", "task", "model", "sample", "backend", "template", "verdict"],
        if_not_exists=True,
    )
    # One row per attempt slot: re-evaluating a slot replaces it, so counts stay honest.
    db["attempts"].create_index(
        ["run_id", "task", "model", "template", "sample", "backend"],
        index_name="attempts_slot",
        unique=True,
        if_not_exists=True,
    )
    db["attempts"].create_index(["verdict"], if_not_exists=True)
    db["attempts"].create_index(["task"], if_not_exists=True)

    db["baselines"].create(
        {
            "key": str,
            "task": str,
            "size": str,
            "device": str,
            "torch_version": str,
            "result_json": str,
            "created_utc": str,
        },
        pk="key",
        not_null=["result_json"],
        if_not_exists=True,
    )


@migration
def m002_run_key(db: sqlite_utils.Database) -> None:
    # A run is identified by what it plans (tasks, models, template, samples, backend, size), so
    # re-running the same command finds it and does only what is missing.
    if "key" not in db["runs"].columns_dict:
        db["runs"].add_column("key", str)
    db["runs"].create_index(["key"], if_not_exists=True)


@migration
def m003_trust(db: sqlite_utils.Database) -> None:
    # Whether the candidate's child was confined as the config required, and how (JSON). Rows from
    # before this migration have NULL: their evaluator predates the sealed judge.
    for column, kind in (("trusted", int), ("confinement_json", str)):
        if column not in db["attempts"].columns_dict:
            db["attempts"].add_column(column, kind)


@migration
def m004_device_unfit(db: sqlite_utils.Database) -> None:
    # Why the device was not fit to time an attempt (NULL: fit, or checked before this migration
    # existed): such a row keeps its verdict, is never "best", and a resume re-times it.
    if "device_unfit" not in db["attempts"].columns_dict:
        db["attempts"].add_column("device_unfit", str)


@migration
def m005_search(db: sqlite_utils.Database) -> None:
    # Search (pipeline.run.search): an attempt is one turn of a conversation or one child of a
    # generation, so a slot holds several rows; the unique slot index grows those two columns.
    # parents: JSON list of the attempt ids it was prompted with; messages_json: exactly what was
    # sent; feedback: the user turn its verdict became (what the next turn was told).
    attempts = db["attempts"]
    for column, kind, default in (("turn", int, 0), ("generation", int, 0)):
        if column not in attempts.columns_dict:
            attempts.add_column(column, kind, not_null_default=default)
    for column in ("parents", "messages_json", "feedback"):
        if column not in attempts.columns_dict:
            attempts.add_column(column, str)
    db.execute("DROP INDEX IF EXISTS attempts_slot")
    attempts.create_index(["run_id", "task", "model", "template", "sample", "backend", "generation", "turn"],
                          index_name="attempts_turn", unique=True, if_not_exists=True)
    attempts.create_index(["run_id", "turn"], if_not_exists=True)


@migration
def m006_build_headers(db: sqlite_utils.Database) -> None:
    # Which torch headers a build compiled against (fast or plain, pipeline/build/headers.py); NULL for
    # builds from before fast builds existed, which were all plain.
    if "headers" not in db["builds"].columns_dict:
        db["builds"].add_column("headers", str)


@migration
def m007_grad_dtype(db: sqlite_utils.Database) -> None:
    # The mode an attempt was judged in: forward only or forward plus backward, and the
    # dtype. Rows from before were all forward-only float32.
    attempts = db["attempts"]
    if "grad" not in attempts.columns_dict:
        attempts.add_column("grad", int, not_null_default=0)
    if "dtype" not in attempts.columns_dict:
        attempts.add_column("dtype", str, not_null_default="float32")


@migration
def m008_run_kind(db: sqlite_utils.Database) -> None:
    # A run is a batch (`kgen run`) or one `kgen eval`: eval results are kept out of the
    # leaderboard, report and library unless asked for. Eval runs from before were noted as such.
    runs = db["runs"]
    if "kind" not in runs.columns_dict:
        runs.add_column("kind", str, not_null_default="batch")
        db.execute("UPDATE runs SET kind = 'eval' WHERE note LIKE 'kgen eval %'")


@migration
def m009_kernelbench(db: sqlite_utils.Database) -> None:
    # The KernelBench level and problem id of an attempt's task (pipeline/run/kernelbench.py), so
    # metrics go per level and a result maps onto KernelBench's own tables. NULL: a task from a plain
    # folder, or an attempt stored before this migration.
    attempts = db["attempts"]
    for column in ("level", "problem"):
        if column not in attempts.columns_dict:
            attempts.add_column(column, int)
    attempts.create_index(["level", "problem"], if_not_exists=True)


@migration
def m010_own_fraction(db: sqlite_utils.Database) -> None:
    # The share of a correct attempt's call in the candidate's own kernels, from the child's profile
    # (at KernelBench's levels 2 and 3 a candidate may keep a convolution or GEMM in
    # PyTorch, so that share is recorded rather than library calls forbidden). A claim, as the
    # profile's flags are. NULL: not profiled, not correct, or stored before this migration.
    if "own_fraction" not in db["attempts"].columns_dict:
        db["attempts"].add_column("own_fraction", float)


@migration
def m011_unjudged(db: sqlite_utils.Database) -> None:
    # Attempts a run could not judge (its reference process failed, say): not attempts, since a
    # resume judges them again, but their reason is kept where a user looks, also when the run is
    # cut short before its end says it (an H100 sweep's task that ran its reference out of memory
    # was only "not judged" in the database).
    db["unjudged"].create({"id": int, "run_id": str, "task": str, "model": str, "sample": int, "backend": str,
                           "turn": int, "generation": int, "error": str, "created_utc": str}, pk="id",
                          if_not_exists=True)
    db["unjudged"].create_index(["run_id"], if_not_exists=True)
