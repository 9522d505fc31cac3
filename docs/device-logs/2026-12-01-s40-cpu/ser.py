import sys, time
sys.path.insert(0, "/work/main")
import torch
from pipeline.child import protocol as P, memfd
fd = memfd.Outbox.create(1 << 24)
out = memfd.Outbox(fd, 1 << 10, 256)
kept = [P.copy_quick(out, i, torch.zeros(())) for i in range(128)]
times = [0.01234567] * 128
for rep in range(5):
    t0 = time.perf_counter()
    hs = [P.OutputHeader(**P.fields_of(k)) for k in kept]
    t1 = time.perf_counter()
    msg = P.BoundDone(index=3, outputs=hs, times_ms=times)
    t2 = time.perf_counter()
    line = P.dump(msg) if hasattr(P, "dump") else msg.model_dump_json()
    t3 = time.perf_counter()
    back = P.REPLY.validate_json(line)
    t4 = time.perf_counter()
    print(f"headers {1e3*(t1-t0):.3f} ms  done {1e3*(t2-t1):.3f}  json {1e3*(t3-t2):.3f}  parse {1e3*(t4-t3):.3f}  bytes {len(line)}")
