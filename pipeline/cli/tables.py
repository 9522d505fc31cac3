"""The tables `kgen attempts` and `kgen run` print, made to be read at 80 columns.

    console.print(attempts_table(store.attempts(run=run_id)))          # id, task, model, verdict, x eager, error
    console.print(attempts_table(rows, wide=True))                     # every column
    for part in run_summary(store, run_id, backend): console.print(part)

By default a table has few columns, no vertical rules, and a column whose value is the same in
every row (one task, one model) is named in the title instead. Ids and verdicts never wrap; only
the free text (errors, verdict counts) does, on word boundaries. `--wide` gives every column.
Every value that came from a model, a compiler or a candidate goes in through plain.literal.
"""

from __future__ import annotations

import re
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.padding import Padding
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from ..leaderboard import not_verified_reason
from .plain import literal, visible

WRONG = {"mismatch", "wrong_shape", "wrong_dtype", "wrong_type", "non_finite", "inputs_mutated",
         "no_gradient", "missing_gradient", "wrong_gradient",
         "nondeterministic", "impossible_timing"}

# "/tmp/kgen/builds/3f2a.../main.cpp:37:18: error: ..." -> "main.cpp:37:18: error: ...": the folders
# of an absolute path say nothing a reader needs and push the compiler's message out of the column.
_DIRS = re.compile(r"(?<![\w.~-])/(?:[^\s/:'\"()]+/)+")


def short_error(error: str | None, limit: int = 300, lines: int = 1) -> str:
    """An attempt's error for one cell or line: its first `lines` lines (an explained error's reason,
    its frame and its message: pipeline.generate.feedback.explain_error) joined with " | ", absolute
    paths cut to the file name, capped at `limit` characters."""
    if not error:
        return ""
    kept = [line.strip() for line in error.strip().splitlines() if line.strip()][:lines]
    return visible(_DIRS.sub("", " | ".join(kept)))[:limit]


ERROR_CELL = (1200, 12)  # characters and lines of an error in `kgen attempts` and `kgen show`'s header


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _table(title: str | None) -> Table:
    return Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
                 title_justify="left", collapse_padding=True)


def _constant(rows: list[dict[str, Any]], key: str) -> str | None:
    """The value every row has in `key`, where there is one (and more than nothing to say)."""
    values = {r.get(key) for r in rows}
    return str(next(iter(values))) if len(values) == 1 and rows else None


ERROR_ROOM = 40  # below this many columns for the error, it gets a line of its own under its row
NAME_MIN = 8  # a task or model name is cut (with "...") to no fewer characters than this
GAP = 2  # columns between two cells: padding (0, 1) on each side


def _name_widths(rows: list[dict[str, Any]], keys: list[str], room: int) -> dict[str, int]:
    """Widths for the name columns (task, model) sharing `room` characters: each its longest value,
    and where that does not fit, the widest cut first, down to NAME_MIN."""
    widths = {k: max([len(k)] + [len(visible(str(r.get(k)))) for r in rows]) for k in keys}
    widths = {k: min(w, 28) for k, w in widths.items()}
    while widths and sum(widths.values()) > room and max(widths.values()) > NAME_MIN:
        widest = max(widths, key=widths.__getitem__)
        widths[widest] -= 1
    return widths


