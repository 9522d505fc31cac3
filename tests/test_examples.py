"""Every config in examples/ (and the demo's config.yaml) loads, and the files it names exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import load_config

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "examples").glob("*.yaml")) + [ROOT / "config.yaml"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_an_example_config_loads_and_its_paths_resolve_inside_the_repository(path):
    cfg = load_config(path)
    for model in cfg.models:
        if model.provider == "replay":
            assert cfg.path(model.replay_file).is_file(), model.replay_file
    for value in (cfg.database, cfg.generated_dir, cfg.build_dir):  # the repository's own git-ignored folders
        assert cfg.path(value).resolve().is_relative_to(ROOT), value
        assert cfg.path(value).resolve().parent == ROOT or cfg.path(value).resolve().parent.parent == ROOT, value
    assert cfg.path(cfg.tasks.directory).is_dir()


def test_the_own_endpoint_example_reads_its_key_from_the_environment():
    cfg = load_config(ROOT / "examples" / "own-endpoint.yaml")
    (model,) = cfg.models
    assert model.provider == "openai" and model.base_url and model.model
    assert model.api_key_env == "KGEN_API_KEY"
