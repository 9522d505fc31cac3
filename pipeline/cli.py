"""kgen: generate GPU kernels with language models, and keep only the speedups that are real.

    kgen run                      # the batch in config.yaml
    kgen attempts --verdict correct --json
    kgen show 01JF...             # prompt, completion, code, build log, verdict detail
    kgen eval my_kernel.py --task mse --backend cpu --size small
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .config import Config, ConfigError, load_config
from .records import EvalResult

# Piped output (CI logs, files) gets a wide console so tables are not folded into slivers.
console = Console(width=None if sys.stdout.isatty() else 200)


class KgenError(click.ClickException):
    """A user error shown as one line, without a traceback."""

    def show(self, file=None) -> None:
        click.echo(f"Error: {self.message}", err=True)


def _config(path: str) -> Config:
    try:
        return load_config(path)
    except ConfigError as exc:
        raise KgenError(str(exc)) from None


def _database(db: str | None, config: str) -> Path:
    if db:
        return Path(db)
    if Path(config).is_file():
        cfg = _config(config)
        return cfg.path(cfg.database)
    return Path("db/kgen.db")


def _store(db: str | None, config: str, must_exist: bool = True):
    from .store import Store, StoreError

    path = _database(db, config)
    if must_exist and not path.exists():
        raise KgenError(f"{path}: no database yet (run `kgen run` first, or pass --db)")
    try:
        return Store.open(path)
    except StoreError as exc:
        raise KgenError(str(exc)) from None


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kgen")
def main() -> None:
    """Generate kernels with language models; build, verify and time them; keep what is real."""


config_option = click.option("-c", "--config", default="config.yaml", show_default=True,
                             help="The config file.")
db_option = click.option("--db", default=None, help="The SQLite database (default: the config's).")


@main.command()
@config_option
@click.option("--backend", type=click.Choice(["cuda", "triton", "cpu", "auto"]), default=None,
              help="Override the config's backend.")
@click.option("--new", "fresh", is_flag=True, help="Start a new run instead of resuming the same plan.")
@click.option("--retry-errors", is_flag=True, help="Redo slots whose model call failed.")
def run(config: str, backend: str | None, fresh: bool, retry_errors: bool) -> None:
    """Run the batch in the config: resume it if the same plan ran before."""
    from .backends import BackendError
    from .child.tasks import TaskError
    from .llm import ProviderError
    from .progress import Progress
    from .run import Runner

    cfg = _config(config)
    _check_sizes(cfg)
    store = _store(None, config, must_exist=False)
    try:
        progress = Progress(console)
        runner = Runner(cfg, store, backend=backend, on_event=progress.event)
    except (ProviderError, TaskError, BackendError) as exc:
        raise KgenError(str(exc)) from None
    with progress:
        run_id = asyncio.run(runner.run(fresh=fresh, retry_errors=retry_errors))
    summary_table(store, run_id, runner.backend)


def _check_sizes(cfg: Config) -> None:
    """Every chosen task has the config's size: one line naming the task otherwise, before the run
    opens its database or starts anything."""
    from .child import tasks

    try:
        for task in tasks.discover(cfg.path(cfg.tasks.directory), cfg.tasks.names):
            tasks.check_size(task, cfg.tasks.size)
    except tasks.TaskError as exc:
        raise KgenError(str(exc)) from None


WRONG = {"mismatch", "wrong_shape", "wrong_dtype", "wrong_type", "non_finite", "inputs_mutated",
         "no_gradient", "missing_gradient", "wrong_gradient",
         "nondeterministic", "impossible_timing"}


def summary_table(store, run_id: str, backend: str) -> None:
    """Per task and model: outcomes, fast_1 (correct and faster than eager), fast_compile, best speedups."""
    rows = store.attempts(run=run_id)
    verdicts: dict[tuple[str, str], dict[str, int]] = {}
    floors: dict[tuple[str, str], float] = {}
    for r in rows:
        counts = verdicts.setdefault((r["task"], r["model"]), {})
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
        if r["verdict"] == "correct" and not r["flags"] and r["floor_fraction"]:
            key = (r["task"], r["model"])
            floors[key] = max(floors.get(key, 0.0), r["floor_fraction"])
    table = Table(title=f"run {run_id} ({backend})")
    for col in ("task", "model", "n", "compiled", "correct", "wrong", "failed", "fast_1", "fast_compile",
                "best x eager", "best x compile", "best floor frac", "verdicts"):
        table.add_column(col, justify="left" if col in ("task", "model", "verdicts") else "right")
    for s in store.run_summary(run_id):
        key = (s["task"], s["model"])
        counts = verdicts.get(key, {})
        wrong = sum(n for v, n in counts.items() if v in WRONG)
        n = s["attempts"]
        table.add_row(s["task"], s["model"], str(n), f"{100 * s['compiled'] / n:.0f}%",
                      f"{100 * s['correct'] / n:.0f}%", str(wrong), str(n - s["correct"] - wrong),
                      str(s["fast_1"]), str(s["fast_compile"]), _fmt(s["best_speedup_eager"]),
                      _fmt(s["best_speedup_compile"]), _fmt(floors.get(key)),
                      ", ".join(f"{v} {c}" for v, c in sorted(counts.items())))
    console.print(table)
    tokens, usd = store.run_spending(run_id)
    status = (store.get_run(run_id) or {}).get("status")
    console.print(f"model usage this run: {tokens} tokens, ${usd:.4f}"
                  + ("  (budget reached: the remaining slots were not started)" if status == "budget_reached" else ""))


@main.command()
@config_option
@db_option
@click.option("--run", "run_id", default=None, help="Only this run (an id; 'latest' for the newest).")
@click.option("--task", default=None, help="Only this task.")
@click.option("--model", default=None, help="Only this model.")
@click.option("--verdict", default=None, help="Only this verdict (correct, mismatch, build_failed, ...).")
@click.option("--flag", default=None, help="Only attempts with this flag (no_custom_kernel, shape_specialized).")
@click.option("--turn", type=click.IntRange(min=1), default=None,
              help="Only this turn of a search's conversations (1 is the first answer).")
@click.option("-n", "--limit", type=int, default=None, help="At most this many, newest first.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def attempts(config, db, run_id, task, model, verdict, flag, turn, limit, as_json) -> None:
    """List stored attempts, newest first."""
    store = _store(db, config)
    if run_id == "latest":
        run_id = store.latest_run_id()
    rows = store.attempts(run=run_id, task=task, model=model, verdict=verdict, flag=flag, limit=limit,
                          turn=None if turn is None else turn - 1)
    keys = ("id", "run", "task", "model", "sample", "backend", "turn", "generation", "verdict", "flags", "error",
            "time_ms", "eager_ms", "compile_ms", "floor_ms", "speedup_eager", "speedup_compile", "floor_fraction",
            "code_hash")
    if as_json:
        for r in rows:
            click.echo(json.dumps({k: r.get(k) for k in keys}))
        return
    table = Table()
    for col in ("id", "task", "model", "sample", "turn", "backend", "verdict", "flags", "time ms", "x eager",
                "x compile", "error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        turn_text = f"{r['turn'] + 1}" + (f" (gen {r['generation']})" if r["generation"] else "")
        table.add_row(r["id"], r["task"], r["model"], str(r["sample"]), turn_text, r["backend"], r["verdict"],
                      ",".join(r["flags"]), _fmt(r["time_ms"]), _fmt(r["speedup_eager"]),
                      _fmt(r["speedup_compile"]), Text((r["error"] or "")[:80]))  # a candidate's words: literal
    console.print(table)


@main.command()
@click.argument("attempt_id")
@config_option
@db_option
@click.option("--full", is_flag=True, help="Do not fold the reasoning or cut long logs.")
def show(attempt_id: str, config: str, db: str | None, full: bool) -> None:
    """Show one attempt: prompt, completion, code, build log and verdict detail."""
    from .store import StoreError

    store = _store(db, config)
    try:
        a = store.attempt(attempt_id)
    except StoreError as exc:
        raise KgenError(str(exc)) from None
    if a is None:
        raise KgenError(f"no attempt with id {attempt_id}")
    generated = _generated_dir(config)
    code = (generated / f"{a['code_hash']}.py") if a.get("code_hash") else None
    from .show import render_attempt

    render_attempt(console, a, code.read_text() if code and code.exists() else None, full, store.chain(a["id"]))


def _generated_dir(config: str) -> Path:
    if Path(config).is_file():
        cfg = _config(config)
        return cfg.path(cfg.generated_dir)
    return Path("generated")


@main.command(name="eval")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--task", "task_name", required=True, help="A task name in the task folder, or a task file path.")
@click.option("--backend", type=click.Choice(["cuda", "triton", "cpu", "auto"]), default="auto", show_default=True)
@click.option("--size", default=None, help="A size the task declares (small, odd, default); default: the config's.")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--no-store", is_flag=True, help="Do not record the result in the database.")
@click.option("--grad/--no-grad", default=None, help="Judge forward plus backward (default: the config's evaluation.grad).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None,
              help="Cast inputs and weights to this dtype (default: the config's evaluation.dtype).")
def eval_command(path, task_name, backend, size, config, as_json, no_store, grad, dtype) -> None:
    """Evaluate one candidate file written anywhere, and print (and store) its verdict."""
    from .evalone import evaluate_file

    cfg = _config(config) if Path(config).is_file() else None
    sized: dict[str, Any] = {}
    try:
        result, attempt_id = evaluate_file(Path(path), task_name, backend, size, cfg, store=not no_store,
                                           on_size=lambda name, dims: sized.update(size=name, size_dims=dims),
                                           notice=lambda line: click.echo(line, err=True), grad=grad, dtype=dtype)
    except ValueError as exc:  # tasks.SizeError among them: a size the task lacks, or too big to fit
        raise KgenError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(eval_json(result, attempt_id, sized)))
    else:
        _print_result(result, attempt_id, sized)
    sys.exit(0 if result.verdict.value == "correct" else 1)


def eval_json(result: EvalResult, attempt_id: str | None, sized: dict[str, Any] | None = None) -> dict[str, Any]:
    """The verdict's fields; with `sized`, also the size that ran (`size`) and its `size_dims`."""
    from .records import summary_fields

    out = summary_fields(result)
    out["flags"] = [f.value for f in result.flags]
    out["id"] = attempt_id
    out["device"] = result.device
    out["trials"] = [t.model_dump(mode="json") for t in result.trials]
    out.update(sized or {})
    return out


