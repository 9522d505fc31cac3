"""KernelBench as a task source: the `tasks:` keys kernelbench, levels, problems and
names over a fake checkout (tests/kernelbench: real KernelBench files at tiny sizes), their one-line
errors, and a real batch on the cpu storing each attempt's level and problem id in SQLite."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import sqlite_utils
import yaml
from click.testing import CliRunner

from pipeline.cli.main import main
from pipeline.config import ConfigError, load_config, parse_config
from pipeline.run.kernelbench import find_task, select_tasks
from pipeline.store.migrations import MIGRATIONS
from pipeline.run.batch import Runner
from pipeline.store.store import Store

ROOT = Path(__file__).resolve().parent.parent
CHECKOUT = ROOT / "tests" / "kernelbench"
MODEL = {"name": "m", "provider": "replay", "replay_file": "r.jsonl"}


def _cfg(tasks: dict, base: Path = CHECKOUT):
    return parse_config({"models": [MODEL], "tasks": tasks}, base)


def _chosen(**tasks) -> list[tuple[str, int | None, int | None]]:
    return [(t.name, t.level, t.problem) for t in select_tasks(_cfg({"kernelbench": str(CHECKOUT), **tasks}))]


def test_every_level_by_default_in_level_then_problem_order():
    assert _chosen(levels=[1, 2]) == [("19_ReLU", 1, 19), ("23_Softmax", 1, 23),
                                      ("12_Gemm_Multiply_LeakyReLU", 2, 12)]


def test_the_repository_root_or_its_kernelbench_folder_both_work():
    assert _chosen(levels=[2]) == _chosen(levels=[2], kernelbench=str(CHECKOUT / "KernelBench")) \
        == [("12_Gemm_Multiply_LeakyReLU", 2, 12)]


def test_relative_checkout_resolves_against_the_config_file():
    cfg = parse_config({"models": [MODEL], "tasks": {"kernelbench": "kernelbench", "levels": [1]}}, ROOT / "tests")
    assert [t.name for t in select_tasks(cfg)] == ["19_ReLU", "23_Softmax"]
    assert all(t.path.is_absolute() and t.path.is_file() for t in select_tasks(cfg))


@pytest.mark.parametrize("problems, expected", [
    ([23], ["23_Softmax"]),
    (["19-22"], ["19_ReLU"]),
    (["10-30"], ["19_ReLU", "23_Softmax", "12_Gemm_Multiply_LeakyReLU"]),
    ([12, "23"], ["23_Softmax", "12_Gemm_Multiply_LeakyReLU"]),
])
def test_problems_filter_by_id_and_inclusive_range(problems, expected):
    assert [n for n, _, _ in _chosen(levels=[1, 2], problems=problems)] == expected


def test_names_glob_among_the_chosen_levels_and_problems():
    assert _chosen(levels=[1, 2], names=["*Softmax*", "*Gemm*"]) == [("23_Softmax", 1, 23),
                                                                     ("12_Gemm_Multiply_LeakyReLU", 2, 12)]
    assert _chosen(levels=[1], problems=["1-20"], names=["*ReLU*"]) == [("19_ReLU", 1, 19)]


def test_a_plain_folder_of_kernelbench_files_keeps_level_and_problem_from_its_path():
    cfg = _cfg({"directory": str(CHECKOUT / "KernelBench" / "level1"), "names": ["*ReLU"]})
    assert [(t.name, t.level, t.problem) for t in select_tasks(cfg)] == [("19_ReLU", 1, 19)]
    plain = _cfg({"directory": str(ROOT / "reference_tasks"), "names": ["mse"]})
    assert [(t.level, t.problem) for t in select_tasks(plain)] == [(None, None)]


def test_find_task_looks_in_every_level():
    task = find_task(_cfg({"kernelbench": str(CHECKOUT), "levels": [1]}), "12_Gemm_Multiply_LeakyReLU")
    assert (task.level, task.problem) == (2, 12)


@pytest.mark.parametrize("tasks, key, words", [
    ({"kernelbench": "no/such/place"}, "tasks.kernelbench", "no such folder"),
    ({"kernelbench": str(ROOT / "reference_tasks")}, "tasks.kernelbench", "not a KernelBench checkout"),
    ({"kernelbench": str(CHECKOUT)}, "tasks.levels", "no level3 folder"),            # the default is 1-3
    ({"kernelbench": str(CHECKOUT), "levels": [1, 4]}, "tasks.levels", "no level4 folder"),
    ({"kernelbench": str(CHECKOUT), "levels": [1], "problems": [12]}, "tasks.problems", "12 matches no file"),
    ({"kernelbench": str(CHECKOUT), "levels": [1], "problems": ["40-90"]}, "tasks.problems", "40-90"),
    ({"kernelbench": str(CHECKOUT), "levels": [1], "names": ["*Gemm*"]}, "tasks.names", "'*Gemm*' matches no"),
])
def test_bad_selection_is_one_config_error_naming_the_key(tasks, key, words):
    with pytest.raises(ConfigError) as err:
        select_tasks(_cfg(tasks))
    message = str(err.value)
    assert message.startswith(key + ":") and words in message and "\n" not in message, message


def test_an_empty_level_folder_is_named(tmp_path):
    shutil.copytree(CHECKOUT / "KernelBench", tmp_path / "KernelBench")
    (tmp_path / "KernelBench" / "level4").mkdir()  # a git submodule left unchecked-out
    with pytest.raises(ConfigError, match=r"^tasks.levels: .*level4 holds no task files"):
        select_tasks(_cfg({"kernelbench": str(tmp_path), "levels": [4]}))


@pytest.mark.parametrize("tasks, words", [
    ({"levels": [1]}, "set kernelbench"),
    ({"problems": [1]}, "set kernelbench"),
    ({"kernelbench": ".", "directory": "x"}, "not both"),
    ({"kernelbench": ".", "levels": [0]}, "numbered from 1"),
    ({"kernelbench": ".", "problems": ["5-2"]}, "runs upwards"),
    ({"kernelbench": ".", "problems": ["a few"]}, "not a problem id"),
])
def test_bad_keys_fail_when_the_config_loads(tasks, words):
    with pytest.raises(ConfigError) as err:
        _cfg(tasks)
    assert "tasks" in str(err.value) and words in str(err.value) and "\n" not in str(err.value)


def test_kgen_run_names_the_key_in_one_line(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"models": [MODEL], "tasks": {"kernelbench": str(CHECKOUT), "levels": [1, 7]}}))
    result = CliRunner().invoke(main, ["run", "-c", str(path)])
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1, result.output
    assert "tasks.levels: no level7 folder" in result.output


RELU = "```python\nimport torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n" \
       "    def forward(self, x):\n        return torch.relu(x)\n```\n"


def test_a_batch_over_kernelbench_stores_level_and_problem(tmp_path):
    """A real cpu batch (replay answers, sandboxed evaluation, SQLite): each attempt's row carries its
    task's level and problem id, and `kgen attempts` and `kgen export` give them back."""
    replay = tmp_path / "replay.jsonl"
    replay.write_text(json.dumps({"task": "19_ReLU", "backend": "cpu", "text": RELU}) + "\n"
                      + json.dumps({"task": "12_Gemm_Multiply_LeakyReLU", "backend": "cpu", "text": "no code"}) + "\n")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "models": [{"name": "m", "provider": "replay", "replay_file": str(replay)}],
        "tasks": {"kernelbench": str(CHECKOUT), "levels": [1, 2], "problems": [19, 12]},
        "prompts_dir": str(ROOT / "prompts"), "backend": "cpu",
        "evaluation": {"trials": 2, "timed_calls": 3, "warmup_calls": 1, "compile_baseline": False,
                       "check_shapes": False, "profile": False, "timeout_s": 120}}))
    cfg = load_config(config)
    with Store.open(cfg.path(cfg.database)) as store:
        run_id = asyncio.run(Runner(cfg, store).run())
        rows = {a["task"]: a for a in store.attempts(run=run_id)}
    assert rows["19_ReLU"]["verdict"] == "correct", rows["19_ReLU"]["error"]
    assert (rows["19_ReLU"]["level"], rows["19_ReLU"]["problem"]) == (1, 19)
    gemm = rows["12_Gemm_Multiply_LeakyReLU"]
    assert (gemm["verdict"], gemm["level"], gemm["problem"]) == ("extract_failed", 2, 12)
    out = CliRunner().invoke(main, ["export", "--db", str(cfg.path(cfg.database))])
    exported = {r["task"]: (r["level"], r["problem"]) for r in map(json.loads, out.output.splitlines())}
    assert exported == {"19_ReLU": (1, 19), "12_Gemm_Multiply_LeakyReLU": (2, 12)}
    # The baselines this cpu run stored, against the fake published JSON (KernelBench's format): the cpu
    # has no back-to-back "plain" time, so its median is compared, and said to be.
    out = CliRunner().invoke(main, ["kernelbench-baselines", str(CHECKOUT), "--db", str(cfg.path(cfg.database)),
                                    "--json"])
    eager = next(g for g in map(json.loads, out.output.splitlines()) if g["kind"] == "eager")
    (relu,) = eager["matched"]
    assert (relu["task"], relu["level"], relu["measure"], relu["kernelbench_ms"]) == ("19_ReLU", 1, "median", 1.0)
    assert relu["ratio"] == relu["kgen_ms"] > 0


def test_a_database_from_before_gets_the_columns(tmp_path):
    """The migrations add level and problem (m009) and own_fraction (m010) to an existing attempts table
    (NULL for its old rows)."""
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    db = sqlite_utils.Database(con)
    db["_kgen_migrations"].create({"name": str, "applied_at": str}, pk="name")
    for fn in [fn for fn in MIGRATIONS if fn.__name__ < "m009"]:
        fn(db)
        db["_kgen_migrations"].insert({"name": fn.__name__, "applied_at": "then"})
    con.commit()
    con.close()
    with Store.open(path) as store:
        assert {"level", "problem", "own_fraction"} <= set(store.db["attempts"].columns_dict)
