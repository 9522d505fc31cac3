"""test_grad's many-values test, N times on one bench, trial details printed on any failure."""
import sys, tempfile
from pathlib import Path
sys.path.insert(0, "tests")
import test_grad as T
from pipeline.judge import evaluate
from pipeline.child import tasks
from pipeline.judge.bench import prepare
task = tasks.discover(T.TEST_TASKS if hasattr(T, "TEST_TASKS") else Path("tests/tasks"), ["big_add"])[0]
bench = prepare(task, "small", "cpu", T.GRAD)
n = int(sys.argv[1]); bad = 0
try:
    for k in range(n):
        with tempfile.TemporaryDirectory() as d:
            code = Path(d) / "add.py"
            code.write_text("import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n        return a + b\n")
            (Path(d) / "build").mkdir()
            r = evaluate.evaluate(bench, code, Path(d) / "build", T.GRAD)
            if r.verdict.value != "correct":
                bad += 1
                print("RUN", k, r.verdict.value, r.error)
                for t in r.trials:
                    print("  TRIAL", t.model_dump_json()[:600])
finally:
    bench.close()
print("bad", bad, "of", n)
