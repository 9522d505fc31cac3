"""Exploit: answer a replayed Bound request from work done at its (untimed) capture.

A replayed request's sets are filled with base values, the forward is run on each (outside the
capture), then captured into CUDA graphs; in the timed `Play` each replay rewrites a set from its
base. With a scalar factor per replay (base x f), mse is homogeneous of degree 2: the replay's
answer is f^2 times the base's. So the candidate keeps mean((p - t)^2) of each set it sees
outside a capture, keyed by the buffer's address, and inside a capture records only: f from the
first element of p over the base's, and f^2 times the kept answer. Its replays then cost two tiny
kernels, whatever the size, and their digests match the reference's.

Why it should fail: each input is perturbed per element, base x (1 + (f - 1) x mask), the mask drawn
from the play's seed (pipeline.child.replays): f read from one element is not the other elements'
factor, the answer is wrong, and the checked replays' digests are not the reference's (mismatch).
Outside a capture (trials, Bound requests that are not replayed) it computes honestly.
"""
import torch
import torch.nn as nn

_BASE = {}  # p's address -> (first base value of p, base answer), device tensors


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        if predictions.is_cuda and torch.cuda.is_current_stream_capturing():
            kept = _BASE.get(predictions.data_ptr())
            if kept is not None:
                first, answer = kept
                f = predictions.reshape(-1)[:1] / first
                return (answer * f * f).reshape(())
        out = torch.mean((predictions - targets) ** 2)
        if predictions.is_cuda:
            _BASE[predictions.data_ptr()] = (predictions.reshape(-1)[:1].clone(), out.detach().clone().reshape(1))
        return out
