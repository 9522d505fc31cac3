"""docs/config-reference.md is what pipeline.config_doc generates from the config schema, and it
names every key."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import Field

from pipeline import config_doc
from pipeline.config import Config, _Strict


def test_the_committed_reference_is_current():
    assert config_doc.OUTPUT.read_text() == config_doc.render(), "run python -m pipeline.config_doc"


def test_every_key_of_every_section_is_in_the_reference():
    text = config_doc.render()
    keys = [f"{prefix}{name}" for prefix, model in config_doc.rows(Config)
            for name, field in model.model_fields.items() if not field.exclude]
    assert len(keys) > 70 and "evaluation.grad" in keys and "models[].sampling.temperature" in keys
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing, missing


def test_a_row_gives_the_type_default_bounds_and_meaning():
    text = config_doc.render()
    assert '| `samples` | int | `1` | >= 1, <= 1000 | Completions asked per task and model. |' in text
    assert '| `backend` | "cuda" \\| "triton" \\| "cpu" \\| "auto" | `"auto"` |' in text
    assert "| `models[].provider` | \"openai\" \\| \"replay\" | required |" in text


def test_a_field_without_a_docstring_is_refused_by_name(monkeypatch):
    class Bare(_Strict):
        """A section."""

        mode: Literal["a", "b"] = Field(default="a")

    monkeypatch.setattr(config_doc, "rows", lambda model, prefix="": [("", Bare)])
    with pytest.raises(ValueError, match="Bare.mode has no docstring"):
        config_doc.render()
