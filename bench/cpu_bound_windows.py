"""Probe: every window the parent timed in one cpu evaluation, the task's own Model as the candidate.

    python bench/cpu_bound_windows.py TASK SIZE [--grad]      e.g. hinge odd

Prints each calibration and Bound window (ms, calls, what the run queues took of it), each timed
block's window and claimed calls, then the parent's per-call estimates, the blocks' means, the verdict
and the phases. The twentieth session found with it that a one-call Bound request cost hinge at "odd"
2.5x a block's later calls, no run-queue wait in it (docs/benchmarks.md, "Twentieth session").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from pipeline.judge import judge as J  # noqa: E402
from pipeline.judge import session as S  # noqa: E402
import test_honest as H  # noqa: E402  (the honest tests' settings and judge_the_reference)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("task")
    ap.add_argument("size")
    ap.add_argument("--grad", action="store_true")
    args = ap.parse_args()
    timing = S.Session.timing

    def shown(self):
        verdict = timing(self)
        threads = self.settings.cpu_threads
        for kind, windows in (("calibration", self.calibration), ("bound", self.bound_windows)):
            for w in windows:
                print(f"{kind:11} {w.ms:8.3f} ms {w.calls} calls, less load {J.unloaded_ms(w, threads):8.3f} ms ({w.load})")
        for claimed, w in self.timed:
            print(f"timed block {w.ms:8.3f} ms, claims {[round(x, 3) for x in claimed]}")
        print("estimates a call", [round(x, 4) for x in self.evidence.per_call], "block means",
              [round(x, 4) for x in self.evidence.means], "estimate", self.estimate)
        return verdict

    S.Session.timing = shown
    with tempfile.TemporaryDirectory() as folder:
        r = H.judge_the_reference(args.task, args.size, "cpu", Path(folder), H.SETTINGS.model_copy(update={"grad": args.grad}))
    print(r.verdict.value, r.error or "", "time", r.time_ms, "estimate", r.wall_ms_per_call)
    print("phases", r.phases)


if __name__ == "__main__":
    main()
