"""`kgen eval` and `kgen serve` judge a task at one size, resolved by one rule
(pipeline.run.single.eval_size), and a task file is judged at a size it states.

The end-to-end check (the same task file judged locally and through a real `kgen serve`, at the
same size) is in tests/test_serve.py; these check the rule itself on real task files.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.child import tasks
from pipeline.config import load_config
from pipeline.run.single import eval_size

ROOT = Path(__file__).resolve().parent.parent

WIDE = """import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)

batch_size = 1024
dim = 4096
{sizes}
def get_inputs():
    return [torch.rand(batch_size, dim), torch.rand(batch_size, dim)]

def get_init_inputs():
    return []
"""


def _task(tmp: Path, sizes: str = "") -> tasks.TaskFile:
    path = tmp / "wide.py"
    path.write_text(WIDE.format(sizes=sizes))
    return tasks.load_file(path)


def test_a_task_file_is_judged_at_the_size_it_states(tmp_path):
    plain = _task(tmp_path)  # states no sizes: the file as written, not a derived small (1024x1024)
    assert eval_size(None, None, plain, named_file=True) == "default"
    stated = _task(tmp_path, 'KGEN_SIZES = {"small": {"batch_size": 8}}\n')
    assert eval_size(None, None, stated, named_file=True) == "small"
    assert eval_size("odd", None, stated, named_file=True) == "odd"  # --size wins


def test_a_config_s_size_and_the_demo_s_apply_where_they_are_named(tmp_path):
    demo = load_config(ROOT / "config.yaml")
    mse = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    assert eval_size(None, None, mse, named_file=False) == demo.tasks.size  # a bundled task, no config file
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load((ROOT / "config.yaml").read_text()),
                                    "tasks": {"names": ["mse"], "size": "odd"}}))
    assert eval_size(None, load_config(path), _task(tmp_path), named_file=True) == "odd"
