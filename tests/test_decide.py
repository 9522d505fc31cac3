"""Measure, then decide (pipeline.verdicts): a pure rule, tested as a table.

fixtures/decide/recorded.jsonl holds what real evaluations ended with: on the 2-core cpu box, idle and
beside two busy loops (bench/cpu_load.py --record: the honest fused mse, torch's mse with its clock
forged to a tenth, the forger that loads the box itself, two references), and on an H100 (derived from
the stored results of KernelBench drop-ins and the batch of 56, and two refusals of the CUDA red team).
Each line's `source` says which. The rows below them are built by hand for the rules no recorded run
reached (a room below what the config requires, processes that outlived the attempt, a loose bound).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.verdicts import Again, Clock, Decision, Measured, decide
from pipeline.policy import POLICY
from pipeline.records import EvalResult, Flag, Outcome, Standing, Verdict

pytestmark = pytest.mark.fast

RECORDED = [json.loads(line) for line in
            (Path(__file__).resolve().parents[1] / "fixtures" / "decide" / "recorded.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("row", RECORDED, ids=[f"{r['device'][:4]}-{r['load']}-{i}" for i, r in enumerate(RECORDED)])
def test_each_recorded_measurement_gets_the_outcome_it_got(row):
    assert decide(Measured(**row["measured"])) == Decision(**row["decision"])


def test_the_recorded_table_covers_cpu_and_gpu_idle_and_loaded_honest_and_forged():
    kinds = {(r["device"] == "cpu", r["load"], "forged" in r["candidate"]) for r in RECORDED}
    # The GPU's forged rows were refusals of the two-clock tree (the child's clock against the parent's);
    # under one clock a forged child clock is never read: GPU rows of it come with the next GPU run.
    assert {(True, "idle", False), (True, "loaded", False), (True, "idle", True), (True, "loaded", True),
            (False, "idle", False)} <= kinds


def test_an_honest_kernel_keeps_its_figure_idle_and_beside_busy_loops():
    honest = [r for r in RECORDED if r["candidate"] in ("honest_fast_mse", "mse", "hinge")]
    assert {r["load"] for r in honest} == {"idle", "loaded"}
    assert all(decide(Measured(**r["measured"])).outcome.standing is Standing.kept for r in honest)


def test_calls_of_microseconds_keep_a_figure_only_where_the_nulls_hold_still():
    """The lean forger and its honest twin at 32 x 32 (an add of a few microseconds; 128 calls a request):
    past POLICY.cpu_noise no figure, under it kept (0.61-1.35x eager when recorded); every reference at
    "small" and the fused mse beside them, idle and loaded, stayed far under the line."""
    add = [r for r in RECORDED if "32 x 32" in r["source"]]
    assert len(add) == 32 and {r["load"] for r in add} == {"idle", "loaded"}
    noisy = [r["measured"]["clock"]["noise"] > POLICY.cpu_noise for r in add]
    assert 0 < sum(noisy) < len(add)
    for r, over in zip(add, noisy):
        d = decide(Measured(**r["measured"]))
        assert (d.figure, d.outcome.standing is Standing.unfit) == (not over, over)
        assert not over or d.outcome.why.startswith("the calls are too short to time here: the null request varies")
    small = [r for r in RECORDED if "policy 12" in r["source"] and "32 x 32" not in r["source"]]
    assert len(small) == 60 and max(r["measured"]["clock"]["noise"] for r in small) < POLICY.cpu_noise / 2


def test_a_forger_that_loads_the_box_itself_gets_no_figure_while_its_load_is_over_the_line():
    """Its own spinners put 52-64% of its windows in run-queue waits: at the policy's line or over it the
    timing is no figure and it is judged again afresh; under it the figure is its own (the parent's
    clock: 0.79-0.82x eager when that happened, no faster than torch's mse, bench/cpu_load.py)."""
    launder = [r for r in RECORDED if r["candidate"].startswith("load_launder")]
    assert sum(r["measured"]["clock"]["load_share"] >= POLICY.loaded_share for r in launder) >= len(launder) // 2
    for r in launder:
        d = decide(Measured(**r["measured"]))
        over = r["measured"]["clock"]["load_share"] >= POLICY.loaded_share
        assert (d.outcome.standing is Standing.unfit, d.again is Again.fresh, d.figure) == (over, over, not over)
        assert not over or d.outcome.why.startswith("the cpu was loaded")


def test_a_gpu_batch_s_disturbed_requests_are_timed_again_and_its_others_keep_their_figure():
    """The batch of 56 on an H100 with the parent unpinned beside its builds (policy 10): 8 of 40 honest
    attempts lost their figure (every request no longer than its null) or were put under their
    bandwidth floor, and one was kept at a sixth of its speed from requests 2.2 times their median
    apart. Each of those 9 is now judged again afresh; every other keeps its figure."""
    batch = [r for r in RECORDED if r["load"] == "batch"]
    assert len(batch) == 40
    decisions = [decide(Measured(**r["measured"])) for r in batch]
    again = [d for d in decisions if d.again is Again.retime]
    assert len(again) == 9 and all(d.error or d.outcome.standing is Standing.unfit for d in again)
    assert sum(d.outcome.why is not None and d.outcome.why.startswith("the requests disagree") for d in again) == 2
    assert all(d.outcome.standing is Standing.kept and d.error is None and d.figure
               for d in decisions if d.again is Again.no)


ROOM = dict(verdict=Verdict.correct, findings=[Flag.no_custom_kernel], missing=[])


@pytest.mark.parametrize("facts, standing, why", [
    ({}, Standing.kept, None),
    ({"missing": ["seccomp", "netns"]}, Standing.untrusted, "confinement below what the config requires: no seccomp, netns"),
    ({"missing": None}, Standing.untrusted, "the child never reported its confinement"),
    ({"left": "pid 4242 (python)"}, Standing.untrusted, "processes of the attempt outlived it: pid 4242 (python)"),
    ({"loose_bound": "the bound is loose"}, Standing.untrusted, "the bound is loose"),
    ({"loose_bound": "the bound is loose", "verdict": Verdict.mismatch}, Standing.kept, None),  # no figure to doubt
    ({"unfit": "a 1 ms hold took 1.9 ms"}, Standing.unfit, "a 1 ms hold took 1.9 ms"),
    # the room comes first: never kept, whatever the device; the unfit reason is said beside it
    ({"missing": ["seccomp"], "unfit": "a 1 ms hold took 1.9 ms"}, Standing.untrusted,
     "confinement below what the config requires: no seccomp; not timed: a 1 ms hold took 1.9 ms"),
    ({"missing": ["seccomp"], "left": "pid 1"}, Standing.untrusted, "confinement below what the config requires: no seccomp"),
])
def test_the_rules_no_recorded_run_reached(facts, standing, why):
    d = decide(Measured(**(ROOM | facts)))
    outcome = d.outcome
    assert (outcome.standing, outcome.why, d.again, d.figure) == (standing, why, Again.no, "unfit" not in facts)
    assert outcome.verdict is facts.get("verdict", Verdict.correct) and outcome.findings == [Flag.no_custom_kernel]


def test_measured_is_frozen_and_names_every_fact():
    m = Measured(**ROOM)
    with pytest.raises(Exception):
        m.unfit = "late"  # type: ignore[misc]
    with pytest.raises(Exception):
        Measured(verdict=Verdict.correct)  # `missing` must be said: None means the room never reported


def test_a_result_stored_before_the_outcome_reads_into_one():
    old = {"verdict": "correct", "flags": ["no_custom_kernel", "shape_specialized"], "claimed_flags": ["shape_specialized"],
           "trusted": True, "device_unfit": "the cpu was loaded: 40% of the timed windows went to run-queue waits",
           "first_refusal": "the child's clock says 0.004 ms", "error": None}
    result = EvalResult.model_validate_json(json.dumps(old))
    assert result.outcome == Outcome(verdict=Verdict.correct, findings=[Flag.no_custom_kernel],
                                     claims=[Flag.shape_specialized], standing=Standing.unfit, why=old["device_unfit"],
                                     earlier=old["first_refusal"])
    assert result.device_unfit == old["device_unfit"] and result.trusted and result.flags == [Flag.no_custom_kernel,
                                                                                              Flag.shape_specialized]
    untrusted = EvalResult.model_validate({**old, "trusted": False, "untrusted_reason": "no seccomp"})
    assert (untrusted.outcome.standing, untrusted.untrusted_reason, untrusted.device_unfit) == (Standing.untrusted,
                                                                                                 "no seccomp", None)


def test_processes_seen_left_by_the_room_are_named_by_pid():
    """What evaluate passes for the room's leftovers (sandbox.Child.left: pids), as decide reads it."""
    from pipeline.judge.evaluate import _pids

    outcome = decide(Measured(**(ROOM | {"left": _pids([24128, 24130])}))).outcome
    assert outcome.why == "processes of the attempt outlived it: pid 24128, pid 24130"
    assert _pids([]) is None and decide(Measured(**(ROOM | {"left": _pids([])}))).outcome.standing is Standing.kept


FLOORED = dict(floor_ms=0.5, input_bytes=8_000_000, bandwidth_gbs=16.0, floor_slack=0.85)


@pytest.mark.parametrize("facts, clock, verdict, standing, why, again", [
    # the bandwidth floor x its slack: 0.4 ms for 8 MB is under 0.425, impossible; 0.43 is not
    ({}, dict(ms=0.4, **FLOORED), Verdict.impossible_timing, Standing.kept, None, Again.no),
    ({}, dict(ms=0.43, **FLOORED), Verdict.correct, Standing.kept, None, Again.no),
    # the compute floor, where it is checked (the bench leaves it out of the clock where it is off)
    ({}, dict(ms=0.43, compute_floor_ms=1.0, flops=10**9, flops_per_s=10**12, **FLOORED), Verdict.impossible_timing,
     Standing.kept, None, Again.no),
    # half the requests no longer than a null request: no figure, before any floor; not the load's retry
    ({}, dict(ms=0.0, requests=8, empty=4, **FLOORED), Verdict.correct, Standing.unfit,
     "the calls are too short to time here: 4 of 8 Bound requests took no longer than a null request", Again.no),
    # the null requests vary by more than POLICY.cpu_noise of a request's calls: no figure (microseconds a call)
    ({}, dict(ms=0.002, requests=8, noise=0.36, **FLOORED | {"floor_ms": 0.0001}), Verdict.correct, Standing.unfit,
     "the calls are too short to time here: the null request varies by 36% of a request's calls", Again.no),
    ({}, dict(ms=0.002, requests=8, noise=0.25, **FLOORED | {"floor_ms": 0.0001}), Verdict.correct, Standing.kept,
     None, Again.no),
    # the load's share at the policy's line: no figure, judged afresh; just under it the figure stands
    ({}, dict(ms=1.0, requests=8, load_share=0.6), Verdict.correct, Standing.unfit,
     "the cpu was loaded: 60% of the timed windows went to run-queue waits (other processes, or the candidate's own threads)",
     Again.fresh),
    ({}, dict(ms=1.0, requests=8, load_share=0.599), Verdict.correct, Standing.kept, None, Again.no),
    # an unfit device says so first, and is not the load's retry (a resume re-times it)
    ({"unfit": "a 1 ms hold took 1.9 ms"}, dict(ms=1.0, requests=8, load_share=0.9), Verdict.correct, Standing.unfit,
     "a 1 ms hold took 1.9 ms", Again.no),
    # a GPU's replayed time: under a floor, or every request lost in its null, is timed again afresh
    ({}, dict(ms=0.4, replayed=True, **FLOORED), Verdict.impossible_timing, Standing.kept, None, Again.retime),
    ({}, dict(ms=0.0, requests=5, empty=5, replayed=True, **FLOORED), Verdict.correct, Standing.unfit,
     "the calls are too short to time here: 5 of 5 Bound requests took no longer than a null request", Again.retime),
    ({"unfit": "a 1 ms hold took 1.9 ms"}, dict(ms=0.0, requests=5, empty=5, replayed=True), Verdict.correct,
     Standing.unfit, "a 1 ms hold took 1.9 ms", Again.no),
    # requests that disagree by more than POLICY.replay_spread x their median: no figure, timed again
    ({}, dict(ms=1.0, requests=5, replayed=True, spread=2.2, **FLOORED), Verdict.correct, Standing.unfit,
     "the requests disagree: their interquartile range is 2.2 times their median (the GPU or its host was "
     "disturbed while they were timed)", Again.retime),
    ({}, dict(ms=1.0, requests=5, replayed=True, spread=0.96, **FLOORED), Verdict.correct, Standing.kept, None, Again.no),
    # a wrong answer's time decides nothing
    ({"verdict": Verdict.mismatch}, dict(ms=0.1, **FLOORED), Verdict.mismatch, Standing.kept, None, Again.no),
    # a room below the config: untrusted, and the clock's unfit said beside it
    ({"missing": ["seccomp"]}, dict(ms=1.0, requests=8, load_share=0.7), Verdict.correct, Standing.untrusted,
     "confinement below what the config requires: no seccomp; not timed: the cpu was loaded: 70% of the timed windows "
     "went to run-queue waits (other processes, or the candidate's own threads)", Again.no),
])
def test_the_clock_rules(facts, clock, verdict, standing, why, again):
    d = decide(Measured(**(ROOM | facts | {"clock": Clock(**clock)})))
    assert (d.outcome.verdict, d.outcome.standing, d.outcome.why, d.again) == (verdict, standing, why, again)
    assert (d.error or "").startswith("median ") == (verdict is Verdict.impossible_timing), d.error
    assert d.figure == (why is None or (standing is Standing.untrusted and "not timed" not in why))
    assert d.outcome.findings == ([] if d.error else [Flag.no_custom_kernel])


def test_a_retimed_evaluation_s_verdict_is_the_last_one_s_with_the_first_s_reason(monkeypatch):
    """evaluate's loop (pipeline.judge.evaluate.evaluate): Again.retime judges afresh up to
    load_retries times; the last evaluation's verdict stands, the first's reason is its `earlier`,
    and the seconds are all of them."""
    from pipeline.config import EvalConfig
    from pipeline.judge import evaluate

    refused = EvalResult(verdict=Verdict.impossible_timing, eval_seconds=2.0,
                         error="median 0.5509 ms is below the bandwidth floor 0.7098 ms")
    seen = iter([(refused, Again.retime), (EvalResult(verdict=Verdict.correct, eval_seconds=3.0), Again.no)])
    monkeypatch.setattr(evaluate, "_judge", lambda *args, **kwargs: next(seen))
    result = evaluate.evaluate(None, Path("code.py"), Path("build"), EvalConfig())
    assert (result.verdict, result.outcome.earlier, result.eval_seconds) == (Verdict.correct, refused.error, 5.0)
    calls = []
    monkeypatch.setattr(evaluate, "_judge", lambda *args, **kwargs: calls.append(1) or (refused, Again.retime))
    result = evaluate.evaluate(None, Path("code.py"), Path("build"), EvalConfig(load_retries=2))
    assert len(calls) == 3 and result.verdict is Verdict.impossible_timing and result.outcome.earlier == refused.error


def test_the_requests_spread_is_their_interquartile_range_over_their_median():
    from pipeline.judge.clocks import spread

    # cross_entropy's first evaluation in the H100 batch (ms a call) and hinge's first
    assert round(spread([0.98531, 1.85663, 0.15232, 0.0, 2.61296]), 2) == 2.19
    assert round(spread([2.18005, 1.33546, 1.38693, 1.47737, 1.91556]), 2) == 0.46
    assert spread([0.0, 0.0, 1.0]) is None and spread([1.0]) is None


def test_the_null_requests_noise_is_their_interquartile_range_over_a_request_s_net_time():
    """The lean forger's honest twin at 32 x 32 on the cpu, windows recorded idle (unloaded ms, 128 calls
    a request): about 0.25 ms of calls a request against nulls that vary by 0.11 ms."""
    from pipeline.judge.clocks import Window, net_per_call, null_noise

    nulls = [Window(ms, 128) for ms in (1.0726, 0.9187, 0.9007, 0.8794, 0.9622, 0.9384, 0.9179, 0.9412, 1.1691, 1.0348)]
    bounds = [Window(ms, 128) for ms in (1.3002, 1.3852, 1.1614, 1.3464, 1.1517, 1.1821, 1.1573, 1.1197)]
    per_call = net_per_call(nulls, bounds, "cpu")
    noise = null_noise(nulls, bounds, per_call)
    assert round(noise, 3) == 0.447 and noise > POLICY.cpu_noise
    assert null_noise(nulls[:3], bounds, per_call) is None  # too few nulls to say
    assert null_noise(nulls, bounds, [0.0] * len(bounds)) is None  # no request longer than a null: the empty rule's
