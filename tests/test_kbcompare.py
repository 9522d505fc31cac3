"""`kgen kernelbench-baselines`: stored baselines in a real SQLite database against a
tiny fake of KernelBench's published timing JSON (tests/kernelbench/results/timing/H100_Modal/):
median ratio, spread, every task off by more than the tolerance named, the measure compared said."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli.main import main
from pipeline.cli.kbcompare import compare, load_published, published_dir
from pipeline.records import Baselines, Timing
from pipeline.store.store import Store

CHECKOUT = Path(__file__).resolve().parent / "kernelbench"
H100 = "NVIDIA H100 80GB HBM3"


def _t(ms: float) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, n=10)


def _save(store, task, size, key_tail, baselines):
    store.save_baseline(f"{task}:sha:{size}:cuda:{H100}:2.13.0:timing9{key_tail}", task, size, H100, "2.13.0",
                        baselines.model_dump_json())


@pytest.fixture()
def db(tmp_path):
    path = tmp_path / "kgen.db"
    with Store.open(path) as store:
        # KernelBench: eager 1.0, 2.0, 4.0 ms; compile 0.5, 1.0, 2.0 ms.
        _save(store, "19_ReLU", "default", "", Baselines(eager=_t(0.9), compiled=_t(0.4), eager_plain_ms=1.05,
                                                         compiled_plain_ms=0.6))            # 1.05, 1.20 (off)
        _save(store, "23_Softmax", "default", "", Baselines(eager=_t(2.0), compiled=_t(1.0), eager_plain_ms=2.5,
                                                            compiled_plain_ms=1.0))         # 1.25 (off), 1.00
        _save(store, "12_Gemm_Multiply_LeakyReLU", "default", "",
              Baselines(eager=_t(4.0), compiled=_t(2.1), eager_plain_ms=3.8))               # 0.95, median 1.05
        _save(store, "mse", "default", "", Baselines(eager=_t(1.0)))                       # not KernelBench's
        _save(store, "19_ReLU", "small", "", Baselines(eager=_t(0.01), eager_plain_ms=0.01))  # not its own size
        _save(store, "19_ReLU", "default", ":grad", Baselines(eager=_t(9.0), eager_plain_ms=9.0))  # another mode
    return str(path)


def test_published_format_and_folder():
    folder = published_dir(CHECKOUT)
    assert folder == CHECKOUT / "results" / "timing" / "H100_Modal" and published_dir(folder) == folder
    times = load_published(folder)
    assert times["eager"]["23_Softmax"] == (1, 2.0) and times["compile"]["12_Gemm_Multiply_LeakyReLU"] == (2, 2.0)


def test_ratios_spread_and_every_task_off_named(db):
    with Store.open(db) as store:
        eager, compiled = compare(store, load_published(published_dir(CHECKOUT)), tolerance=0.10)
    assert (eager["kind"], eager["device"], eager["tasks"]) == ("eager", H100, 3)
    assert eager["median_ratio"] == pytest.approx(1.05)
    assert (eager["min_ratio"], eager["max_ratio"]) == (pytest.approx(0.95), pytest.approx(1.25))
    assert (eager["p25_ratio"], eager["p75_ratio"]) == (pytest.approx(1.0), pytest.approx(1.15))
    assert [m["task"] for m in eager["off"]] == ["23_Softmax"] and eager["unknown"] == ["mse"]
    assert eager["measures"] == ["plain"]
    assert compiled["median_ratio"] == pytest.approx(1.05)
    assert [m["task"] for m in compiled["off"]] == ["19_ReLU"]
    gemm = next(m for m in compiled["matched"] if m["task"].startswith("12_"))
    assert (gemm["measure"], gemm["level"], gemm["ratio"]) == ("median", 2, pytest.approx(1.05))
    with Store.open(db) as store:
        strict = compare(store, load_published(published_dir(CHECKOUT)), tolerance=0.04)[0]
    assert [m["task"] for m in strict["off"]] == ["12_Gemm_Multiply_LeakyReLU", "19_ReLU", "23_Softmax"]


def test_the_command(db, tmp_path):
    out = CliRunner().invoke(main, ["kernelbench-baselines", str(CHECKOUT), "--db", db])
    assert out.exit_code == 0, out.output
    text = out.output
    assert f"{H100}, eager: 3 tasks, kgen/KernelBench median 1.050 (quartiles 1.000-1.150, range 0.950-1.250" in text
    assert "level 1 23_Softmax: kgen 2.5 ms, KernelBench 2 ms (1.25x)" in text
    assert "level 1 19_ReLU: kgen 0.6 ms, KernelBench 0.5 ms (1.20x)" in text
    assert "not in KernelBench's file: mse" in text
    lines = [json.loads(line) for line in CliRunner().invoke(
        main, ["kernelbench-baselines", str(CHECKOUT), "--db", db, "--json"]).output.splitlines()]
    assert [(g["kind"], g["tasks"], len(g["off"])) for g in lines] == [("eager", 3, 1), ("compile", 3, 1)]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "baseline_time_torch.json").write_text('{"level1": {"19_ReLU.py": {"median": 1}}}')
    for folder, words in ((bad, "not KernelBench's timing format"), (tmp_path, "no baseline_time_torch.json")):
        out = CliRunner().invoke(main, ["kernelbench-baselines", str(folder), "--db", db])
        assert out.exit_code == 1 and words in out.output and len(out.output.strip().splitlines()) == 1, out.output
