"""Exploit: take over the conversation. The import never returns: the candidate finds the result
pipe (`--result-fd` in sys.argv) and the harness's Evaluator (gc, for the job and the outbox), then
reads the parent's requests from stdin itself and answers every one with a forged reply: outputs
"written" (zeros in the outbox), timed calls of 1 microsecond. ModelNew itself returns zeros.

Why it fails: a reply is only a claim. The parent reads the values out of the outbox and compares
them with its own float64 reference, so trial 0 is a mismatch whatever the headers say; the times
would then meet the parent's own clock (pipeline.judge)."""
import gc
import os
import sys

import numpy as np
import torch
import torch.nn as nn

from pipeline.child import protocol as P

_fd = int(sys.argv[sys.argv.index("--result-fd") + 1])
# The harness runs as __main__: match its Evaluator by name, not by pipeline.child.harness's class.
_ev = next(o for o in gc.get_objects() if type(o).__name__ == "Evaluator" and hasattr(o, "outbox"))
_shape = list(_ev.job.out_shape)
_numel = int(np.prod(_shape)) if _shape else 1


def _header(slot):
    _ev.outbox.write_tensors(slot, [torch.zeros(_numel, dtype=torch.float64)])
    return P.OutputHeader(type="torch.Tensor", exact_tensor=True, shape=_shape, dtype="float32", device="cpu",
                          numel=_numel, written=True)


P.send(_fd, P.Imported())
while line := sys.stdin.readline():
    req = P.REQUEST.validate_json(line)
    if isinstance(req, P.Setup):
        P.send(_fd, P.SetupDone())
    elif isinstance(req, P.Trial):
        P.send(_fd, P.TrialDone(index=req.index, output=_header(0), after_sync=_header(1), repeat=_header(2)))
    elif isinstance(req, P.Bound):
        P.send(_fd, P.BoundDone(index=req.index, outputs=[_header(i) for i in range(len(req.seeds))]))
    elif isinstance(req, P.Profile):
        P.send(_fd, P.ProfileDone(total_us=1.0, torch_us=0.0, torch_fraction=0.0))
    else:
        break
os._exit(0)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.zeros(())
