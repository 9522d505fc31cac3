"""The red team's forged clock, and the rule for judging it, shared by the cpu and GPU tests.

`forged_clock` is tests/redteam/forged_time_blocks.py (torch's mse; its time_blocks claims FACTOR of
each call's real time) at another factor, or with another forward. The rule, over N rounds of a
forger evaluated in turn with its honest twin: each forging evaluation is refused or correct, the
forger's median time is within TWIN_RATIO of the twin's, and at most STRAY_RATE of its evaluations
read under the twin's median / TWIN_RATIO (the spread between processes at calls of microseconds)."""

from __future__ import annotations

import math
import statistics

from pathlib import Path
from typing import Callable

from pipeline.judge import evaluate
from pipeline.judge.bench import prepare
from pipeline.records import EvalResult, Verdict

REDTEAM = Path(__file__).resolve().parent / "redteam"
TWIN_RATIO = 1.3
# A forged clock is never read, so forger and twin are one distribution: on the H100 one forging
# evaluation in 8 read under its twin's / 1.3 at 20 us (docs/decisions/gpu-timing.md).
STRAY_RATE = 0.25
MSE_FORWARD = "def forward(self, predictions, targets):\n        return torch.mean((predictions - targets) ** 2)"


def forged_clock(factor: float | str, forward: str | None = None) -> str:
    """The forged clock's source at `factor`; `forward` replaces its mse forward (a whole def)."""
    text = (REDTEAM / "forged_time_blocks.py").read_text()
    assert "FACTOR = 0.1\n" in text and MSE_FORWARD in text, "forged_time_blocks.py changed its form"
    return text.replace("FACTOR = 0.1\n", f"FACTOR = {factor}\n").replace(MSE_FORWARD, forward or MSE_FORWARD)


def load_unfit(result: EvalResult) -> bool:
    """Judged on a cpu too loaded to time (pipeline.verdicts): correct, its timing marked unfit,
    so it never reaches `best` or the library and a resume re-times it. On an idle box its clock's
    refusal is the verdict. (A GPU's result never carries this mark.)"""
    return result.verdict is Verdict.correct and (result.device_unfit or "").startswith("the cpu was loaded")


def no_figure(result: EvalResult) -> bool:
    """Judged correct on a cpu too loaded to time it, after the judge's retries, or whose calls were
    too short to time there (pipeline.verdicts): then it must carry no figure at all (the rule), which
    this asserts; False where it was timed."""
    short = result.verdict is Verdict.correct and (result.device_unfit or "").startswith("the calls are too short")
    if not (load_unfit(result) or short):
        return False
    assert result.time_ms is None and result.speedup_eager is None and result.timing is None, result
    return True


# On the cpu the parent's clock is the only one: a clock forged inside the child moves nothing, and
# a candidate that is eager's own ops reads about 1x (0.8-1.0 beside a running suite). A figure
# read from a clock forged to a tenth would be about 10x.
UNEARNED_X = 2.0


def gains_nothing(r: EvalResult) -> None:
    """A forged clock judged on the cpu: correct and trusted as its honest twin is, and, where it was
    timed, under UNEARNED_X eager (its forward is eager's own ops)."""
    assert r.verdict is Verdict.correct and r.trusted, (r.verdict, r.error, r.untrusted_reason)
    assert no_figure(r) or r.speedup_eager < UNEARNED_X, (r.speedup_eager, r.time_ms, r.eager_beside)
    # One clock, one figure: the recorded median is the parent's estimate, however many calls a request held.
    assert no_figure(r) or abs(r.time_ms - r.wall_ms_per_call) <= 1e-9 * r.wall_ms_per_call, (r.time_ms, r.wall_ms_per_call)


def assert_refused_or_near_twin(results: list[tuple[str, EvalResult]], honest: Callable[[EvalResult], None],
                                forger: Callable[[EvalResult], None] | None = None) -> None:
    """`results` as judge_in_turn returns them, (name, result): `honest` checks every "honest" one.
    `forger`, where given, checks every other; else each other name is the rule's forger: every
    evaluation impossible_timing or correct (with no figure where its timing was unfit); the timed
    ones' median at least the twin's median / TWIN_RATIO; and at most STRAY_RATE of them (rounded up)
    under it."""
    twin = [r.time_ms for name, r in results if name == "honest" and r.time_ms is not None]
    for name, r in results:
        if name == "honest":
            honest(r)
        elif forger is not None:
            forger(r)
    if forger is not None:
        return
    floor = statistics.median(twin) / TWIN_RATIO
    for name in dict.fromkeys(n for n, _ in results if n != "honest"):
        mine = [r for n, r in results if n == name]
        assert all(r.verdict in (Verdict.correct, Verdict.impossible_timing) for r in mine), \
            [(name, r.verdict, r.error) for r in mine]
        times = [r.time_ms for r in mine if r.verdict is Verdict.correct and r.time_ms is not None]
        strays = [t for t in times if t < floor]
        assert not times or statistics.median(times) >= floor, (name, times, twin)
        assert len(strays) <= math.ceil(STRAY_RATE * len(mine)), (name, strays, times, twin)


def honest_and_trusted(r: EvalResult) -> None:
    assert r.verdict is Verdict.correct and r.trusted, (r.verdict, r.error, r.untrusted_reason, r.bound_note)


def judge_in_turn(task, size, device: str, settings, codes: dict[str, tuple[Path, Path]], rounds: int,
                  label: str) -> list[tuple[str, EvalResult]]:
    """Each of `codes` (name -> (source, build dir)) in order, `rounds` times over, on one bench of
    `task` at `size`; each result printed as a REDTEAM line tagged `label` (the GPU logs' grep)."""
    bench = prepare(task, size, device, settings)
    try:
        results = [(name, evaluate.evaluate(bench, code, build_dir, settings))
                   for _ in range(rounds) for name, (code, build_dir) in codes.items()]
    finally:
        bench.close()
    for name, r in results:
        ratio = r.time_ms / r.wall_ms_per_call if r.time_ms and r.wall_ms_per_call else None
        print(f"\nREDTEAM {label} {name}: {r.verdict.value} time_ms={r.time_ms} parent_ms={r.wall_ms_per_call} "
              f"ratio={ratio} trusted={r.trusted} error={r.error} bound={r.bound_note} "
              f"null_ms={r.baselines.null_ms if r.baselines else None} untrusted={r.untrusted_reason}")
    return results
