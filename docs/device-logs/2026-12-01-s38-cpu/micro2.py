import os, time, mmap, torch, ctypes, numpy as np
torch.set_num_threads(1)
fd = os.memfd_create("x"); os.ftruncate(fd, 64<<20)
m = mmap.mmap(fd, 64<<20)
z = torch.randn(512,512)
nb = z.numel()*4
priv = torch.empty(nb, dtype=torch.uint8)
def bench(name, f):
    ts=[]
    for r in range(30):
        t0=time.perf_counter_ns(); f(r%13); ts.append((time.perf_counter_ns()-t0)/1e6)
    ts.sort(); print(f"{name:12s} median {ts[15]:.3f} min {ts[0]:.3f} ms per MB")
view8 = torch.frombuffer(m, dtype=torch.uint8)
view32 = torch.frombuffer(m, dtype=torch.float32)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
bench("u8 copy_", lambda i: view8[i*nb:(i+1)*nb].copy_(z.reshape(-1).view(torch.uint8)))
bench("f32 copy_", lambda i: view32[i*(nb//4):(i+1)*(nb//4)].copy_(z.reshape(-1)))
bench("memmove", lambda i: ctypes.memmove(addr + i*nb, z.data_ptr(), nb))
bench("priv u8", lambda i: priv.copy_(z.reshape(-1).view(torch.uint8)))
