"""What every kgen command that touches the database shares: -c/--config, --db, and one way to find
the database from them.

    @click.command()
    @database_options
    def attempts(db: str, config: str | None, ...):   # db: the path to use; config: the file in use
        with open_store(db) as store: ...

The database is --db when given, else the config's `database` (relative to the config file), else
that of ./config.yaml, else db/kgen.db. A -c naming a file that does not exist is a one-line error,
never a silent fall back to another database.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console

from ..config import DEFAULT_CONFIG


class KgenError(click.ClickException):
    """A user error shown as one line, without a traceback."""

    def show(self, file=None) -> None:
        click.echo(f"Error: {self.message}", err=True)


class KgenUsageError(click.UsageError):
    """A bad option value, shown as one line (exit 2, as click's own usage errors), without the usage."""

    def show(self, file=None) -> None:
        click.echo(f"Error: {self.message}", err=True)


def check_filters(store, db: str, **given: Any) -> None:
    """Each filter given (task, model, verdict, flag; None: not given) names something that can match:
    a verdict or flag kgen has, a task or model the database holds. Otherwise one line listing the
    valid ones, so a typo never reads as "No attempts match"."""
    from ..records import Flag, Verdict

    for name, value in given.items():
        if value is None:
            continue
        if name in ("verdict", "flag"):
            valid, where = [v.value for v in (Verdict if name == "verdict" else Flag)], ""
        else:
            valid, where = store.names(name), f" in {db}"
        if value not in valid:
            shown = ", ".join(repr(v) for v in valid) if valid else "none yet"
            raise KgenUsageError(f"Invalid value for '--{name}': {value!r} is not a {name}{where} "
                                 f"(valid: {shown}).")


def config_file(config: str | None) -> str | None:
    """The config file in use (pipeline.config.config_file); a -c naming no file is one line."""
    from ..config import ConfigError, config_file as find

    try:
        return find(config)
    except ConfigError as exc:
        raise KgenError(str(exc)) from None


def load(config: str | None):
    """The parsed config, or None where no config file is in use; a bad file is one line."""
    from ..config import ConfigError, load_config

    if config is None:
        return None
    try:
        return load_config(config)
    except ConfigError as exc:
        raise KgenError(str(exc)) from None


def find_database(db: str | None, config: str | None) -> Path:
    """--db, else the config's database, else the default (pipeline.config.find_database, which the
    library asks too); a bad config is one line."""
    from ..config import ConfigError, find_database as find

    try:
        return find(db, config)
    except ConfigError as exc:
        raise KgenError(str(exc)) from None


def database_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add -c/--config and --db to a click command. The command gets `db`, the database's path (a
    str), and, if its signature takes one, `config`, the config file in use (None when none is)."""
    takes_config = "config" in inspect.signature(fn).parameters

    @functools.wraps(fn)
    def wrapper(*args: Any, config: str | None, db: str | None, **kwargs: Any) -> Any:
        path = str(find_database(db, config))
        if takes_config:
            kwargs["config"] = config_file(config)
        return fn(*args, db=path, **kwargs)

    wrapper = click.option("--db", default=None, type=click.Path(dir_okay=False),
                           help="The SQLite database [default: the config's `database`].")(wrapper)
    return click.option("-c", "--config", default=None, metavar="FILE",
                        help=f"The config file [default: ./{DEFAULT_CONFIG} where there is one].")(wrapper)


def open_store(db: str | Path, must_exist: bool = True):
    """The Store at `db`. Store.open would create an empty database: where the file is missing and
    `must_exist`, that is a one-line error instead, so a typo never looks like "no results"."""
    from ..store.store import Store, StoreError

    if must_exist and not Path(db).is_file():
        raise KgenError(f"{db}: no database (run `kgen run` first, or pass --db)")
    try:
        return Store.open(db, reader=must_exist)  # a command that only reads still can where it cannot write
    except StoreError as exc:
        raise KgenError(str(exc)) from None


def resolve_run(store, run_id: str | None, evals: bool = False) -> str | None:
    """`--run`: None, an id the database has, or 'latest' (the newest batch run; with `evals`, the
    newest run of either kind); anything else is a one-line error."""
    if run_id == "latest":
        latest = store.latest_run_id(evals=evals)
        if latest is None:
            raise KgenError("the database has no runs yet")
        return latest
    if run_id is not None and store.get_run(run_id) is None:
        raise KgenError(f"no run with id {run_id}")
    return run_id


def console(wide: bool = False) -> Console:
    """A console on the current stdout (made per command, so a test runner's capture is used). In a
    terminal, its width; piped, COLUMNS or 80, as rich does, since the default tables are made to fit
    80 columns; --wide piped gets room for every column instead of folding them into slivers."""
    out = Console()
    if wide and not out.is_terminal:
        out.width = max(out.width, 200)
    return out


def nothing_matched(what: str, filters: dict[str, Any]) -> str:
    """"No attempts match task mse, verdict correct." (or "... in db/kgen.db." when unfiltered)."""
    given = ", ".join(f"{k} {v}" for k, v in filters.items() if v is not None and k != "database")
    if given:
        return f"No {what} match {given}."
    return f"No {what} in {filters.get('database', 'the database')} yet."
