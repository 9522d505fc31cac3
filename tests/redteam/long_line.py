"""Exploit: exhaust the parent's memory through the result pipe. At import the candidate writes an
endless reply line (2 MiB of JSON-looking text, no newline) to `--result-fd`: a parent that buffers
a line until its newline grows without limit. Why it fails: a line over MAX_LINE (1 MiB) is a
protocol error, and the parent stops reading there."""
import os
import sys

import torch.nn as nn

_fd = int(sys.argv[sys.argv.index("--result-fd") + 1])
_chunk = b'{"event": "imported", "pad": "' + b"x" * 65500
for _ in range(32):
    os.write(_fd, _chunk)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return predictions.sum()
