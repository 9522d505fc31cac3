"""A scripted stand-in for a capable model, for search tests: its answer depends on what the prompt says.

    with serve([], responder=answer) as server: ...

It knows the seven bundled loss tasks (cpu backend) and behaves like a model that can only fix
what the judge's feedback shows it:
- mse: its first kernel does not compile; it fixes the line only when the feedback names that line
  of its own code and the compiler's message.
- huber: its first version uses the wrong beta; it corrects it only when the feedback shows the
  worst element (expected against got).
- cosine: its first version is correct but recomputes the similarity 64 times; it writes the
  fast one only when the feedback shows its time against the bandwidth floor.
- the other four are right the first time.
In an evolve prompt it answers with the fastest version it knows once it sees a parent's code.
Plain torch ops for all but mse keep the suite's builds to two compiles.
"""

from __future__ import annotations

import re
from typing import Any

from chat_server import Reply

MSE_CPP = '''import torch
from torch.utils.cpp_extension import load_inline

cpp_src = r"""
#include <torch/extension.h>

torch::Tensor mse(torch::Tensor p, torch::Tensor t) {
    auto pc = p.contiguous();
    auto tc = t.contiguous();
    const float* a = pc.data_ptr<float>();
    const float* b = tc.data_ptr<float>();
    const int64_t n = pc.numel();
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = (double)a[i] - (double)b[i];
        acc += d * D_SQUARED;
    }
    return torch::full({}, acc / (double)n, pc.options());
}
"""

_ext = load_inline(name="kgen_search_mse", cpp_sources=cpp_src, functions=["mse"], verbose=False)


class ModelNew(torch.nn.Module):
    def forward(self, predictions, targets):
        return _ext.mse(predictions, targets)
'''
MSE_BROKEN = MSE_CPP.replace("D_SQUARED", "dd")
MSE_FIXED = MSE_CPP.replace("D_SQUARED", "d")
MSE_BROKEN_LINE = next(i for i, line in enumerate(MSE_BROKEN.splitlines(), 1) if "d * dd" in line)

HUBER = '''import torch


class ModelNew(torch.nn.Module):
    def forward(self, predictions, targets):
        return torch.nn.functional.smooth_l1_loss(predictions, targets, beta=BETA)
'''

COSINE_SLOW = '''import torch


class ModelNew(torch.nn.Module):
    def forward(self, predictions, targets):
        for _ in range(64):  # recomputed: the slow first version
            sim = torch.nn.functional.cosine_similarity(predictions, targets, dim=1)
        return torch.mean(1 - sim)
'''
COSINE_FAST = COSINE_SLOW.replace("        for _ in range(64):  # recomputed: the slow first version\n    ", "")

RIGHT_FIRST_TIME = {
    "cross_entropy": "return torch.nn.functional.cross_entropy(predictions, targets)",
    "hinge": "return torch.mean(torch.clamp(1 - predictions * targets, min=0))",
    "kl_div": 'return torch.nn.functional.kl_div(torch.log(predictions), targets, reduction="batchmean")',
}
TRIPLET = '''import torch


class ModelNew(torch.nn.Module):
    def __init__(self, margin=1.0):
        super().__init__()
        self.margin = margin

    def forward(self, anchor, positive, negative):
        return torch.nn.functional.triplet_margin_loss(anchor, positive, negative, margin=self.margin)
'''


def _plain(body: str) -> str:
    return f'''import torch


class ModelNew(torch.nn.Module):
    def forward(self, predictions, targets):
        {body}
'''


def code_for(task: str, feedback: str, evolving: bool, previous: str = "") -> str:
    """The ModelNew this scripted model writes for `task`, given the latest feedback it was shown
    and its own previous answer (a fix, once made, is kept)."""
    if task == "mse":
        fixed = (f"line {MSE_BROKEN_LINE} of your code: error:" in feedback and "dd" in feedback
                 and "not declared" in feedback)
        return MSE_FIXED if fixed or evolving or MSE_FIXED.strip() in previous else MSE_BROKEN
    if task == "huber":
        fixed = "Worst element at index" in feedback and "expected" in feedback and "got" in feedback
        fixed = fixed or evolving or "beta=1.0" in previous
        return HUBER.replace("BETA", "1.0" if fixed else "0.5")
    if task == "cosine":
        timed = "bandwidth floor" in feedback and "of the floor's speed" in feedback
        return COSINE_FAST if timed or evolving or COSINE_FAST.strip() in previous else COSINE_SLOW
    if task == "triplet":
        return TRIPLET
    return _plain(RIGHT_FIRST_TIME[task])


def answer(body: Any) -> Reply:
    """The reply to one chat-completions request body."""
    messages = body["messages"]
    first = messages[0]["content"]
    task = re.search(r"architecture \((\w+)\)", first).group(1)
    evolving = "### Parent 1:" in first
    feedback = messages[-1]["content"] if len(messages) > 1 else ""
    previous = messages[-2]["content"] if len(messages) > 2 else ""
    code = code_for(task, feedback, evolving, previous)
    return Reply(content=f"Here is the kernel.\n\n```python\n{code}```\n")
