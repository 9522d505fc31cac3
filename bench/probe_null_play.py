"""GPU smoke of the null request moved to pipeline.child.replays and the off-lane warm-up."""
import time
from pathlib import Path
from pipeline.child import replays, tasks
from pipeline.judge.compiling import CompilerWarmup
task = tasks.discover(Path("reference_tasks"), ["mse"])[0]
module = tasks.load_module(task, "small", "float32")
c = replays.null_request(module, 4, 512, [], "cuda")
for i in range(5):
    t = time.perf_counter(); c.play(i); print("NULLPLAY ms", round((time.perf_counter() - t) * 1e3, 3))
w = CompilerWarmup("cuda", False, off_lane=True); print("WARM", w.join())