class AttemptsTable:
    """Stored attempts, one per row. By default id, task, model, verdict, x eager and the error; where
    the console leaves the error column fewer than ERROR_ROOM characters, the error goes on its own
    indented line under its row instead of being folded into a sliver. `wide`: every column."""

    def __init__(self, rows: list[dict[str, Any]], wide: bool = False):
        self.rows, self.wide = rows, wide

    def table(self, width: int, error_column: bool = True) -> Table:
        rows, wide = self.rows, self.wide
        shared = {} if wide else {k: v for k in ("task", "model") if (v := _constant(rows, k)) is not None}
        title = ", ".join(f"{k} {visible(v)}" for k, v in shared.items()) or None
        table = _table(title)
        names = [k for k in ("task", "model") if k not in shared]
        # Ids and verdicts never wrap (an id is what `kgen show` takes); task and model names end in
        # "..." where the room runs out, rather than wrap into a column of fragments.
        fixed: list[tuple[str, dict[str, Any]]] = [("verdict", dict(no_wrap=True)),
                                                   ("x eager", dict(justify="right", no_wrap=True))]
        if wide:
            fixed = [("sample", dict(justify="right")), ("turn", dict(justify="right")), ("backend", {}),
                     ("size", dict(overflow="fold")), ("verdict", dict(no_wrap=True)),
                     ("flags", dict(overflow="fold")), ("time ms", dict(justify="right", no_wrap=True)),
                     ("x eager", dict(justify="right", no_wrap=True)),
                     ("x compile", dict(justify="right", no_wrap=True))]
        used = 26 + sum(self._natural(n) for n, _ in fixed) + GAP * (len(fixed) + len(names))
        if error_column:
            used += ERROR_ROOM + GAP if not wide else 16 + GAP
        name_width = _name_widths(rows, names, width - used)
        cols = [("id", dict(no_wrap=True, min_width=26))]
        cols += [(k, dict(no_wrap=True, overflow="ellipsis", width=name_width[k])) for k in names]
        cols += [(n, dict(o, min_width=self._natural(n))) for n, o in fixed]
        if error_column:  # the error, or why a correct attempt is not verified
            header = "error / not verified" if any(not_verified_reason(r) for r in rows) else "error"
            cols += [("error", dict(overflow="fold", ratio=1, min_width=16, header=header))]
        for name, options in cols:
            table.add_column(options.pop("header", name), **options)
        for r in rows:
            cells = self._cells(r)
            table.add_row(*(cells[name] for name, _ in cols))
        if not wide and any(r["flags"] for r in rows):
            table.caption = "* flagged (no_custom_kernel or shape_specialized): --wide shows the flags"
            table.caption_justify = "left"
        return table

    def _natural(self, column: str) -> int:
        """The width a column's values and header take."""
        values = [self._cells(r)[column] for r in self.rows]
        return max([len(column)] + [len(v.plain if isinstance(v, Text) else str(v)) for v in values])

    def _cells(self, r: dict[str, Any]) -> dict[str, RenderableType]:
        return {
            "id": r["id"], "task": literal(r["task"]), "model": literal(r["model"]),
            "sample": str(r["sample"]),
            "turn": f"{r['turn'] + 1}" + (f" (gen {r['generation']})" if r.get("generation") else ""),
            "backend": r["backend"], "size": literal(r.get("size")),
            # A flag marks a correct result we do not vouch for as a kernel.
            "verdict": r["verdict"] + ("*" if r["flags"] and not self.wide else ""),
            "flags": ",".join(r["flags"]), "time ms": fmt(r["time_ms"]), "x eager": fmt(r["speedup_eager"]),
            "x compile": fmt(r["speedup_compile"]),
            "error": Text(_note(r)),  # a compiler's or candidate's words: literal
        }

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        narrow = self.table(width, error_column=False)
        room = width - console.measure(narrow, options=options).maximum - GAP
        if self.wide or room >= ERROR_ROOM or not any(_note(r) for r in self.rows):
            yield self.table(width, error_column=self.wide or any(_note(r) for r in self.rows))
            return
        # The table without its error column, one line per row (nothing in it wraps), each row's
        # error after it on a line of its own.
        title, caption = narrow.title, narrow.caption
        narrow.title = narrow.caption = None
        if title:
            yield Text(title, style="table.title")
        lines = console.render_lines(narrow, options, pad=False)
        head = len(lines) - len(self.rows)
        yield from _lines(lines[:head])
        for line, r in zip(lines[head:], self.rows):
            yield from _lines([line])
            if _note(r):
                yield Padding(Text(_note(r), style="dim"), (0, 0, 0, 4))
        if caption:
            yield Text(caption, style="table.caption")


