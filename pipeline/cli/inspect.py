"""`kgen best`, `kgen export` and `kgen report`: reading results back out of the database.

    kgen best --task mse --json
    kgen export --format csv --output attempts.csv --verdict correct
    kgen export --best dist/kgen-kernels
    kgen report --output report.html --run latest

Registered on the `main` group in cli.py; everything here only reads the database, which each
command finds the same way (-c/--config, --db: pipeline.cli.options). `kgen eval` results are left out
unless --evals (or --run naming their run) asks for them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import click

from .options import check_filters, console, database_options, nothing_matched, open_store, resolve_run
from .tables import best_table

evals_option = click.option("--evals", is_flag=True, help="Also `kgen eval` results (kept apart from batch runs).")

BEST_KEYS = ("task", "level", "problem", "backend", "device", "size", "time_ms", "eager_ms", "compile_ms", "floor_ms",
             "speedup_eager", "speedup_compile", "floor_fraction", "model", "run", "attempt", "code_hash",
             "torch_version", "cuda_version", "turn", "generation")


def _store(db: str):
    # Never creates a database: a typo in --db must not look like "no results".
    return open_store(db)


def _run_id(store, run_id: str | None, evals: bool = False) -> str | None:
    return resolve_run(store, run_id, evals)


def _fmt(value: Any, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


@click.command()
@database_options
@click.option("--task", default=None, help="Only this task.")
@click.option("--backend", type=click.Choice(["cuda", "triton", "cpu"]), default=None, help="Only this backend.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--wide", is_flag=True, help="Every column (time, floor fraction, model, found at, run).")
@click.option("-p", "--fast-p", "ps", type=click.FloatRange(min=0), multiple=True, default=(2.0,), show_default=True,
              help="A p for fast_p (repeat for more); fast_0 and fast_1 are always given.")
@click.option("--metrics", "metrics_only", is_flag=True,
              help="Only the per-level metrics (with --json: one object per level).")
def best(db: str, task: str | None, backend: str | None, as_json: bool, wide: bool, ps: tuple[float, ...],
         metrics_only: bool) -> None:
    """The best verified attempt (correct, no flags, trusted) per task, backend, device, size, dtype
    and mode: the highest speedup over eager, timed side by side (ties: lower time, then earlier
    attempt); the run summary, report, export and library use the same rule. Then KernelBench's
    metrics per level, each task counted once by its best verified kernel:

    \b
    speedup: the baseline's time over the kernel's, timed side by side.
    fast_0: the share of the level's tasks with a correct kernel.
    fast_1: the share correct and faster than eager (speedup over eager above 1).
    fast_p: the share correct with a speedup over eager above p (-p).
    geomean: the geometric mean speedup of the correct kernels only (tasks without one left out),
    over eager and over torch.compile.

    A level's tasks are those with any stored attempt (of the chosen backend); "correct" is
    verified: correct with no flag, trusted, timed on a fit device."""
    from ..report.kbmetrics import level_metrics
    from ..leaderboard import best_rows, faster, p75_of
    from .tables import metrics_table

    with _store(db) as store:
        check_filters(store, db, task=task)
        every = [r for r in store.attempts(task=task) if backend in (None, r["backend"])]
        rows = [r for r in every if r["verdict"] == "correct"]
        board = best_rows(rows)
        p75 = p75_of(store, [r["id"] for r in board])
        why = None if board else why_none(store, every)
    groups = level_metrics(every, tuple(dict.fromkeys(ps)))
    if metrics_only:
        if as_json:
            for g in groups:
                click.echo(json.dumps(g))
        elif groups:
            console(wide).print(metrics_table(groups, wide))
        else:
            click.echo("No attempt" + (f" for task {task}" if task else "") + (f": {why}." if why else "."))
        return
    # Verified faster than eager / torch.compile by the library's rule (leaderboard.faster): the
    # best kernel may still be slower than either, and then the library runs the reference.
    beats = {r["id"]: (faster(r["time_ms"], p75.get(r["id"]), r["eager_ms"]),
                       faster(r["time_ms"], p75.get(r["id"]), r["compile_ms"])) for r in board}
    if not board:  # why not, and what to run (on stderr where stdout is JSON lines)
        click.echo("No verified attempt" + (f" for task {task}" if task else "") + (f": {why}." if why else "."),
                   err=as_json)
        return
    if as_json:
        for r in board:
            click.echo(json.dumps({**{k: r["id"] if k == "attempt" else r.get(k) for k in BEST_KEYS},
                                   "beats_eager": beats[r["id"]][0], "beats_compile": beats[r["id"]][1]}))
        return
    out = console(wide)
    out.print(best_table(board, beats, wide))
    out.print(metrics_table(groups, wide))


def why_none(store, rows: list[dict[str, Any]]) -> str | None:
    """Why none of `rows` (batch attempts) is verified, and what to run (leaderboard.none_verified);
    where there are none, whether the database holds only `kgen eval` results."""
    from ..leaderboard import none_verified

    if rows:
        return none_verified(rows)
    if store.attempts(limit=1):
        return None  # the filters match nothing: the line names them
    if store.attempts(limit=1, evals=True):
        return ("only `kgen eval` results are stored, which it leaves out (`kgen attempts --evals` lists "
                "them); `kgen run` makes a batch")
    return "no attempts are stored; `kgen run` makes some"


def _columns(store) -> list[str]:
    # The table's own column order (what Store.attempts returns, less its hidden columns, plus the
    # "run" alias), so an export with no rows still has a header.
    hidden = {"result_json", "detail", "messages_json", "feedback"}
    return [c.name for c in store.db["attempts"].columns if c.name not in hidden] + ["run"]


@click.command()
@database_options
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True)
@click.option("-o", "--output", default="-", show_default=True, help="A file, or - for stdout.")
@click.option("--run", "run_id", default=None, help="Only this run (an id; 'latest' for the newest batch run).")
@click.option("--verdict", default=None, help="Only this verdict (correct, mismatch, build_failed, ...).")
@evals_option
@click.option("--best", "best_dir", default=None, type=click.Path(file_okay=False),
              help="Instead: write the best verified kernels as a self-contained, hash-locked package here.")
@click.option("--generated", default=None,
              help="Where generated code lives (read by --best) [default: the config's generated_dir].")
def export(db: str, config: str | None, fmt: str, output: str, run_id: str | None, verdict: str | None,
           evals: bool, best_dir: str | None, generated: str | None) -> None:
    """Write stored attempts as JSONL or CSV, or (--best DIR) the best kernels as a package."""
    from .options import load

    if best_dir is not None:
        cfg = load(config)
        _export_best(db, best_dir, generated or str(cfg.path(cfg.generated_dir) if cfg else "generated"))
        return
    with _store(db) as store:
        check_filters(store, db, verdict=verdict)
        run_id = _run_id(store, run_id, evals)
        rows = store.attempts(run=run_id, verdict=verdict, evals=evals)
        columns = _columns(store)
    if not rows:  # the file (or stdout) still gets what an empty export is: nothing, or a CSV header
        click.echo(nothing_matched("attempts", {"run": run_id, "verdict": verdict, "database": db}), err=True)
    with click.open_file(output, "w") as f:
        if fmt == "jsonl":
            for r in rows:
                f.write(json.dumps({c: r.get(c) for c in columns}) + "\n")
        else:
            writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
            writer.writeheader()
            for r in rows:
                writer.writerow({c: ",".join(r[c]) if c == "flags" else r.get(c) for c in columns})
    if output != "-":
        click.echo(f"wrote {len(rows)} attempts to {output}", err=True)


def _export_best(db: str, out_dir: str, generated: str) -> None:
    from ..library.kernels import LibraryError
    from ..library.export import export_best

    if not Path(db).is_file():
        raise click.ClickException(f"{db}: no database (run `kgen run` first, or pass --db)")
    try:
        manifest = export_best(db, out_dir, generated_dir=generated)
    except LibraryError as exc:
        raise click.ClickException(str(exc)) from None
    for task, kernels in sorted(manifest.tasks.items()):
        for k in kernels:  # every one beats eager; the library runs it under torch.compile only if it beats that
            compiled = "" if k.beats_compile is not False else " (eager calls only: not faster than torch.compile)"
            click.echo(f"{task}: {k.code_hash} x{_fmt(k.speedup_eager)} eager, x{_fmt(k.speedup_compile)} compile"
                       f"{compiled} on {k.device} (torch {k.torch_version})")
    for line in manifest.skipped:
        click.echo(f"skipped {line}", err=True)
    click.echo(f"wrote {sum(map(len, manifest.tasks.values()))} kernels to {out_dir}")


@click.command()
@database_options
@click.option("-o", "--output", default=None, help="The file to write [default: report.html, or report.json].")
@click.option("--run", "run_id", default=None, help="Only this run (an id; 'latest' for the newest batch run).")
@click.option("--json", "as_json", is_flag=True,
              help="Write the numbers as JSON instead: per-level metrics, each task's best kernel, verdicts.")
@evals_option
def report(db: str, output: str | None, run_id: str | None, as_json: bool, evals: bool) -> None:
    """Write a self-contained HTML report: KernelBench's metrics per level (fast_0, fast_1, fast_p,
    geometric-mean speedups; `kgen best --help` defines them) and how speedups are spread, the best
    kernels, every task's attempts, outcomes per model, fast_p curves."""
    from ..report.page import render, report_json

    with _store(db) as store:
        run_id = _run_id(store, run_id, evals)
        rows = store.attempts(run=run_id, evals=evals)
        only_evals = not rows and not evals and run_id is None and bool(store.attempts(limit=1, evals=True))
    if not rows:
        click.echo(nothing_matched("attempts", {"run": run_id, "database": db}).rstrip(".")
                   + ("; only `kgen eval` results are stored, which `kgen report --evals` includes" if only_evals
                      else "") + "; no report written.")
        return
    output = output or ("report.json" if as_json else "report.html")
    text = (json.dumps(report_json(rows, source=db, run=run_id), indent=1) + "\n" if as_json
            else render(rows, source=db, run=run_id))
    try:  # into a folder that is not there yet: it is made
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text)
    except OSError as exc:
        raise click.ClickException(f"{output}: cannot write the report ({exc.strerror or exc})") from None
    click.echo(f"wrote {output}: {len(rows)} attempts, {len({r['task'] for r in rows})} tasks")
