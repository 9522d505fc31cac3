"""pipeline.policy: every threshold the judge plans or decides by, in one versioned record."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.policy import POLICY, Policy

JUDGE = Path(__file__).resolve().parent.parent / "pipeline" / "judge"


def test_every_threshold_says_why_and_the_record_is_frozen():
    undocumented = [name for name, field in Policy.model_fields.items() if not field.description]
    assert not undocumented, undocumented
    with pytest.raises(ValidationError):
        POLICY.loaded_share = 0.9  # frozen: a module cannot move a threshold under another's feet
    with pytest.raises(ValidationError, match="loaded_shar"):
        Policy(loaded_shar=0.9)  # a misspelt field is refused, not ignored


def test_no_judge_module_keeps_a_threshold_of_its_own():
    """No module of pipeline/judge defines at module level a name the policy holds (in any case)."""
    fields = set(Policy.model_fields)
    found = []
    for path in JUDGE.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id.lower() in fields and path.name != "policy.py":
                    found.append(f"{path.name}: {t.id}")
    assert not found, found