class Trimmed:
    """A renderable's lines without trailing spaces (a table's title or a wrapped line pads them)."""

    def __init__(self, renderable: RenderableType):
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in console.render_lines(self.renderable, options, pad=False):
            while line and not line[-1].control and not line[-1].text.rstrip(" "):
                line.pop()  # a segment of spaces only
            if line and not line[-1].control:
                line[-1] = Segment(line[-1].text.rstrip(" "), line[-1].style)
            yield from line
            yield Segment.line()


def _lines(lines: list[list[Segment]]) -> RenderResult:
    for line in lines:
        yield from line
        yield Segment.line()


def _note(r: dict[str, Any]) -> str:
    """An attempt's error cell: its error, or why a correct attempt is not verified (leaderboard)."""
    why = not_verified_reason(r)
    return f"not verified: {visible(why)}" if why else short_error(r["error"], *ERROR_CELL)


def attempts_table(rows: list[dict[str, Any]], wide: bool = False) -> AttemptsTable:
    """The renderable `kgen attempts` prints (see AttemptsTable)."""
    return AttemptsTable(rows, wide)


HEADERS = {"fast_compile": "fast_\ncompile", "best x eager": "best\nx eager", "best x compile": "best\nx compile",
           "best attempt": "best\nattempt",
           "geomean x eager": "geomean\nx eager", "geomean x compile": "geomean\nx compile"}


class Grid:
    """Rows of named cells, printed as a table whose name columns (task, model) share the room the
    other columns leave, so nothing else is cut or wrapped at 80 columns. `optional` columns are
    left out (the last first) where keeping them would cut a name; `wide` keeps every column."""

    def __init__(self, title: str | None, columns: list[str], rows: list[dict[str, Any]], wide: bool,
                 names: tuple[str, ...] = ("task", "model"), optional: tuple[str, ...] = ()):
        self.title, self.columns, self.rows, self.wide, self.names = title, columns, rows, wide, names
        self.optional = optional

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        columns = list(self.columns)
        while True:
            names = [c for c in columns if c in self.names]
            others = [c for c in columns if c not in names]
            header = {c: c if self.wide else HEADERS.get(c, c) for c in columns}
            natural = {c: max([len(line) for line in header[c].splitlines()] + [len(str(r[c])) for r in self.rows])
                       for c in others}
            verdicts = "verdicts" in others
            used = sum(natural[c] for c in others if c != "verdicts") + GAP * (len(columns) - 1) + 20 * verdicts
            room = options.max_width - used
            droppable = [c for c in columns if c in self.optional]
            full = _name_widths(self.rows, names, 10 ** 6)
            if self.wide or not droppable or sum(full.values()) <= room:
                break
            columns.remove(droppable[-1])
        widths = _name_widths(self.rows, names, room)
        if self.title:  # its own line, at the console's width: a table's title wraps to the table's
            yield Text(self.title, style="table.title")
        table = _table(None)
        for c in columns:
            if c in names:
                table.add_column(header[c], no_wrap=True, overflow="ellipsis", width=widths[c])
            elif c == "verdicts":
                table.add_column(header[c], overflow="fold", ratio=1, min_width=20)
            else:
                table.add_column(header[c], justify="right", no_wrap=True, min_width=natural[c])
        for r in self.rows:
            table.add_row(*(literal(str(r[c])) for c in columns))
        yield table


