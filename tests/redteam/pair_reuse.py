"""Exploit: answer a set's later replays in a play from its first one.

A replayed request's sets hold base values when the forward first runs on them (outside the
capture); each replay rewrites its set as base x (1 + (f - 1) x mask). Under one mask a request, a
set's replays differ only by a = f - 1: p - t = D + a E, with D the bases' difference and E fixed
for the play, so mse is mean(D^2) + 2a mean(DE) + a^2 mean(E^2). The candidate keeps each set's
bases (by address) outside the capture; in the capture, a set's first replay computes honestly and
keeps the three sums and one element of p - base; its later replays read that one element for
their a (over the first's) and answer from the sums: two tiny kernels, digests intact.

Why it should fail: no (set, mask) pair comes twice in a play (pipeline.child.replays.layout): a
set's later replays are under other masks, the ratio read from one element is not the others', and
the checked replays' digests are not the reference's (mismatch). Outside a capture it computes honestly.
"""
import torch
import torch.nn as nn

_BASE = {}  # p's address -> copies of (p, t) as the forward saw them outside a capture
_SEEN = {}  # p's address -> (sums, element index, that element of p - base) from its first replay


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        p, t = predictions, targets
        key = p.data_ptr()
        if p.is_cuda and torch.cuda.is_current_stream_capturing() and key in _BASE:
            bp, bt = _BASE[key]
            if key not in _SEEN:
                d, e = bp - bt, (p - bp) - (t - bt)
                sums = torch.stack([(d * d).mean(), (d * e).mean(), (e * e).mean()])
                idx = (p - bp).abs().reshape(-1).argmax().view(1)
                _SEEN[key] = (sums, idx, (p - bp).reshape(-1).index_select(0, idx))
                return torch.mean((p - t) ** 2)
            sums, idx, first = _SEEN[key]
            rho = ((p.reshape(-1).index_select(0, idx) - bp.reshape(-1).index_select(0, idx)) / first).reshape(())
            return sums[0] + 2 * rho * sums[1] + rho * rho * sums[2]
        if p.is_cuda and not torch.cuda.is_current_stream_capturing():
            _BASE[key] = (p.detach().clone(), t.detach().clone())
            _SEEN.pop(key, None)
        return torch.mean((p - t) ** 2)
