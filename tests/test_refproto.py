"""The reference process's protocol (pipeline.judge.refproto): every request and event survives its
trip as a line, a line that is none is refused with a clear error (and, from the reference, ends it
as a failed reference), and an ExpectedCall's memfds arrive with it."""

from __future__ import annotations

import os
import typing
from types import SimpleNamespace

import pytest

from pipeline.config import EvalConfig
from pipeline.judge import refproto as R
from pipeline.judge.bench import EvaluationError, TaskBench

REQUESTS = [
    R.MeasureBaselines(size="small", init_seed=1, baseline_seeds=[2, 3], warmup=5, compile_baseline=True, timed_ms=100.0,
                       timed_calls=30, max_timed_calls=256),
    R.CheckHealth(),
    R.TimeBlock(size={"N": 64}, init_seed=1, seeds=[4, 5], warmup=2, pair=True, cold=True),
    R.Expect(init_seed=1, specs=[R.Spec(key="trial0", size="small", seed=6, variant="base", inputs=True, values=False)]),
    R.Compare(init_seed=1, spec=R.Spec(key="timed0_3", size="small", seed=6, variant="base", errors=False),
              parts=[(0, "float32", 16), (64, "bfloat16", 16)], tol=1e-4, errs=[(1e-7, 2e-6), (None, None)]),
    R.Digests(size="small", init_seed=1, items=[R.DigestItem(key="bound0@3", seeds=[7, 8], replay=3, replays=8, digest_seed=9,
                                                             factor_seed=10)]),
    R.Play(size="small", init_seed=3, n_seeds=8, replays=512, out_shape=[4, 4], models=["eager", "compiled"]),
    R.Release(),
    R.Floor(input_bytes=1 << 20, flops=0),
    R.Settle(),
]
EVENTS = [
    R.Ready(device_name="cpu", torch_version="2.9.0", cuda_version=None),
    R.Measured(baselines={"eager": {"median_ms": 1.5, "p25_ms": 1.4, "p75_ms": 1.6, "n": 30}, "input_bytes": 64,
                          "floor_ms": 0.01, "bandwidth_gbs": 20.0, "flops": 0}),
    R.HealthFigures(bandwidth_gbs=3000.0, hold_ms=1.01),
    R.Block(times_ms=[1.0, 1.1], compiled_ms=None, compile_error="RuntimeError: no", busy=R.Busy(after_ms=3.0, idle_ms=0.02)),
    R.ExpectedCall(key="trial0", fds=["values_fd"], shape=[4], numel=8, ref_dtype="float32",
                   parts=[("output", [4]), ("gradient of x", [4])], dtypes=["float32", "float32"], fp32_rel_err=1e-7,
                   rel_errs=[1e-7, 2e-7], own_errs=[float("inf"), 0.0]),
    R.Compared(key="trial0", shape=[4], numel=8, ref_dtype="float32", stats=[(0.1, 2.0, (float("inf"), 3, 1.0, 9.0)), None],
               rel_errs=[1e-7, float("inf")]),
    R.Digest(key="bound0@3", digest=0.5, scale=2.0),
    R.Played(ms={"null": 0.3, "eager": 0.9}, busy=None),
    R.PlayFailed(error="OutOfMemoryError: CUDA out of memory"),
    R.Floors(floor_ms=0.01, bandwidth_gbs=20.0, compute_floor_ms=None, flops_per_s=None, flops=0),
    R.Settled(warm_s=3.5, waited_s=0.2, error=None),
    R.Done(op="settle"),
]


def members(union) -> set[type]:
    return set(typing.get_args(typing.get_args(union)[0]))


def test_every_request_and_event_survives_its_line():
    """One of each type of the unions, as the parent sends a request (model_dump_json) and as the
    reference sends an event (EVENT.dump_json: an infinite error crosses as itself, a Baselines' too)."""
    assert {type(m) for m in REQUESTS} == members(R.Request)
    assert {type(m) for m in EVENTS} == members(R.Event)
    for m in REQUESTS:
        assert R.parse(R.REQUEST, m.model_dump_json(), "a request") == m
        assert R.REQUEST.validate_json(R.REQUEST.dump_json(m)) == m
    for m in EVENTS:
        assert R.parse(R.EVENT, R.EVENT.dump_json(m), "a reply") == m
    inf = R.Measured(baselines={"eager": {"median_ms": float("inf"), "p25_ms": 1.0, "p75_ms": 1.0, "n": 3}})
    assert R.parse(R.EVENT, R.EVENT.dump_json(inf), "a reply").baselines.eager.median_ms == float("inf")
    start = R.Start(task_path="/t.py", device="cpu", threads=1, spread_cores=[0, 1])
    assert R.parse(R.Start, start.model_dump_json(), "a start line") == start


