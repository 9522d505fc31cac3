"""No kernel at all (the reference's own torch ops), and at import it rebinds the harness's profile
function, so the child's profile reports every microsecond as its own: the `no_custom_kernel` flag
must come from the parent's look at the build (nothing built, no Triton kernel), not from the
child's report."""
import sys

import torch
import torch.nn as nn


def _all_mine(*args, **kwargs):
    return {"total_us": 100.0, "torch_us": 0.0, "torch_fraction": 0.0, "top": [["my_kernel", 100.0]]}


for _name in ("__main__", "pipeline.child.harness", "pipeline.child.profiling"):
    _module = sys.modules.get(_name)
    if _module is not None and hasattr(_module, "profile"):
        _module.profile = _all_mine


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
