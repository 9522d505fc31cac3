"""Which use of CUDA graphs leaves torch's CUDA generator unusable ("Offset increment outside graph
capture encountered unexpectedly") for pipeline/child/replays.py: each variant in a fresh process."""
import subprocess
import sys

VARIANTS = {
    "plain": "out = zeros()",
    "sin": "f = 1 + 0.05 * torch.sin(count * 0.7)\n        out = zeros()",
    "dot": "out = zeros(); d = torch.dot(out.reshape(-1), w)",
    "index_copy": "out = zeros(); digests.index_copy_(0, (count - 1).long().view(1), torch.dot(out.reshape(-1), w).view(1))",
    "dot_warm": "out = zeros(); d = torch.dot(out.reshape(-1), w)",
    "failed_capture_then_clean": "FAIL",
    "replays_module": None,
}
BODY = """
import torch
dev = "cuda"
w = torch.randn(1024, device=dev)
digests = torch.zeros(8, device=dev)
count = torch.zeros((), device=dev)
zeros = lambda: torch.zeros(1024, device=dev)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
        count.add_(1.0)
        {line}
g.replay(); torch.cuda.synchronize()
torch.manual_seed(1); x = torch.randn(10, device=dev); torch.cuda.synchronize()
print("OK")
"""
MODULE = """
import sys, torch
sys.path.insert(0, ".")
from pipeline.child import replays, tasks
from pathlib import Path
task = tasks.load_file(Path("reference_tasks/mse.py"))
module = tasks.load_module(task, "small")
shape = ()
null = lambda *a: torch.zeros(shape, device="cuda")
replays.replay(null, module, [1, 2, 3, 4], 16, 5, 1, "cuda")
torch.manual_seed(1); x = torch.randn(10, device="cuda"); torch.cuda.synchronize()
print("OK")
"""
FAIL = """
import sys, torch
sys.path.insert(0, ".")
from pipeline.child import replays
x = torch.zeros(4, device="cuda")
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        x.add_(1); x.sum().item()  # a host sync: capture fails
except Exception as exc:
    print("capture failed:", type(exc).__name__)
replays._clean_capture("cuda")
torch.manual_seed(1); y = torch.randn(10, device="cuda"); torch.cuda.synchronize()
print("OK")
"""
for name, line in VARIANTS.items():
    code = MODULE if line is None else FAIL if line == "FAIL" else BODY.replace("{line}", line)
    if name == "dot_warm":
        code = code.replace("g = torch.cuda.CUDAGraph()", "torch.dot(w, w); torch.cuda.synchronize()\ng = torch.cuda.CUDAGraph()")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = (p.stdout + p.stderr).strip().splitlines()
    errors = [l for l in lines if "Error" in l][-2:]
    print(f"GRAPHRNG {name}: rc={p.returncode} {lines[-1:]} {errors}", flush=True)
