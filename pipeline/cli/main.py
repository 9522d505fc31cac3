"""kgen: generate GPU kernels with language models, and keep only the speedups that are real.

    kgen run                      # the batch in config.yaml
    kgen attempts --verdict correct --json
    kgen show 01JF...             # prompt, completion, code, build log, verdict detail
    kgen eval prompts/examples/cpu_model_new.py --task prompts/examples/model.py --backend cpu
    kgen serve                    # keep a warm evaluator: later `kgen eval`s take seconds

Every command that reads or writes the database takes -c/--config and --db (pipeline.cli.options).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from ..config import Config
from ..records import EvalResult, FileRequest
from .options import KgenError, check_filters, console, database_options, load, nothing_matched, open_store, resolve_run
from .plain import visible
from .tables import fmt as _fmt, short_error


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kgen")
def main() -> None:
    """Generate kernels with language models; build, verify and time them; keep what is real.

    Every command that reads or writes the database takes -c/--config (default ./config.yaml) and
    --db (default: the config's database)."""


def _config(config: str | None) -> Config:
    cfg = load(config)
    if cfg is None:
        raise KgenError("no config file: ./config.yaml is missing (pass -c FILE)")
    return cfg


@main.command()
@database_options
@click.option("--backend", type=click.Choice(["cuda", "triton", "cpu", "auto"]), default=None,
              help="Override the config's backend.")
@click.option("--new", "fresh", is_flag=True, help="Start a new run instead of resuming the same plan.")
@click.option("--retry-errors", is_flag=True, help="Redo slots whose model call failed.")
@click.option("--wide", is_flag=True, help="Every column in the summary table.")
@click.option("--demo", is_flag=True, help="Run the bundled demo (recorded completions, the seven loss tasks, "
              "small sizes) from any folder, storing into the database here.")
@click.option("--force", is_flag=True, help="Run even where another `kgen run` is running on the same database "
              "(each then does the same work).")
def run(config: str | None, db: str, backend: str | None, fresh: bool, retry_errors: bool, wide: bool,
        demo: bool, force: bool) -> None:
    """Run the batch in the config: resume it if the same plan ran before. Ctrl-C stops it (exit 130;
    SIGTERM: 143) and says the command that resumes it. A run that ends with failed model calls
    says how many and the command that redoes them, and exits 3. Where another `kgen run` is running
    on the same database, one line names it and nothing runs (--force runs beside it)."""
    from ..backends import BackendError
    from ..child.tasks import TaskError
    from ..generate.llm import ProviderError
    from .progress import Progress
    from ..run.batch import Runner, RunFailed
    from ..run.events import RunStart
    from ..store.runlock import RunBusy, RunLock
    from .tables import run_summary

    cfg = _demo_config(config, db) if demo else _config(config)
    _check_sizes(cfg)
    lock = RunLock(Path(db))
    if not force:  # one run per database: a second would do every slot again (pipeline.store.runlock)
        try:
            lock.acquire()
        except RunBusy as exc:
            raise KgenError(str(exc)) from None
        click.get_current_context().call_on_close(lock.release)
    store = open_store(db, must_exist=False)
    out = console(wide)

    def on_event(event) -> None:
        if isinstance(event, RunStart):
            lock.note(event.run_id)  # what a second `kgen run` is told
        progress.event(event)

    try:
        progress = Progress(out)
        runner = Runner(cfg, store, backend=backend, on_event=on_event)
    except (ProviderError, TaskError, BackendError) as exc:
        raise KgenError(str(exc)) from None
    failed = None
    main_thread = threading.current_thread() is threading.main_thread()  # where a signal handler may be set
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None  # SIGTERM ends it as Ctrl-C does
    try:
        with progress:
            run_id = _run_loop(runner.run(fresh=fresh, retry_errors=retry_errors))
    except TaskError as exc:  # a task that cannot run here (a size too big for the device, say)
        raise KgenError(f"{exc} (the run's other attempts are stored; it is marked failed)") from None
    except RunFailed as exc:  # the summary of what is stored, then one line
        failed, run_id = exc, exc.run_id
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: what is stored stays; the same command resumes the run
        if getattr(runner, "run_id", None):
            store.finish_run(runner.run_id, "interrupted")
        resume = _resume_command(config, db, backend, retry_errors, demo)
        for stream in (sys.stdout, sys.stderr):  # stdout may be a pipe whose reader is gone (`| tee`)
            try:
                stream.flush()
            except OSError:
                pass
        click.echo(f"Interrupted: the attempts so far are stored; resume with: {resume}", err=True)
        # Now, not after the builds and evaluations under way: their worker threads wait on sandboxed
        # children (in sessions of their own, so the terminal's SIGINT missed them), which die with
        # this process (PR_SET_PDEATHSIG); a normal exit would join those threads first (35 s and more).
        os._exit(143 if isinstance(exc, Terminated) else 130)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    for part in run_summary(store, run_id, runner.backend, wide):
        out.print(part)
    if runner.failed_calls:
        n, redo = len(runner.failed_calls), _resume_command(config, db, backend, True, demo)
        click.echo(f"{n} model call{'s' if n != 1 else ''} failed (first: {short_error(runner.failed_calls[0])}); "
                   f"{redo} redoes {'them' if n != 1 else 'it'}", err=True)
    if failed is not None:
        resume = _resume_command(config, db, backend, retry_errors, demo)
        raise KgenError(f"{failed}; the others are stored and the run is marked failed; judge what is left "
                        f"with: {resume}")
    if runner.failed_calls:
        sys.exit(MODEL_ERRORS_EXIT)


MODEL_ERRORS_EXIT = 3  # `kgen run` ended with failed model calls stored (the run's status: model_errors)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so that both end a run the same way."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated()


def _run_loop(coro):
    """asyncio.run without its Ctrl-C handling: that cancels the run's tasks and waits for them and for
    the executor's threads (a build under way, a whole run where a task swallowed the cancellation);
    here SIGINT raises KeyboardInterrupt in this thread at once, as it does outside asyncio."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(coro)
    except KeyboardInterrupt:  # the loop is left as it is: `run` exits at once
        loop = None
        raise
    finally:
        if loop is not None:  # as asyncio.run ends
            try:
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()


def _demo_config(config: str | None, db: str) -> Config:
    """The bundled demo's config (pipeline.bundled): its tasks, prompts and recorded completions read
    where kgen is installed; the database, generated code and builds go where this folder's commands
    look for them (--db or ./config.yaml's, else db/, generated/ and builds/ here)."""
    from .. import bundled

    here = load(config)
    demo = load(str(bundled.path(bundled.DEMO_CONFIG)))
    return demo.model_copy(update={
        "database": str(Path(db).resolve()),
        "generated_dir": str((here.path(here.generated_dir) if here else Path("generated")).resolve()),
        "build_dir": str((here.path(here.build_dir) if here else Path("builds")).resolve())})


def _resume_command(config: str | None, db: str, backend: str | None, retry_errors: bool, demo: bool) -> str:
    """The `kgen run` that resumes this one: the same config, database and backend, without --new."""
    import shlex

    from .options import DEFAULT_CONFIG, find_database

    words = ["kgen", "run"] + (["--demo"] if demo else [])
    if config and config != DEFAULT_CONFIG:
        words += ["-c", config]
    if str(find_database(None, config)) != db:
        words += ["--db", db]
    words += (["--backend", backend] if backend else []) + (["--retry-errors"] if retry_errors else [])
    return shlex.join(words)


def _check_sizes(cfg: Config) -> None:
    """Every chosen task has the config's size: one line naming the task otherwise, before the run
    opens its database or starts anything."""
    from ..child import tasks
    from ..config import ConfigError
    from ..run.kernelbench import select_tasks

    try:
        for task in select_tasks(cfg):
            tasks.check_size(task, cfg.tasks.size)
    except (tasks.TaskError, ConfigError) as exc:
        raise KgenError(str(exc)) from None


@main.command()
@database_options
@click.option("--run", "run_id", default=None, help="Only this run (an id; 'latest' for the newest batch run).")
@click.option("--task", default=None, help="Only this task.")
@click.option("--model", default=None, help="Only this model.")
@click.option("--verdict", default=None, help="Only this verdict (correct, mismatch, build_failed, ...).")
@click.option("--flag", default=None, help="Only attempts with this flag (no_custom_kernel, shape_specialized).")
@click.option("--turn", type=click.IntRange(min=1), default=None,
              help="Only this turn of a search's conversations (1 is the first answer).")
@click.option("--evals", is_flag=True, help="Also `kgen eval` results (kept apart from batch runs).")
@click.option("-n", "--limit", type=click.IntRange(min=1), default=None, help="At most this many, newest first.")
@click.option("--wide", is_flag=True, help="Every column (sample, turn, backend, size, flags, times).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def attempts(db, run_id, task, model, verdict, flag, turn, evals, limit, wide, as_json) -> None:
    """List stored attempts, newest first (id, task, model, verdict, speedup over eager, error)."""
    from .tables import attempts_table, unjudged_line

    with open_store(db) as store:
        check_filters(store, db, task=task, model=model, verdict=verdict, flag=flag)
        run_id = resolve_run(store, run_id, evals)
        rows = store.attempts(run=run_id, task=task, model=model, verdict=verdict, flag=flag, limit=limit,
                              turn=None if turn is None else turn - 1, evals=evals)
        unjudged = unjudged_line(store, run_id)  # a run's, where one is asked for
    from ..leaderboard import none_verified, not_verified_reason

    keys = ("id", "run", "task", "model", "sample", "backend", "turn", "generation", "verdict", "flags", "error",
            "time_ms", "eager_ms", "compile_ms", "floor_ms", "speedup_eager", "speedup_compile", "floor_fraction",
            "code_hash", "device_unfit", "trusted")
    if not rows:
        filters = {"run": run_id, "task": task, "model": model, "verdict": verdict, "flag": flag, "turn": turn,
                   "database": db}
        click.echo(nothing_matched("attempts", filters), err=as_json)  # --json: stdout stays JSON lines
        if unjudged is not None and not as_json:
            console().print(unjudged)
        return
    if as_json:  # not_verified: why a correct attempt is not verified ("unfit: ...", "flagged: ..."), else null
        for r in rows:
            click.echo(json.dumps({**{k: r.get(k) for k in keys}, "not_verified": not_verified_reason(r)}))
        return
    out = console(wide)
    out.print(attempts_table(rows, wide))
    if any(not_verified_reason(r) for r in rows):  # how many correct ones are not, why, and what to run
        out.print(Text(visible(none_verified(rows)), style="yellow"))
    if unjudged is not None:
        out.print(unjudged)
    calls = sum(r["verdict"] == "model_error" for r in rows)
    if calls:
        click.echo(f"{calls} of these {'are failed model calls' if calls != 1 else 'is a failed model call'}: the "
                   "`kgen run` that made the run, with --retry-errors, asks again", err=True)


@main.command()
@click.argument("attempt_id")
@database_options
@click.option("--full", is_flag=True, help="Do not fold the reasoning or cut long logs.")
def show(attempt_id: str, config: str | None, db: str, full: bool) -> None:
    """Show one attempt: its compiler errors first, then prompt, completion, code, build log and verdict.

    ATTEMPT_ID is an id from `kgen attempts` (a unique prefix will do), or 'latest' for the newest."""
    from .show import render_attempt
    from ..store.store import StoreError

    with open_store(db) as store:
        if attempt_id == "latest":
            newest = store.attempts(limit=1, evals=True)
            if not newest:
                raise KgenError(f"{db} holds no attempts yet")
            attempt_id = newest[0]["id"]
        try:
            a = store.attempt(attempt_id)
        except StoreError as exc:
            raise KgenError(str(exc)) from None
        if a is None:
            raise KgenError(f"no attempt with id {attempt_id} in {db}")
        chain = store.chain(a["id"])
    cfg = load(config)
    generated = cfg.path(cfg.generated_dir) if cfg else Path("generated")
    code = (generated / f"{a['code_hash']}.py") if a.get("code_hash") else None
    render_attempt(console(), a, code.read_text() if code and code.exists() else None, full, chain)


@main.command(name="eval")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--task", "task_name", required=True, help="A task name in the task folder, or a task file path.")
@click.option("--backend", type=click.Choice(["cuda", "triton", "cpu", "auto"]), default="auto", show_default=True)
@click.option("--size", default=None, help="A size the task declares (small, odd, default); default: the config's; "
              "with no config file, the bundled demo's for a bundled task, and for a task file the size it states "
              "(its KGEN_SIZES small, else the file as written).")
@database_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--no-store", is_flag=True, help="Do not record the result in the database.")
@click.option("--grad/--no-grad", default=None, help="Judge forward plus backward (default: the config's evaluation.grad).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None,
              help="Cast inputs and weights to this dtype (default: the config's evaluation.dtype).")
@click.option("--local", is_flag=True, help="Judge it in this process even where `kgen serve` is listening.")
def eval_command(path, task_name, backend, size, config, db, as_json, no_store, grad, dtype, local) -> None:
    """Evaluate one candidate file written anywhere, and print (and store) its verdict.

    Where `kgen serve` runs for the same database and config, it judges the file, warm (the task's
    reference process, baselines and the next child kept between evaluations); else this process does.
    The result is stored as a run of its own, kept apart from batch runs: `kgen best` and the
    library leave it out; `kgen attempts`, `export` and `report` include it with --evals (or --run
    naming its run). Exit 0 only if verified: correct, unflagged, trusted and timed on a fit device."""
    _check_source(path)
    sized: dict[str, Any] = {}
    echo = lambda line: click.echo(line, err=True)  # noqa: E731
    served = None if local else _ask_server(path, task_name, backend, size, config, db, no_store, grad, dtype, echo)
    if served is not None:
        result, attempt_id = served.result, served.attempt_id
        if served.size:
            sized = {"size": served.size, "size_dims": served.size_dims or {}}
    else:
        from ..run.single import evaluate_file

        if not no_store:  # a database that cannot be written is one line now, not after the build
            from ..store.store import StoreError, check_writable

            try:
                check_writable(Path(db))
            except StoreError as exc:
                raise KgenError(str(exc)) from None
        cfg = load(config)
        try:  # the size as `kgen serve` resolves it: pipeline.run.single.eval_size
            request = FileRequest(path=path, task=task_name, backend=backend, size=size, grad=grad, dtype=dtype,
                                  store=not no_store)
            result, attempt_id = evaluate_file(request, cfg, db_path=Path(db), notice=echo,
                                               on_size=lambda name, dims: sized.update(size=name, size_dims=dims))
        except ValueError as exc:  # sizes.SizeError among them: a size the task lacks, or too big to fit
            raise KgenError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(eval_json(result, attempt_id, sized)))
    else:
        _print_result(result, attempt_id, sized, db)
    sys.exit(0 if result.verdict.value == "correct" and not _not_verified(result) and not result.device_unfit else 1)


def _not_verified(result: EvalResult) -> str | None:
    """Why a correct result is not verified (flagged, or judged below the confinement required); None."""
    if result.flags:
        return "flagged " + ", ".join(f.value for f in result.flags)
    if not result.trusted:
        return result.untrusted_reason or "not trusted"
    return None


def _check_source(path: str) -> None:
    """A file that cannot compile, or binds no ModelNew, is one line naming the user's file (and line),
    here in a fraction of a second: judged, it would be built and loaded first, and its error would
    name the hashed copy under generated/. Any binding of the name counts (a class, an assignment,
    an import), so no file the evaluator could load is refused."""
    import ast

    try:
        text = Path(path).read_text()
        compile(text, path, "exec", dont_inherit=True)
    except UnicodeDecodeError as exc:
        raise KgenError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except SyntaxError as exc:
        shown = f": {visible(exc.text.strip())}" if exc.text and exc.text.strip() else ""  # model-written text
        raise KgenError(f"{path}:{exc.lineno}: {exc.msg}{shown}") from None
    except ValueError as exc:  # a NUL byte in the source
        raise KgenError(f"{path}: {exc}") from None
    for node in ast.walk(ast.parse(text, path)):
        if (getattr(node, "name", None) == "ModelNew"  # class, def
                or (isinstance(node, ast.Name) and node.id == "ModelNew" and isinstance(node.ctx, ast.Store))
                or (isinstance(node, ast.alias) and "ModelNew" in (node.asname, node.name.rsplit(".", 1)[-1], "*"))
                or (isinstance(node, ast.Constant) and node.value == "ModelNew")):  # globals()["ModelNew"] = ...
            return
    raise KgenError(f"{path}: defines no ModelNew (the nn.Module class kgen builds and judges)")


def _ask_server(path, task_name, backend, size, config, db, no_store, grad, dtype, echo):
    """The server's reply with a verdict, or None where this process judges the file itself."""
    from ..run.serve import ServerGone, ask

    if task_name.endswith(".py") or "/" in task_name:  # a task file: the server's folder is not ours
        task_name = str(Path(task_name).resolve())
    fields = dict(path=path, code=Path(path).read_text(), task=task_name, backend=backend, size=size, grad=grad,
                  dtype=dtype, store=not no_store)
    try:
        reply = ask(Path(db), config, fields, echo)
    except ServerGone as exc:
        raise KgenError(str(exc)) from None
    if reply is None:
        return None
    if reply.kind == "other_config":
        echo(f"kgen serve (pid {reply.server_pid}) is listening for {db}, but {reply.line}: judged here")
        return None
    if reply.kind == "error":
        raise KgenError(reply.line or "kgen serve could not judge it")
    echo(f"judged by kgen serve (pid {reply.server_pid})")
    return reply


@main.command()
@database_options
def serve(config: str | None, db: str) -> None:
    """Judge `kgen eval`'s candidates in one warm process, until Ctrl-C.

    The task's reference process (its compiler warm, its baselines measured) and the next
    candidate's child are kept between evaluations, as in a batch; `kgen eval` for the same database
    and config hands its file here. Only the user's own processes with the token this command writes
    under the kgen cache may ask (pipeline.run.serve)."""
    from ..run.serve import serve as run_server

    try:
        run_server(load(config), config, Path(db), lambda line: click.echo(visible(line)))
    except ValueError as exc:
        raise KgenError(str(exc)) from None


def eval_json(result: EvalResult, attempt_id: str | None, sized: dict[str, Any] | None = None) -> dict[str, Any]:
    """The verdict's fields; with `sized`, also the size that ran (`size`) and its `size_dims`."""
    from ..records import summary_fields

    out = summary_fields(result)
    out["flags"] = [f.value for f in result.flags]
    out["id"] = attempt_id
    out["device"] = result.device
    out["trials"] = [t.model_dump(mode="json") for t in result.trials]
    out["phases"] = result.phases  # seconds per stage: where an evaluation's wall went
    out.update(sized or {})
    return out


def _print_result(result: EvalResult, attempt_id: str | None, sized: dict[str, Any] | None = None,
                  db: str | None = None) -> None:
    data = eval_json(result, attempt_id, sized)
    out = console()
    colour = "green" if result.verdict.value == "correct" else "red"
    out.print(Text(result.verdict.value, style=f"bold {colour}")
              + Text(f"  flags: {', '.join(data['flags'])}" if data["flags"] else ""))
    if result.error:  # the candidate's or the compiler's words
        out.print(Text("error: " + visible(result.error)))
    if result.device_unfit:
        out.print(Text(f"not timed: the device was not fit to time it ({visible(result.device_unfit)}); "
                       "no figure until it is judged on a fit one"))
    elif result.verdict.value == "correct" and (why := _not_verified(result)):
        out.print(Text(f"not verified: {visible(why)}"))
    if sized:
        dims = ", ".join(f"{k}={v}" for k, v in sized["size_dims"].items())
        out.print(Text(f"{'size':>16}: {visible(sized['size'])}" + (f"  ({dims})" if dims else "")))
    for key in ("time_ms", "eager_ms", "compile_ms", "floor_ms", "speedup_eager", "speedup_compile",
                "floor_fraction"):
        out.print(Text(f"{key:>16}: {_fmt(data[key], 4)}"))
    if attempt_id:
        out.print(Text(f"stored as attempt {attempt_id} in {db}, an eval run kept apart from batch runs "
                       f"(kgen show {attempt_id}; kgen attempts, export and report list it with --evals)"))


def _register_inspection() -> None:
    from . import doctor, inspect as inspect_cli, kbcompare

    for command in (inspect_cli.best, inspect_cli.export, inspect_cli.report, kbcompare.kernelbench_baselines,
                    doctor.doctor):
        main.add_command(command)


_register_inspection()

if __name__ == "__main__":
    main()