def run_summary(store, run_id: str, backend: str, wide: bool = False) -> list[RenderableType]:
    """Per task and model: attempts, correct, verified (leaderboard.is_verified), fast_1 (verified with
    a speedup over eager above 1, as `kgen best` counts it), and the best kernel (leaderboard.rank_key,
    the rule `kgen best` and the library use): its speedup over eager and its attempt id (left out
    where it does not fit; --wide keeps it); with `wide`, also compiled %, wrong, failed,
    fast_compile, its speedup over torch.compile and floor fraction, and the verdict counts. Then why
    correct attempts are not verified, where some are not, and the run's model usage."""
    from ..leaderboard import best_rows, is_verified, none_verified, not_verified_reason

    rows = store.attempts(run=run_id)
    verified: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if is_verified(r):
            verified.setdefault((r["task"], r["model"]), []).append(r)
    verdicts: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        counts = verdicts.setdefault((r["task"], r["model"]), {})
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    best = {(r["task"], r["model"]): r for r in best_rows(rows, group=("task", "model"))}
    summary = store.run_summary(run_id)
    model = None if wide else _constant(summary, "model")
    title = f"run {run_id} ({backend}" + (f", model {visible(model)}" if model else "") + ")"
    columns = (["task"] + ([] if model else ["model"])
               + ["n", "correct", "verified", "fast_1", "best x eager", "best attempt"])
    if wide:
        columns = ["task", "model", "n", "compiled", "correct", "verified", "wrong", "failed", "fast_1",
                   "fast_compile", "best x eager", "best x compile", "best attempt", "best floor frac", "verdicts"]
    cells = []
    for s in summary:
        key = (s["task"], s["model"])
        counts = verdicts.get(key, {})
        wrong = sum(n for v, n in counts.items() if v in WRONG)
        n = s["attempts"]
        top = best.get(key, {})
        mine = verified.get(key, [])
        cells.append({
            "task": s["task"], "model": s["model"], "n": n, "compiled": f"{100 * s['compiled'] / n:.0f}%",
            "correct": f"{s['correct']} ({100 * s['correct'] / n:.0f}%)" if wide else s["correct"],
            "verified": len(mine), "wrong": wrong, "failed": n - s["correct"] - wrong,
            "fast_1": sum((r["speedup_eager"] or 0) > 1 for r in mine),
            "fast_compile": sum((r["speedup_compile"] or 0) > 1 for r in mine),
            "best x eager": fmt(top.get("speedup_eager")),
            "best x compile": fmt(top.get("speedup_compile")), "best attempt": top.get("id", "-"),
            "best floor frac": fmt(top.get("floor_fraction")),
            "verdicts": ", ".join(f"{v} {c}" for v, c in sorted(counts.items())),
        })
    tokens, usd = store.run_spending(run_id)
    status = (store.get_run(run_id) or {}).get("status")
    usage = Text(f"model usage this run: {tokens} tokens, ${usd:.4f}"
                 + ("  (budget reached: the remaining slots were not started)" if status == "budget_reached" else ""))
    parts: list[RenderableType] = [Grid(title, columns, cells, wide, optional=("best attempt",))]
    if any(not_verified_reason(r) for r in rows):  # why correct attempts are not verified, and what to run
        parts.append(Text(visible(none_verified(rows)), style="yellow"))
    calls = sum(counts.get("model_error", 0) for counts in verdicts.values())
    if calls:
        parts.append(Text(f"{calls} model call{'s' if calls != 1 else ''} failed: not judged, and in a search "
                          "the conversation stops there (kgen attempts --verdict model_error lists them)", style="red"))
    if (line := unjudged_line(store, run_id)) is not None:
        parts.append(line)
    if not wide:
        parts.append(Text("kgen attempts --run latest lists each attempt; --wide adds columns"))
    return [Trimmed(part) for part in parts + [usage]]


def unjudged_line(store, run_id: str | None) -> Text | None:
    """The run's attempts that could not be judged (Store.unjudged: no attempt is stored), each with its
    reason, shown literally; None where there are none."""
    found = store.unjudged(run_id) if run_id else []
    if not found:
        return None
    n = len(found)
    named = "; ".join(f"{u['task']} sample {u['sample']}: {short_error(u['error'])}" for u in found[:3])
    return Text(visible(f"{n} attempt{'s' if n != 1 else ''} could not be judged and {'are' if n != 1 else 'is'} not "
                        f"stored (the same kgen run judges {'them' if n != 1 else 'it'} again): {named}"
                        + (f"; and {n - 3} more" if n > 3 else "")), style="red")


