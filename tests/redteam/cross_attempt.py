"""Exploit: remember something from one attempt to the next (answers, seeds, a warmed cache).

At import the candidate looks for what an earlier attempt left, then tries to leave its own mark, in
every place that could outlive the attempt: /dev/shm, the build dir ($TORCH_EXTENSIONS_DIR), /tmp,
the folder above its HOME, and HOME itself (private to the attempt). It prints what it found and
what it could write (KGEN-NOTE found/wrote PATH), and a hash of its first trial's inputs (KGEN-NOTE
inputs HASH) to show whether seeds repeat. The test fills in TAG so runs do not collide.
Why it fails: the child can write only its own HOME, removed with the attempt; every attempt draws
fresh seeds, but for a batch's siblings (one task, turn and generation), which share one draw and
still find nothing."""
from torch.utils.cpp_extension import load_inline  # noqa: F401,E402 (names an extension: a build child imports it too)
import hashlib
import os
import sys

import torch
import torch.nn as nn

TAG = "__KGEN_TAG__"
_name = f"kgen-redteam-{TAG}"
_home = os.environ["HOME"]
_places = ["/dev/shm", os.environ.get("TORCH_EXTENSIONS_DIR", ""), "/tmp", os.path.dirname(_home), _home]
for _dir in [d for d in _places if d]:
    _path = os.path.join(_dir, _name)
    try:
        with open(_path) as f:
            print(f"KGEN-NOTE found {_path} {f.read().strip()}", flush=True)
    except OSError:
        pass
    try:
        with open(_path, "w") as f:
            f.write(str(os.getpid()))
        print(f"KGEN-NOTE wrote {_path}", flush=True)
    except OSError as exc:
        print(f"KGEN-NOTE denied {_path} {type(exc).__name__}", flush=True)

_SEEN = []


def _called_from(name):
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != name:
        frame = frame.f_back
    return frame is not None


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        if not _SEEN and _called_from("trial"):
            digest = hashlib.sha256(predictions.numpy().tobytes() + targets.numpy().tobytes()).hexdigest()[:16]
            _SEEN.append(digest)
            print(f"KGEN-NOTE inputs {digest}", flush=True)
        return torch.mean((predictions - targets) ** 2)
