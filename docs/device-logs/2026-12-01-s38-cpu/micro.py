import os, time, mmap, torch, statistics
torch.set_num_threads(1)
from pipeline.child import memfd, protocol as P
n, slot_values = 13, 512*512
fd = os.memfd_create("x")
slots = 16
at = memfd.inbox_offset(slot_values * slots * 8)
set_bytes = 2 * 512*512*4
os.ftruncate(fd, at + set_bytes * n)
out = memfd.Outbox(fd, slot_values, slots)
inbox = memfd.Inbox(fd, at, set_bytes, n)
like = [torch.randn(512,512), torch.randn(512,512)]
z = torch.zeros(512,512)
for rep in range(5):
    t0 = time.perf_counter_ns()
    sets = [inbox.inputs(i, like) for i in range(n)]
    t1 = time.perf_counter_ns()
    hs = [P.put(out, i, z) for i in range(n)]
    t2 = time.perf_counter_ns()
    hs2 = [P.header_of(z) for i in range(n)]
    t3 = time.perf_counter_ns()
    for i in range(n): out.write_tensors(i, [z])
    t4 = time.perf_counter_ns()
    msg = P.BoundDone(index=1, outputs=hs).model_dump_json()
    t5 = time.perf_counter_ns()
    print(f"views {(t1-t0)/1e6:.3f} put {(t2-t1)/1e6:.3f} header {(t3-t2)/1e6:.3f} write {(t4-t3)/1e6:.3f} json {(t5-t4)/1e6:.3f}")