BEST_WIDE = ["task", "backend", "device", "size", "time ms", "x eager", "x compile", "beats", "floor frac", "model",
             "found at", "run", "attempt"]


def best_table(board: list[dict[str, Any]], beats: dict[str, tuple[bool | None, bool | None]] | None = None,
               wide: bool = False) -> Grid:
    """`kgen best`: per task, backend, device and size, the best verified kernel (leaderboard.rank_key). By default the
    task, its speedups, whether it beats eager and torch.compile (`beats`: by attempt id), and the
    attempt id; backend, device and size in the title where every row shares them. `wide`: all."""
    shared = {} if wide else {k: v for k in ("backend", "device", "size") if (v := _constant(board, k)) is not None}
    title = "best verified kernels" + (" (" + ", ".join(visible(v) for v in shared.values()) + ")" if shared else "")
    columns = BEST_WIDE if wide else (["task"] + [k for k in ("backend", "device", "size") if k not in shared]
                                      + ["x eager", "x compile"] + (["beats"] if beats is not None else [])
                                      + ["attempt"])
    rows = []
    for r in board:
        eager, compiled = (beats or {}).get(r["id"], (None, None))
        turn = f"turn {r.get('turn', 0) + 1}"
        rows.append({
            "task": r["task"], "backend": r["backend"], "device": r.get("device") or "-", "size": r.get("size") or "-",
            "time ms": fmt(r["time_ms"], 4), "x eager": fmt(r["speedup_eager"]), "x compile": fmt(r["speedup_compile"]),
            "beats": {(True, True): "both", (True, False): "eager", (False, True): "compile"}.get(
                (bool(eager), bool(compiled)), "no"),
            "floor frac": fmt(r.get("floor_fraction")), "model": r["model"],
            "found at": f"gen {r['generation']} {turn}" if r.get("generation") else turn,
            "run": r.get("run_id", r.get("run")), "attempt": r["id"],
        })
    return Grid(title, columns, rows, wide, names=("task", "device", "model"))


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def metrics_table(groups: list[dict[str, Any]], wide: bool = False) -> Grid:
    """`kgen best`: KernelBench's metrics per level (pipeline.report.kbmetrics): tasks, fast_0, fast_1, fast_p
    at each chosen p, geometric-mean speedups over eager and torch.compile. The setting (backend, size,
    dtype, gradient mode) goes in the title where every group shares it; `wide` adds fast_p over
    torch.compile."""
    from ..report.kbmetrics import level_label

    shared = {k: v for k in ("backend", "size", "dtype") if (v := _constant(groups, k)) is not None}
    title = "KernelBench metrics per level" + (
        " (" + ", ".join(visible(v) for v in shared.values()) + ")" if shared else "")
    ps = list(groups[0]["fast_p"]) if groups else []
    columns = (["level"] + [k for k in ("backend", "size", "dtype") if k not in shared]
               + ["tasks", "fast_0", "fast_1"] + [f"fast_{p}" for p in ps] + ["geomean x eager", "geomean x compile"])
    if wide:
        columns += ["fast_1 compile"] + [f"fast_{p} compile" for p in ps]
    rows = []
    for g in groups:
        row = {"level": level_label(g) + (" (grad)" if g.get("grad") else ""), "backend": g["backend"],
               "size": g["size"], "dtype": g["dtype"], "tasks": g["tasks"], "fast_0": _share(g["fast_0"]),
               "fast_1": _share(g["fast_1"]), "geomean x eager": fmt(g["geomean_eager"]),
               "geomean x compile": fmt(g["geomean_compile"]), "fast_1 compile": _share(g["fast_1_compile"])}
        for p in ps:
            row[f"fast_{p}"] = _share(g["fast_p"][p])
            row[f"fast_{p} compile"] = _share(g["fast_p_compile"][p])
        rows.append(row)
    return Grid(title, columns, rows, wide, names=("level",))