@pytest.mark.parametrize("line, where", [
    ("not json", "the top"),
    ('{"op": "warp"}', "the top"),
    ('{"op": "floor", "input_bytes": 1}', "floor.flops"),
    ('{"op": "settle", "held_out": false}', "settle.held_out"),
    ('{"op": "time_block", "size": "small", "init_seed": 1, "seeds": "many"}', "time_block.seeds"),
])
def test_a_line_that_is_no_request_is_refused_and_says_why(line, where):
    with pytest.raises(R.Unparsed, match=f"a request that does not parse .*first at {where}") as refused:
        R.parse(R.REQUEST, line, "a request")
    assert line[:12] in str(refused.value)


class FakeReference:
    """What TaskBench.request reads from: a reference process that sends `lines`, then dies."""

    def __init__(self, lines: list[str]):
        self.lines, self.killed, self.sent = lines, False, []
        self.proc = SimpleNamespace(poll=lambda: None)
        self.handover, theirs = R.pair()
        self.theirs = theirs

    def send(self, message):
        self.sent.append(message)

    def receive(self, parse):
        return parse(self.lines.pop(0).encode()) if self.lines else None

    def kill(self):
        self.killed = True

    def finish(self, grace: float = 10.0):
        self.handover.close()
        self.theirs.close()
        return -9, "the reference's log"


def bench_with(ref: FakeReference) -> TaskBench:
    bench = TaskBench(SimpleNamespace(name="t"), "small", "small", "cpu", "cpu", 1e-4, EvalConfig())
    bench.references[frozenset()] = ref
    return bench


def test_a_garbled_reply_is_a_failed_reference_and_the_memfds_come_with_their_line():
    """The parent's side: an ExpectedCall's descriptors sent just before it are its own, by name, and
    readable; a line that is no event kills the reference and fails the request as a dead one would,
    saying why, with the descriptors that came before it closed."""
    ref = FakeReference([])
    fd = R.sealed_memfd("kgen-test", b"\x01" * 16)
    R.give(ref.theirs, [fd])
    ref.lines = [R.ExpectedCall(key="a", fds=["values_fd"], shape=[2], numel=2, ref_dtype="float32").model_dump_json(),
                 R.Done(op="expect").model_dump_json()]
    bench = bench_with(ref)
    (got,) = bench.request(R.Expect(init_seed=1, specs=[R.Spec(key="a", size="small", seed=2, variant="base")]), 5)
    assert ref.sent[0].op == "expect" and got.fd("inputs_fd") is None
    assert os.pread(got.fd("values_fd"), 16, 0) == b"\x01" * 16
    R.close_all([got])
    assert got.fd("values_fd") is None

    fd = R.sealed_memfd("kgen-test", b"\x02")
    R.give(ref.theirs, [fd])
    ref.lines = [R.ExpectedCall(key="b", fds=["values_fd"]).model_dump_json(), "Traceback (most recent call last):"]
    with pytest.raises(EvaluationError, match="failed on expect: a reply that does not parse .*the reference's log"):
        bench.request(R.Expect(init_seed=1, specs=[]), 5)
    assert ref.killed and not bench.references


def test_a_line_naming_descriptors_that_never_came_fails_the_reference():
    ref = FakeReference([R.ExpectedCall(key="a", fds=["values_fd", "inputs_fd"]).model_dump_json()])
    R.give(ref.theirs, [R.sealed_memfd("kgen-test", b"\x03")])
    with pytest.raises(EvaluationError, match="1 descriptors came for 2 named"):
        bench_with(ref).request(R.Expect(init_seed=1, specs=[]), 5)
    assert ref.killed
