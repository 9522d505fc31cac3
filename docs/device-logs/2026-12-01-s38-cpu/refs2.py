"""Each bundled reference as its own candidate on the cpu, N times: verdict, x eager (its own twin in the reference), the judge's note.
    python refs2.py ROOT RUNS [SIZE] [grad]"""
import sys, tempfile, os
from pathlib import Path
ROOT = Path(sys.argv[1]); sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import test_honest as H
runs = int(sys.argv[2]); size = sys.argv[3] if len(sys.argv) > 3 else "odd"
grad = len(sys.argv) > 4 and sys.argv[4] == "grad"
for name in (os.environ["TASKS"].split(",") if os.environ.get("TASKS") else H.TASKS):
    for i in range(runs):
        r = H.judge_the_reference(name, size, "cpu", Path(tempfile.mkdtemp()), H.SETTINGS.model_copy(update={"grad": grad}))
        print(f"{name} {size} {'grad' if grad else 'fwd'} {i} {r.verdict.value}{'*' if r.first_refusal else ''} time {r.time_ms} "
              f"x_eager {r.speedup_eager} unfit {bool(r.device_unfit)} {(r.error or '')[:120]}", flush=True)
