"""KernelBench's own references dropped in as candidates (issue 28, item 4): the config a sweep runs,
and what it found per level. bench/kb_sweep.sh runs it on a GPU machine; tests/test_kernelbench.py
runs it on the cpu over tests/kernelbench.

    python bench/kb_sweep.py setup CHECKOUT DIR [--backend cuda] [--executor local] [--levels 1 2 3]
                                     [--problems 1-7 19] [--db DB] [--size default] [--compile/--no-compile] [--eval KEY=VALUE ...]
    python bench/kb_sweep.py summary DB [--json]

`setup` writes DIR/dropin.jsonl, one replay answer per task file of the chosen levels: the file itself
with `class ModelNew(Model): pass` after it (the task's own Model as the candidate, as the H100 runs
of issue 28 did by hand), and DIR/sweep.yaml, a config over the checkout (tasks.kernelbench) with
that replay model, one sample a task, the database at DB. Running `kgen run -c DIR/sweep.yaml` again
with the same database resumes the run: only tasks without a stored attempt are judged.

`summary` prints, per level, the tasks the newest run chose and what became of them: correct (no
flag), flagged (correct, with the flags named), failed (any other verdict, by verdict), could not be
judged (no attempt: the run's reference process failed, each with its reason from the database) and
not reached (no attempt and no reason: refused before it started, or not reached yet).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections import Counter, defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.config import ConfigError, load_config  # noqa: E402
from pipeline.run.kernelbench import select_tasks  # noqa: E402

DROP_IN = "\n\nclass ModelNew(Model):\n    \"\"\"The task's own Model, as the candidate.\"\"\"\n"


def _value(text: str):
    return yaml.safe_load(text)


def setup(args: argparse.Namespace) -> int:
    out = Path(args.dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    evaluation = {"compile_baseline": args.compile, **dict(kv.split("=", 1) for kv in args.eval)}
    config = {
        "models": [{"name": "dropin", "provider": "replay", "replay_file": str(out / "dropin.jsonl")}],
        "tasks": {"kernelbench": str(Path(args.checkout).resolve()), "levels": args.levels, "size": args.size,
                  **({"problems": args.problems} if args.problems else {})},
        "prompts_dir": str(ROOT / "prompts"), "samples": 1, "backend": args.backend, "executor": args.executor,
        "database": str(Path(args.db).resolve()) if args.db else str(out / "sweep.db"),
        "generated_dir": str(out / "generated"), "build_dir": str(out / "builds"),
        "evaluation": {k: _value(v) if isinstance(v, str) else v for k, v in evaluation.items()},
    }
    if args.ray_address:
        config["ray_address"] = args.ray_address
    path = out / "sweep.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        chosen = select_tasks(load_config(path))
    except ConfigError as exc:
        print(f"kb_sweep: {exc}", file=sys.stderr)
        return 2
    with open(out / "dropin.jsonl", "w") as f:
        for task in chosen:
            text = f"```python\n{task.source.rstrip()}{DROP_IN}```\n"
            f.write(json.dumps({"task": task.name, "backend": args.backend, "text": text}) + "\n")
    print(f"kb_sweep: {len(chosen)} tasks (levels {', '.join(map(str, args.levels))}) -> {path}")
    return 0


def summarize(db: Path) -> dict:
    """Per level: the newest run's chosen tasks, and counts of what their stored attempts say."""
    if not db.is_file():
        raise SystemExit(f"kb_sweep: {db}: no such database")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    run = con.execute("SELECT id, plan_json, status FROM runs WHERE kind != 'eval' ORDER BY started_utc DESC "
                      "LIMIT 1").fetchone()
    if run is None:
        raise SystemExit(f"kb_sweep: {db} holds no run")
    planned = {slot[0] for slot in json.loads(run["plan_json"])}
    rows = {r["task"]: r for r in con.execute(
        "SELECT task, level, problem, verdict, flags, error FROM attempts WHERE run_id = ?", [run["id"]])}
    # Attempts the run could not judge (pipeline.store's unjudged: a reference process that failed), by task.
    unjudged = {r["task"]: r["error"] for r in con.execute(
        "SELECT task, error FROM unjudged WHERE run_id = ? ORDER BY id", [run["id"]])} if con.execute(
        "SELECT 1 FROM sqlite_master WHERE name = 'unjudged'").fetchone() else {}
    levels: dict[str, dict] = defaultdict(lambda: {"tasks": 0, "correct": 0, "flagged": Counter(), "failed": Counter(),
                                                   "unjudged": {}, "not_judged": []})
    for task in sorted(planned):
        row = rows.get(task)
        level = f"level{row['level']}" if row is not None and row["level"] is not None else _level_of(con, task)
        entry = levels[level]
        entry["tasks"] += 1
        if row is None and task in unjudged:
            entry["unjudged"][task] = unjudged[task]
        elif row is None:
            entry["not_judged"].append(task)
        elif row["verdict"] == "correct" and row["flags"]:
            entry["flagged"][row["flags"]] += 1
        elif row["verdict"] == "correct":
            entry["correct"] += 1
        else:
            entry["failed"][row["verdict"]] += 1
    con.close()
    return {"run": run["id"], "status": run["status"],
            "levels": {k: {**v, "flagged": dict(v["flagged"]), "failed": dict(v["failed"])}
                       for k, v in sorted(levels.items())}}


def _level_of(con: sqlite3.Connection, task: str) -> str:
    """A task with no attempt in this run: its level from the task's stored path (levelN/ID_Name.py)."""
    row = con.execute("SELECT path FROM tasks WHERE name = ?", [task]).fetchone()
    parent = Path(row["path"]).parent.name if row else ""
    return parent if parent.startswith("level") else "unknown"


def summary(args: argparse.Namespace) -> int:
    found = summarize(Path(args.db))
    if args.json:
        print(json.dumps(found))
        return 0
    print(f"run {found['run']} ({found['status']})")
    for level, v in found["levels"].items():
        flagged = sum(v["flagged"].values())
        failed = sum(v["failed"].values())
        print(f"{level}: {v['tasks']} tasks, {v['correct']} correct, {flagged} flagged "
              f"({', '.join(f'{k} {n}' for k, n in v['flagged'].items()) or '-'}), {failed} failed "
              f"({', '.join(f'{k} {n}' for k, n in v['failed'].items()) or '-'}), {len(v['unjudged'])} could not be "
              f"judged, {len(v['not_judged'])} not reached" + (f": {' '.join(v['not_judged'])}" if v["not_judged"] else ""))
        for task, error in v["unjudged"].items():
            print(f"  could not be judged: {task}: {error}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup")
    s.add_argument("checkout")
    s.add_argument("dir")
    s.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    s.add_argument("--executor", default="local", choices=["local", "ray"])
    s.add_argument("--ray-address", default=None)
    s.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    s.add_argument("--size", default="default")
    s.add_argument("--problems", nargs="*", default=None, help="problem ids or ranges (1-7) of every chosen level")
    s.add_argument("--db", default=None)
    s.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    s.add_argument("--eval", nargs="*", default=[], metavar="KEY=VALUE", help="evaluation settings (YAML values)")
    s.set_defaults(fn=setup)
    m = sub.add_parser("summary")
    m.add_argument("db")
    m.add_argument("--json", action="store_true")
    m.set_defaults(fn=summary)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
