"""The data kgen ships with: the reference tasks, prompt templates, the demo's recorded
completions and its config.

    bundled.path("reference_tasks")      # a folder of task files, wherever kgen is installed

Installed from a wheel, they sit inside the package (pipeline/_bundled/, copied there by setup.py);
in a source checkout or an editable install, at the repository's top level beside pipeline/. Either
way a command run from an empty folder finds them without a config file.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
ROOT = _PACKAGE / "_bundled" if (_PACKAGE / "_bundled").is_dir() else _PACKAGE.parent
DEMO_CONFIG = "config.yaml"


def path(name: str) -> Path:
    """The bundled file or folder `name` (reference_tasks, prompts, fixtures/replay/demo.jsonl, ...)."""
    return ROOT / name
