"""Temporary GPU smoke test of the sandboxed harness with /proc narrowed (removed after use)."""
import os, sys, tempfile, textwrap
from pathlib import Path
sys.path.insert(0, os.getcwd())
from pipeline import sandbox, tasks, landlock, harness

print("landlock abi", landlock.abi_version(), "proc paths", harness.proc_paths()[:3])
CU = textwrap.dedent('''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline
cuda_src = r"""
#include <torch/extension.h>
__global__ void sq(const float* a, const float* b, float* acc, long n) {
  __shared__ float s[256]; float v = 0.f;
  for (long i = blockIdx.x * 256L + threadIdx.x; i < n; i += 256L * gridDim.x) { float d = a[i] - b[i]; v += d * d; }
  s[threadIdx.x] = v; __syncthreads();
  for (int k = 128; k > 0; k >>= 1) { if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k]; __syncthreads(); }
  if (threadIdx.x == 0) atomicAdd(acc, s[0]);
}
torch::Tensor mse(torch::Tensor a, torch::Tensor b) {
  auto acc = torch::zeros({}, a.options());
  long n = a.numel();
  sq<<<512, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), acc.data_ptr<float>(), n);
  return acc / (double)n;
}
"""
_ext = load_inline(name="kgen_smoke_mse", cpp_sources="torch::Tensor mse(torch::Tensor a, torch::Tensor b);",
                   cuda_sources=cuda_src, functions=["mse"], extra_cuda_cflags=["-O3"])
class ModelNew(nn.Module):
    def forward(self, p, t):
        return _ext.mse(p.contiguous(), t.contiguous())
''')
FALLBACK = "import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, p, t):\n        return torch.mean((p - t) ** 2)\n"

root = Path(tempfile.mkdtemp())
task = Path("reference_tasks/mse.py").resolve()
plan = {"init_seed": 1, "sample_seed": 2, "size": "small",
        "trials": [{"index": i, "seed": 100 + i, "variant": v, "size": "small", "repeat": True}
                   for i, v in enumerate(tasks.VARIANTS)],
        "shape_trials": [{"index": 4, "seed": 7, "variant": "scaled", "size": "odd"}],
        "timed": [10, 11, 12], "warmup": 2, "profile": True, "floor_slack": 0.85}
for name, src, needs_build in (("cuda_ext", CU, True), ("fallback", FALLBACK, False)):
    code = root / f"{name}.py"; code.write_text(src)
    build_dir = root / f"build_{name}"; build_dir.mkdir()
    env = {"TORCH_EXTENSIONS_DIR": str(build_dir), "MAX_JOBS": "16"}
    if needs_build:
        child = sandbox.start("pipeline.harness", ["build", str(code)], 600, env)
        msg = child.receive(); rc, log = child.finish()
        print(f"[{name}] build", msg, rc); print(log[-1500:])
    job = {"task_path": str(task), "size": "small", "code_path": str(code), "device": "cuda", "memory_gb": 16}
    child = sandbox.start("pipeline.harness", ["eval"], 300, env)
    child.send(job)
    while (m := child.receive()) is not None:
        ev = m.get("event")
        if ev == "imported":
            child.send(plan)
        short = {k: v for k, v in m.items() if k not in ("output", "output_after_sync", "repeat", "outputs", "traceback", "_at")}
        if "output" in m:
            short["finite"] = m["output"].get("finite"); short["dtype"] = m["output"].get("dtype")
        print(f"[{name}]", ev, short)
        if ev in ("done", "load_failed"):
            break
    rc, log = child.finish()
    print(f"[{name}] exit", rc); print(log[-2000:])
