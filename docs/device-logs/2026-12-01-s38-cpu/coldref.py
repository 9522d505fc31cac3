import sys, statistics, torch
sys.path.insert(0, ".")
torch.set_num_threads(1)
from pipeline.child import tasks
from pipeline.child.grad import ForwardBackward
from pipeline.child.timing import Clock, time_cold
from pathlib import Path
task = tasks.discover(Path("tests/tasks"), ["big_add"])[0]
module = tasks.load_module(tasks.load_file(task.path), "small", None)
m = tasks.make_model(module, module.Model, 1, "cpu")
fb = ForwardBackward(m, 7)
clock = Clock("cpu")
for k in range(8):
    sets = [tasks.make_inputs(module, 100 * k + i, "base", "cpu") for i in range(6)]
    t = time_cold(clock, [lambda x: fb(*x)], sets)[0]
    print([round(x, 3) for x in t])
