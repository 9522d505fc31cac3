"""docs/validation.md is what bench/validation.py generates from bench/results/*.json."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _validation():
    spec = importlib.util.spec_from_file_location("bench_validation", ROOT / "bench" / "validation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_page_is_what_the_result_files_give():
    v = _validation()
    text = v.render(v.load())
    assert (ROOT / "docs" / "validation.md").read_text() == text, "run python bench/validation.py"
    for _, data in v.load():  # every topic appears, with every entry's tree and command
        assert f"### {data['topic']}" in text
        for entry in data["entries"]:
            assert f"tree `{entry['tree']}`: `{entry['command']}`" in text


def test_an_entry_without_its_tree_is_refused_by_name(tmp_path):
    v = _validation()
    entry = {"device": "H100", "date": "2026-01-01", "command": "x", "holds": "y"}
    (tmp_path / "redteam.json").write_text(json.dumps({"topic": "t", "what": "w", "entries": [entry]}))
    with pytest.raises(ValueError, match="redteam.json: entry 0 has no tree"):
        v.load(tmp_path)
