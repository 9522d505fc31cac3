"""A neighbour for the cpu judge: `mem` copies 64 MB arrays back and forth (memory traffic), `spin` counts (none)."""
import sys, time
import numpy as np
end = time.time() + float(sys.argv[2])
if sys.argv[1] == "mem":
    a = np.ones(8 << 20); b = np.empty_like(a)
    while time.time() < end:
        np.copyto(b, a); np.copyto(a, b)
else:
    n = 0
    while time.time() < end:
        n += 1