def _print_result(result: EvalResult, attempt_id: str | None, sized: dict[str, Any] | None = None) -> None:
    data = eval_json(result, attempt_id, sized)
    colour = "green" if result.verdict.value == "correct" else "red"
    console.print(f"[bold {colour}]{result.verdict.value}[/]" + (f"  flags: {', '.join(data['flags'])}"
                                                                  if data["flags"] else ""))
    if result.error:
        console.print(f"error: {result.error}", markup=False)
    if result.device_unfit:
        console.print(f"device not fit to time: {result.device_unfit} (timing not trusted)", markup=False)
    if sized:
        dims = ", ".join(f"{k}={v}" for k, v in sized["size_dims"].items())
        console.print(f"{'size':>16}: {sized['size']}" + (f"  ({dims})" if dims else ""), markup=False)
    for key in ("time_ms", "eager_ms", "compile_ms", "floor_ms", "speedup_eager", "speedup_compile",
                "floor_fraction"):
        console.print(f"{key:>16}: {_fmt(data[key], 4)}")
    if attempt_id:
        console.print(f"stored as attempt {attempt_id}")


def _register_inspection() -> None:
    from . import inspect_cli

    for command in (inspect_cli.best, inspect_cli.export, inspect_cli.report):
        main.add_command(command)


_register_inspection()

if __name__ == "__main__":
    main()
