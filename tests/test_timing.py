"""How many calls are timed (short calls get more, baselines and candidate alike), and the speedup
taken side by side on an idle and on a loaded machine."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.child import tasks
from pipeline.child.timing import calls_for
from pipeline.config import EvalConfig, cache_root
from pipeline.judge import clocks, evaluate, refproto as R
from pipeline.judge.bench import open_bench, prepare
from pipeline.policy import POLICY
from pipeline.records import Verdict

from forgers import gains_nothing, no_figure

ROOT = Path(__file__).resolve().parent.parent
BAND = (0.5, 2.0)  # the speedup of a candidate that is eager's own ops (test_the_ratio_is_taken_side_by_side_...)

MSE_IN_TORCH = '''
import torch


class ModelNew(torch.nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)
'''


def _mse_setup(tmp_path, code_text: str, **settings) -> tuple:
    """The mse task, a candidate file, a build dir and the settings these tests share."""
    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    code = tmp_path / "cand.py"
    code.write_text(code_text)
    (tmp_path / "build").mkdir()
    base = dict(trials=2, warmup_calls=1, compile_baseline=False, check_shapes=False, profile=False, timeout_s=120,
                timed_calls=16, timed_ms=0)
    return task, code, EvalConfig(**{**base, **settings})


def test_calls_for_adds_calls_for_short_kernels_within_bounds():
    assert calls_for(5.0, 100, 30, 256) == 30  # long calls: the least
    assert calls_for(0.8, 100, 30, 256) == 125  # about 100 ms of calls
    assert calls_for(0.25, 100, 30, 256) == 256  # capped
    assert calls_for(None, 100, 30, 256) == 30  # no estimate (no baseline): the least
    assert calls_for(0.25, 0, 30, 256) == 30  # timed_ms 0 turns it off
    assert calls_for(0.25, 100, 30, 20) == 30  # the least wins over a smaller cap


def test_the_speedup_is_taken_pair_by_pair():
    """Each Bound request's net time a call against the reference's calls beside it, then the median
    and quartiles of those ratios; requests that do not line up give no ratio rather than a wrong one."""
    candidate = [1.0, 2.0, 1.5, 3.0]  # each request's net ms a call
    eager = [[1.1] * 4, [2.2] * 4, [1.65] * 4, [3.0, 3.3, 3.6, 3.3]]  # drift moves both sides of a pair alike
    r = clocks.pair_ratios(candidate, eager)
    assert r.pairs == 4 and r.median == pytest.approx(1.1) and r.p25 == pytest.approx(1.1) and r.p75 == pytest.approx(1.1)
    r = clocks.pair_ratios([1.0, 2.0], [[2.0], [2.0]])
    assert (r.median, r.pairs) == (1.5, 2)  # 2.0 and 1.0
    assert clocks.pair_ratios([1.0, 1.0], [[1.0]]) is None  # the requests do not line up
    assert clocks.pair_ratios([1.0], [[]]) is None  # nothing timed beside it
    assert clocks.pair_ratios([0.0], [[1.0]]) is None  # no time to divide by
    assert clocks.pair_ratios([1.0, 0.0, 2.0], [[1.1], [5.0], [2.2]]).pairs == 2  # a stalled null's request left out
    assert clocks.pair_ratios([], []) is None


def test_a_short_task_is_timed_with_more_calls_on_both_sides(tmp_path):
    """A real reference process and a real child: the baselines are timed with the number of calls the
    rule gives their speed, not the configured least, and the candidate beside eager call for call."""
    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    code = tmp_path / "cand.py"
    code.write_text(MSE_IN_TORCH)
    common = dict(trials=2, warmup_calls=1, compile_baseline=False, check_shapes=False, profile=False,
                  timeout_s=120, timed_calls=6, max_timed_calls=24)
    counts = {}
    for target in (0.0, 10_000.0):  # off, then far more milliseconds than 24 small calls take
        settings = EvalConfig(timed_ms=target, **common)
        bench = prepare(task, "small", "cpu", settings)
        try:
            result = evaluate.evaluate(bench, code, tmp_path / "build", settings)
        finally:
            bench.close()
        assert result.verdict is Verdict.correct, result.error
        # The baseline's calls; the times kept are the Bound requests', eager's beside them call for call.
        counts[target] = bench.baselines.eager.n
        assert no_figure(result) or result.timing.n == result.eager_beside.n > 0, (result.timing, result.eager_beside)
    assert counts[0.0] == 6
    assert counts[10_000.0] == 24


def _busy(seconds: float, per_core: int = 1) -> list[subprocess.Popen]:
    """Processes spinning, `per_core` for every core, each ending by itself after `seconds` at most."""
    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(per_core * (os.cpu_count() or 1))]


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every core since boot (/proc/stat): idle and iowait are not busy."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def test_the_ratio_is_taken_side_by_side_and_survives_a_loaded_machine(tmp_path):
    """The same work on both sides (the candidate is eager's own ops), judged on an idle machine and
    with a spinning process per core running through the whole evaluation. The eager blocks
    the reference process times between the candidate's see the same machine, and both sides time
    with one thread (evaluation.cpu_threads), so the speedup stays near 1.0 either way.

    Tolerance BAND: both sides run the same ops in alternating blocks of four calls and each
    keeps the median block, so what is left is how differently the load falls on neighbouring
    blocks; over 13 runs on the 2-core CI box, with one to three spinners a core, the ratios were
    0.92-1.05 idle and 0.78-1.05 loaded (the margin is for a slower CI machine; the bug this guards
    against read 0.07 against 11.6). The band was 0.6-1.6 until a CI run on a box shared with other work
    (its windows 74% run-queue waits in another test) read 1.64 and 1.62 in the "idle" pair. Three
    spinners a core also push the parent's lower bound on times past
    honest kernels at times (README), so the test loads the machine fully, not over.

    One CI run saw a loaded ratio of 1.93 once, never reproduced in 20 runs here; the child's
    session is now stopped around each eager block (the test below). Another saw 0.56 idle, with
    the machine's speed drifting within the attempt: the speedup is now the median of the block
    pairs' ratios (EvalResult.eager_ratio), over eight pairs, and a ratio out of tolerance, idle or
    loaded, is judged a second time: one outlier from a noisy host passes, a
    bias fails both."""
    task, code, settings = _mse_setup(tmp_path, MSE_IN_TORCH, timed_calls=32)
    bench = prepare(task, "small", "cpu", settings)
    ratios: dict[str, list[float]] = {"idle": [], "loaded": []}
    spun = wall = 0.0
    try:
        for state in ratios:
            for _ in range(2):
                load = _busy(60) if state == "loaded" else []
                started, ticks = time.monotonic(), _cpu_ticks()
                try:
                    result = evaluate.evaluate(bench, code, tmp_path / "build", settings)
                finally:
                    wall = time.monotonic() - started
                    busy, total = (b - a for a, b in zip(ticks, _cpu_ticks()))
                    for p in load:
                        p.kill()
                    spun = sum(os.wait4(p.pid, 0)[2].ru_utime for p in load)
                assert result.verdict is Verdict.correct, result.error
                if no_figure(result):  # too loaded to time through the retries: no figure, no ratio
                    continue
                # Side by side, call for call: one loaded CI run timed 30 calls of the 32 asked on
                # both sides (its cause not found), and the pairing is what this asserts.
                assert result.eager_beside is not None and result.eager_beside.n == result.timing.n, \
                    (result.eager_beside, result.timing)
                # a pair a Bound request, each of as many calls (4-8 here, as eager's speed gives them)
                ratio = result.eager_ratio
                assert ratio is not None and ratio.pairs >= 2 and result.timing.n % ratio.pairs == 0, (ratio, result.timing)
                assert result.speedup_eager == result.eager_ratio.median
                if load:  # the machine busy throughout, the spinners among what kept it so: on a box already
                    # busy they get less of it (a fresh clone beside a busy loop: 3.7 cpu-s, every tick busy)
                    assert busy > 0.8 * total and spun > 0, \
                        f"the background load did not keep the cores busy ({busy} of {total} ticks, {spun:.1f} cpu-s)"
                ratios[state].append(round(result.speedup_eager, 3))
                if BAND[0] <= result.speedup_eager <= BAND[1]:
                    break
    finally:
        bench.close()
    print(f"side by side: {ratios}; the last load spun {spun:.1f} cpu-seconds in {wall:.1f} s")
    assert ratios["idle"], ratios  # idle, a figure is had
    assert all(BAND[0] <= r[-1] <= BAND[1] for r in ratios.values() if r), ratios


def test_a_candidate_cannot_slow_the_eager_side(tmp_path):
    """A candidate whose forked helpers spin on every core whenever its own calls are not running
    (tests/redteam/slow_the_eager_side.py): the parent stops the child's whole session around each
    eager block (sandbox.Child.pause; tests/test_sandbox.py checks that the paused helpers get no
    cpu), so eager runs as it would alone. On the 2-core box the kernel's autogroups already keep the
    sessions apart: with the pause patched out the speedup read 0.87-1.15 (four runs), with it
    0.84-1.17 (twelve runs), so here this test holds the red team to an honest
    copy's band (BAND, as test_the_ratio_is_taken_side_by_side_...), not to the pause's own effect, which was
    1.40-1.48 against 0.93-0.94 on an earlier box. The helpers still spin in the gaps of the
    candidate's own blocks, which only slows the candidate: at times so much that the parent's clock
    on its Bound requests is three times its own (seen once in CI: 5.07 ms against 1.58) and it is
    refused as impossible_timing. Either way it gains nothing."""
    task, code, settings = _mse_setup(tmp_path, (Path(__file__).parent / "redteam" / "slow_the_eager_side.py").read_text(),
                                      timed_calls=48, timed_ms=60)
    settings = settings.model_copy(update={"load_retries": 0})  # its own spinners are the load: a retry meets them again
    bench = prepare(task, "small", "cpu", settings)
    try:
        result = evaluate.evaluate(bench, code, tmp_path / "build", settings)
        # Eager alone again, now the candidate is gone: the slower of this and the baseline is the one
        # to hold the eager beside it to (a busy box slows every side at its own moments).
        msgs = bench.request(R.TimeBlock(size=bench.size, init_seed=1, seeds=list(range(48)), warmup=settings.warmup_calls),
                             settings.timeout_s)
        after = statistics.median(t for m in msgs if isinstance(m, R.Block) for t in m.times_ms)
    finally:
        bench.close()
    alone = max(bench.baselines.eager.median_ms, after)
    beside = result.eager_beside
    print(f"{result.verdict.value}: speedup {result.speedup_eager}; eager beside the spinning candidate "
          f"{beside.median_ms if beside else None} ms, alone {alone:.4g} ms; unfit: {result.device_unfit}")
    assert result.verdict in (Verdict.correct, Verdict.impossible_timing), result.error
    if no_figure(result):
        return  # too loaded to time through the retries (its own spinners among the load): no figure to slow
    assert beside is not None and beside.n == result.timing.n, beside  # side by side, call for call
    # Eager alone is timed at other moments (prepare, after), so against it only a gross slowdown
    # shows: the median read 0.95-1.15x here, 1.31x and once 1.63x in fresh-clone CI runs (the whole
    # attempt on a slower machine), and 2.26x beside a fresh-clone suite and three more test
    # processes, where its lower quartile read 1.18x. Other work slows some blocks; a
    # candidate that slows eager slows them all, so the quartile is held to it. (The judge marks this
    # candidate's timing unfit every time, on an idle box too: its own helpers wait on the run queue.)
    assert beside.p25_ms <= 2.0 * alone, f"the candidate's helpers slowed the eager side: {beside} against {alone:.4g} ms"
    if result.verdict is Verdict.correct:  # a fresh-clone CI run with 16 timed calls read 1.35
        assert result.speedup_eager is not None and result.speedup_eager <= BAND[1], (result.speedup_eager, result.error)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """One KGEN_CACHE_DIR for this module's two torch.compile tests, fresh for the first of them: the
    second (the warm-up's) then finds inductor's caches and header the first's reference left, rather
    than compiling them again (a first warm-up costs about 15 s of g++ on the 2-core box, a warm one
    3.5 s). Still a cache of the module's own, never the user's (see the warm-up test)."""
    return tmp_path_factory.mktemp("compile-cache")


def test_torch_compile_is_timed_side_by_side_too(tmp_path, monkeypatch, compile_cache):
    """Where the task's torch.compile baseline compiled, the reference also times the compiled model
    in a block right after each eager block (the child stopped), and speedup_compile divides that,
    never the cached baseline: the same ratio, side by side, as speedup_eager. The reference keeps
    its compile caches in KGEN_CACHE_DIR, where the next reference process finds them."""
    monkeypatch.setenv("KGEN_CACHE_DIR", str(compile_cache))
    fresh = not any(compile_cache.iterdir())
    task, code, settings = _mse_setup(tmp_path, MSE_IN_TORCH, compile_baseline=True, timeout_s=300, timed_calls=8)
    bench = prepare(task, "small", "cpu", settings)
    try:
        assert bench.baselines.compiled is not None
        result = evaluate.evaluate(bench, code, tmp_path / "build", settings)
    finally:
        bench.close()
    assert result.verdict is Verdict.correct, result.error
    assert fresh and any(p.is_file() for p in (compile_cache / "inductor").rglob("*")), "no compile cache written"
    if no_figure(result):
        return  # too loaded to time through the retries: no figure, no ratio
    beside = result.compiled_beside
    assert beside is not None and beside.n == result.timing.n  # on the cpu beside each Bound request
    ratio = result.compiled_ratio
    assert ratio is not None and ratio.pairs >= 2 and result.speedup_compile == ratio.median
    assert result.compiled_beside is not None and result.compiled_beside.n == result.timing.n
    assert ratio.p25 <= ratio.median <= ratio.p75
    print(f"compile beside {beside.median_ms:.4g} ms (prepared {bench.baselines.compiled.median_ms:.4g}), "
          f"candidate {result.timing.median_ms:.4g} ms")
    assert 0.05 < result.speedup_compile < 20  # eager's own ops against the compiled reference


def test_the_reference_warms_its_compiler_beside_expect_and_keeps_inductors_header(tmp_path, monkeypatch,
                                                                                   compile_cache):
    """Where torch.compile is timed, a reference process compiles a probe in a thread from its start
    (pipeline.judge.reference.CompilerWarmup): `expect` is served beside it (answered before the warm-up
    ends), while `settle`, which the parent sends before its child's calibration, waits for it, so
    nothing is timed beside it. Inductor's precompiled header for cpu kernels lands in the reference's
    temp folder in kgen's cache (KGEN_CACHE_DIR, as the suite's builds), where the next reference
    process reuses it rather than spending 5 s of g++ on it again (a first warm-up: 15 s on the
    2-core box, the next 3.5 s). A cache of the test's own: another suite beside this one, sharing
    ~/.cache/kgen, once rewrote a header between the two processes. (The module's cache: after the
    torch.compile test its reference's header is there already, and neither process here rewrites it.)"""
    monkeypatch.setenv("KGEN_CACHE_DIR", str(compile_cache))
    task, _, settings = _mse_setup(tmp_path, MSE_IN_TORCH, compile_baseline=True)
    spec = R.Spec(key="a", size="small", seed=7, variant="base")
    seen: list[dict[Path, int]] = []
    for process in range(2):
        bench = open_bench(task, "small", "cpu", settings)
        try:
            started = time.monotonic()
            found = bench.request(R.Expect(init_seed=3, specs=[spec]), 120)
            expect_s = time.monotonic() - started
            R.close_all(found)
            settled = [m for m in bench.request(R.Settle(), 120) if isinstance(m, R.Settled)]
        finally:
            bench.close()
        assert [m.key for m in found if isinstance(m, R.ExpectedCall)] == ["a"]
        assert len(settled) == 1 and settled[0].error is None, settled
        print(f"reference {process}: expect answered in {expect_s:.2f} s, warm-up {settled[0].warm_s} s")
        assert settled[0].warm_s > expect_s and settled[0].waited_s > 0
        headers = (cache_root() / "reference-tmp").glob("torchinductor_*/precompiled_headers/*.gch")
        seen.append({h: h.stat().st_mtime_ns for h in headers})
    assert seen[0] and seen[1] == seen[0]  # the second process reused the header the first left


def test_an_honest_short_call_is_not_refused_by_the_parents_bound(tmp_path):
    """At the task's "odd" size (97 x 1023) an mse call takes about 0.1-0.15 ms in a timed block.
    A Bound request of one such call cost the parent 0.65-0.85 ms more than the null model's, and the
    honest candidate was refused as impossible_timing every time (docs/decisions/cpu-timing.md).
    Where eager is short, a cpu Bound request now holds a timed block's calls
    (more for the shortest), so each side of the check has the same mix of a block's first and
    following calls; longer calls keep one call a request (POLICY.cpu_short_ms)."""
    task, code, settings = _mse_setup(tmp_path, MSE_IN_TORCH, timed_calls=16)
    bench = prepare(task, "odd", "cpu", settings)
    try:
        block = evaluate.block_calls(bench.output_bytes)
        eager = bench.baselines.eager.median_ms
        calls = evaluate.cpu_bound_calls(eager, bench.baselines.input_bytes, bench.output_bytes)
        assert calls >= block > 1 and (calls == block or calls * eager < 2 * POLICY.cpu_bound_ms), (calls, eager)
        # As many requests as fit ahead, never fewer than POLICY.bound_requests: packed between the child's
        # requests instead, their inputs ran cold and honest calls were refused.
        plan = evaluate.AttemptPlan.draw(bench)
        assert plan.inputs_ahead and POLICY.bound_requests <= len(plan.bounds) <= POLICY.cpu_bound_requests, plan.bounds
        for _ in range(2):
            result = evaluate.evaluate(bench, code, tmp_path / "build", settings)
            assert result.verdict is Verdict.correct, (result.error, result.wall_ms_per_call)
            assert no_figure(result) or result.time_ms < POLICY.cpu_short_ms  # a short call indeed (0.1-0.15 ms idle, 1.16 beside another suite)
    finally:
        bench.close()
    e = evaluate
    mib = 1 << 20
    assert e.cpu_bound_calls(POLICY.cpu_short_ms * 1.25, mib, 4) == 1 == e.cpu_bound_calls(None, mib, 4)
    assert e.cpu_bound_calls(1.5, mib, 4) == e.METHOD.block == 4  # a block's calls
    assert e.cpu_bound_calls(0.5, mib, 4) == 8  # POLICY.cpu_bound_ms (4 ms) of calls where a block's take less
    assert e.cpu_bound_calls(0.01, mib, 4) == POLICY.cpu_bound_max_calls  # more for the shortest
    # the sets of a request within POLICY.cpu_bound_set_bytes, the outputs within POLICY.block_output_bytes, never below one
    assert e.cpu_bound_calls(0.5, POLICY.cpu_bound_set_bytes // 2, 4) == 2
    assert e.cpu_bound_calls(0.01, mib, POLICY.block_output_bytes // 2) == 2
    assert e.cpu_bound_calls(0.5, POLICY.cpu_bound_set_bytes * 3, 4) == 1
    # Calls compared in full: all sixteen for small outputs, fewer past POLICY.checked_output_bytes, never under the minimum
    assert e.checked_count(4) == e.checked_count(0) == POLICY.checked_timed
    assert e.checked_count(POLICY.checked_output_bytes // 4) == 4 < POLICY.checked_timed
    assert e.checked_count(POLICY.checked_output_bytes) == e.checked_count(1 << 40) == POLICY.checked_min


def test_an_honest_call_of_microseconds_is_correct_and_its_calls_fill_the_parents_window(tmp_path):
    """mse at 64 x 64 (20-40 us a call, as test_run's tiny task): what a cpu Bound request does
    between and around its calls is in the parent's window but not in the calls, 6-10 ms for 128
    calls, and the check read an honest candidate's calls at 0.56-0.65 of the window: refused in CI,
    and 2 of 4 first evaluations here. Between calls the outputs are now copied with the
    least Python, the inbox's views are kept, and the window ends before the parent parses the
    reply (1.03-1.13 idle; docs/decisions/cpu-timing.md). Beside other load the share of waits marks
    the timing unfit instead of refusing it (pipeline.verdicts)."""
    task, code, settings = _mse_setup(tmp_path, MSE_IN_TORCH, timed_calls=16)
    bench = prepare(task, {"batch_size": 64, "input_shape": (64,)}, "cpu", settings)
    try:
        # many calls a request, so that what the harness does between them weighs (CI's eager read
        # 0.033 ms idle, 123 calls, and 0.065 ms beside the suite, 62: not the 128 a faster box gets)
        assert bench.baselines.eager.median_ms < 0.1 and evaluate.cpu_bound_calls(
            bench.baselines.eager.median_ms, bench.baselines.input_bytes, bench.output_bytes) >= POLICY.cpu_bound_max_calls // 4
        for _ in range(3):
            result = evaluate.evaluate(bench, code, tmp_path / "build", settings)
            assert result.verdict is Verdict.correct, (result.error, result.outcome.earlier)
    finally:
        bench.close()


# Null and Bound windows (ms, 128 calls each) as the parent recorded them for an honest 32 x 32 add
# (2.5-7 us a call) on the 2-core box: a typical evaluation, and one whose requests were no slower
# than the calibration's fastest null (its median net 0 had been refused as below the bandwidth floor).
NULLS = [1.64, 1.652, 1.738, 1.748, 1.943, 2.01, 2.2]
MEASURED = [2.893, 3.013, 2.988, 2.986, 3.176, 3.137, 3.02, 3.182, 3.137, 3.151, 3.077, 3.035]
LOST = [1.62, 1.64, 1.60, 2.9, 1.63, 3.1, 1.58, 1.64, 2.2, 1.61, 1.7, 1.63]


@pytest.mark.parametrize("bounds, figure", [(MEASURED, True), (LOST, False)])
def test_calls_lost_in_the_protocol_s_noise_get_no_figure_not_a_refusal(bounds, figure):
    """decide: where half or more of the Bound requests took no longer than the fastest null
    request, the median net is 0, which says nothing of the calls: the timing is unfit (no figure,
    re-timed later), not impossible. Where they took longer, the figure stands."""
    from pipeline.verdicts import Again, Clock, Measured, decide

    per_call = clocks.net_per_call([clocks.Window(ms, 128) for ms in NULLS],
                                   [clocks.Window(ms, 128) for ms in bounds], "cpu")
    clock = Clock(ms=statistics.median(per_call), requests=len(per_call), empty=sum(x <= 0 for x in per_call),
                  load_share=0.0, floor_ms=0.001)
    d = decide(Measured(verdict=Verdict.correct, missing=[], clock=clock))
    if figure:
        assert d.figure and d.outcome.why is None and clock.ms > 0.008, per_call  # 9.8-12 us a call
    else:
        assert clock.ms == 0 and not d.figure and "8 of 12 Bound requests" in d.outcome.why, (per_call, d)
        assert d.outcome.verdict is Verdict.correct and d.again is Again.no  # not the load: a resume re-times it


def test_a_clock_forged_to_half_at_microseconds_gains_nothing_on_the_cpu(tmp_path):
    """tests/redteam/forged_clock_lean.py claims half of each call and adds nothing between the calls,
    on a 32 x 32 add (2.5-5 us a call). Against the child's clock checked inside the parent's, with an
    allowance a call for the protocol's noise, it was trusted at 1.65-1.93x eager against its honest
    twin's 0.84-0.96x (docs/decisions/cpu-timing.md). The parent's clock is now the only one: the
    forger and its honest twin, evaluated before it each time, are both correct and trusted, and the
    forger gains nothing."""
    task = tasks.discover(ROOT / "tests" / "tasks", ["big_add"])[0]
    honest = tmp_path / "honest.py"
    honest.write_text("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, a, b):\n"
                      "        return torch.add(a, b)\n")
    forged = ROOT / "tests" / "redteam" / "forged_clock_lean.py"
    (tmp_path / "build").mkdir()
    settings = EvalConfig(trials=2, warmup_calls=1, compile_baseline=False, check_shapes=False, profile=False,
                          timeout_s=120, timed_calls=16, timed_ms=0)
    bench = prepare(task, {"rows": 32, "cols": 32}, "cpu", settings)
    try:
        assert bench.baselines.eager.median_ms < 0.03, bench.baselines.eager
        for _ in range(2):
            twin = evaluate.evaluate(bench, honest, tmp_path / "build", settings)
            assert twin.verdict is Verdict.correct and twin.trusted, (twin.error, twin.untrusted_reason)
            r = evaluate.evaluate(bench, forged, tmp_path / "build", settings)
            print(f"honest {twin.speedup_eager}, forged {r.speedup_eager} x eager")
            gains_nothing(r)
    finally:
        bench.close()


def test_a_memfd_is_sealed_once_the_kernel_stops_answering_busy():
    """F_SEAL_WRITE is refused (EBUSY) while anything holds the memfd's pages writably; the kernel's
    own memory work holds them for moments, and one `expect` of the demo's first run failed on it. A
    writable mapping, let go after 0.2 s, stands in for that moment: the seal is taken after it; held
    for good, the refusal stands."""
    import errno
    import fcntl
    import mmap
    import threading

    fd = os.memfd_create("kgen-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, b"x" * 4096)
        held = mmap.mmap(fd, 4096)
        timer = threading.Timer(0.2, held.close)
        timer.start()
        R._seal(fd)
        timer.join()
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE
    finally:
        os.close(fd)
    fd = os.memfd_create("kgen-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, b"x" * 4096)
        held = mmap.mmap(fd, 4096)
        with pytest.raises(OSError) as refused:
            R._seal(fd)
        assert refused.value.errno == errno.EBUSY
    finally:
        held.close()
        os.close(fd)


# ---- the compute floor --------------------------------------------------------------------------

_MATMUL_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(512, 512), torch.randn(512, 512)]


def get_init_inputs():
    return []
'''


def test_the_compute_floor_counts_the_reference_s_arithmetic_and_measures_nothing_for_a_loss():
    import torch

    from pipeline.child.timing import Clock, compute_floor, flop_count

    linear, x = torch.nn.Linear(256, 128), torch.randn(64, 256)
    assert flop_count(lambda: linear(x)) == 2 * 64 * 256 * 128
    assert flop_count(lambda: torch.mean((x - x) ** 2)) == 0
    # No arithmetic the counter sees: no floor, and no matmul is timed (nothing to wait for; cpu time,
    # which a busy box's other work does not add to).
    started = time.process_time()
    assert compute_floor("cpu", Clock("cpu"), lambda: torch.mean(x ** 2)) == \
        {"flops": 0, "flops_per_s": None, "compute_floor_ms": None}
    assert time.process_time() - started < 0.5
    got = compute_floor("cpu", Clock("cpu"), lambda: linear(x))
    assert got["flops"] == 2 * 64 * 256 * 128 and got["flops_per_s"] > 1e9
    assert got["compute_floor_ms"] == pytest.approx(got["flops"] / got["flops_per_s"] * 1e3)


def test_a_compute_bound_task_has_a_compute_floor_and_a_forged_clock_gains_nothing(tmp_path):
    """A 512 x 512 matmul: its inputs' bytes (2 MB) are read in microseconds, so the bandwidth floor
    says nothing of a time a fiftieth of the call's. Its 268 MFLOP at the cpu's best measured rate
    do: such a time is below the compute floor. The honest matmul is correct, not held below its own
    floor, and a clock forged to a fiftieth is timed as it is (the parent's clock is the cpu's only
    one). With evaluation.compute_floor off, the floor refuses nothing."""
    from pipeline.verdicts import below_floor

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "matmul.py").write_text(_MATMUL_TASK)
    task = tasks.discover(tmp_path / "tasks", ["matmul"])[0]
    # A fiftieth, not a tenth: beside a running suite the real call took 6-9 ms (2.7 idle), and a tenth
    # of that came within 15% of the floor's slack.
    forged = (Path(__file__).parent / "redteam" / "forged_time_blocks.py").read_text().replace(
        "def forward(self, predictions, targets):\n        return torch.mean((predictions - targets) ** 2)",
        "def forward(self, a, b):\n        return a @ b").replace("FACTOR = 0.1\n", "FACTOR = 0.02\n")
    assert "FACTOR = 0.02\n" in forged
    assert "return a @ b" in forged
    _, code, settings = _mse_setup(tmp_path, forged)
    honest = tmp_path / "honest.py"
    honest.write_text("import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n"
                      "        return a @ b\n")
    bench = prepare(task, "small", "cpu", settings)
    try:
        b = bench.baselines
        assert b.flops == 2 * 512 ** 3 and b.compute_floor_ms > 2 * b.floor_ms, b  # 6-20x on 2-core boxes
        assert b.compute_floor_ms < b.eager.median_ms, b  # eager itself is never below it
        # A median between the two floors is refused by the compute floor (a box's bandwidth floor may be
        # above the forged claim too, and it is checked first: 0.071 ms at 30 GB/s on one 2-core box).
        # Their geometric mean: the clock measures the floors again below them, and beside a running
        # suite the compute floor then fell from 3.3 to 1.8 ms, above the two floors' plain mean.
        between = (b.floor_ms * b.compute_floor_ms) ** 0.5
        assert "below the compute floor" in (below_floor(bench.clock(between)) or ""), (between, b)
        right = evaluate.evaluate(bench, honest, tmp_path / "build", settings)
        forged_result = evaluate.evaluate(bench, code, tmp_path / "build", settings)
        bench.settings = settings.model_copy(update={"compute_floor": False})
        assert below_floor(bench.clock(between)) is None, b  # off: the bandwidth floor alone, below `between`
    finally:
        bench.close()
    assert right.verdict is Verdict.correct, right.error
    gains_nothing(forged_result)
    print(right.time_ms, forged_result.time_ms, b.compute_floor_ms)


def test_a_gpu_s_rates_are_measured_once_and_the_best_kept(monkeypatch):
    """On a GPU the floors' rates are the device's, whatever the task (a 1 GB buffer, 8192-wide matmuls):
    a task's reference given the rates an earlier one measured (MeasureBaselines.rates) measures
    neither again, and the bench keeps the higher of each (bench.best_rates): a rate measured at a
    busy moment would set a floor above an honest kernel's time."""
    import torch

    from pipeline.child import timing
    from pipeline.judge.bench import best_rates
    from pipeline.records import Baselines

    def measured(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(timing, "measure_bandwidth", measured)
    monkeypatch.setattr(timing, "measure_flops", measured)
    a, b = torch.ones(64, 32), torch.ones(32, 16)
    floor = timing.bandwidth_floor("cpu", None, 4 << 20, bandwidth=2000.0)
    assert floor["bandwidth_gbs"] == 2000.0 and abs(floor["floor_ms"] - (4 << 20) / 2e12 * 1e3) < 1e-12
    compute = timing.compute_floor("cpu", None, lambda: a @ b, own_ms=1.0, rate=5e12)
    assert compute["flops"] == 2 * 64 * 32 * 16 and compute["flops_per_s"] == 5e12
    assert timing.compute_floor("cpu", None, lambda: a + 1, rate=5e12)["flops_per_s"] is None  # no arithmetic
    first = best_rates(None, Baselines(bandwidth_gbs=3000.0, flops_per_s=None))
    assert first == R.Rates(bandwidth_gbs=3000.0, flops_per_s=None)
    later = best_rates(first, Baselines(bandwidth_gbs=2500.0, flops_per_s=6e14))  # a busy moment's bandwidth
    assert later == R.Rates(bandwidth_gbs=3000.0, flops_per_s=6e14)
    assert best_rates(later, Baselines()) == later  # nothing measured: what was known stands
