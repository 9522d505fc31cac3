"""The CUDA red team: adversarial candidates built with nvcc and judged on a real GPU.

Skipped without CUDA (CI); run on the device machine by bench/gpu_check.sh.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline.build import build
from pipeline.judge import evaluate, health
from pipeline.judge.bench import prepare
from pipeline.child import tasks
from pipeline.config import EvalConfig
from pipeline.leaderboard import is_verified
from pipeline.records import Flag, Verdict, summary_fields

from forgers import assert_refused_or_near_twin, honest_and_trusted, judge_in_turn

pytestmark = pytest.mark.gpu

REDTEAM_DIR = Path(__file__).resolve().parent / "redteam"
ROOT = Path(__file__).resolve().parent.parent
SETTINGS = EvalConfig(trials=5, timed_calls=20, warmup_calls=3, timeout_s=120, compile_baseline=True)

# One honest two-pass reduction; the red-team variants change only how it is launched or what it reads.
KERNELS = r'''
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <chrono>
#include <thread>

__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
    return v;
}

__device__ __forceinline__ double block_sum(double v) {
    __shared__ double sums[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) sums[warp] = v;
    __syncthreads();
    v = (threadIdx.x < (blockDim.x + 31) / 32) ? sums[lane] : 0.0;
    if (warp == 0) v = warp_sum(v);
    return v;
}

__global__ void sq_diff_partial(const float* __restrict__ a, const float* __restrict__ b, long long n,
                                long long step, bool aligned, double* __restrict__ partial) {
    double acc = 0.0;
    long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long n4 = (aligned && step == 1) ? n / 4 : 0;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    for (long long i = tid; i < n4; i += stride) {
        float4 x = __ldg(a4 + i), y = __ldg(b4 + i);
        float d0 = x.x - y.x, d1 = x.y - y.y, d2 = x.z - y.z, d3 = x.w - y.w;
        acc += (double)(d0 * d0 + d1 * d1) + (double)(d2 * d2 + d3 * d3);
    }
    for (long long i = n4 * 4 + tid * step; i < n; i += stride * step) {
        float d = a[i] - b[i];
        acc += (double)d * d;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void finish(const double* __restrict__ partial, int count, double scale, float* out) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[0] = (float)(acc * scale);
}

__global__ void wild_write(float* p) { p[threadIdx.x + (1LL << 40)] = 1.0f; }

__global__ void spin(volatile int* flag) { while (*flag == 0) { } }

// Leftover work: every SM busy for `ns` nanoseconds of the GPU's own timer.
__global__ void spin_for(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}

static void leave_spinner() {  // from a host thread, 1 ms after the call (after the harness's sync)
    std::thread([] {
        std::this_thread::sleep_for(std::chrono::microseconds(1000));
        static cudaStream_t left = nullptr;
        if (!left) cudaStreamCreateWithFlags(&left, cudaStreamNonBlocking);
        int sms = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
        spin_for<<<sms * 4, 256, 0, left>>>(5ull * 1000 * 1000);  // over the eager block that follows
    }).detach();
}

torch::Tensor mse(torch::Tensor a, torch::Tensor b, int64_t mode) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat, "inputs must be float32");
    auto ac = a.contiguous(), bc = b.contiguous();
    long long n = ac.numel();
    const float* pa = ac.data_ptr<float>();
    const float* pb = bc.data_ptr<float>();
    bool aligned = ((reinterpret_cast<uintptr_t>(pa) | reinterpret_cast<uintptr_t>(pb)) % 16) == 0;
    int threads = 256;
    int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    long long blocks = std::max(1LL, std::min<long long>(sms * 8LL, (n / 4 + threads - 1) / threads));
    auto partial = torch::empty({blocks}, ac.options().dtype(torch::kFloat64));
    auto out = torch::empty({}, ac.options());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    static cudaStream_t side = nullptr;
    long long step = 1;
    double scale = 1.0 / (double)n;
    if (mode == 1 || mode == 5) {  // side stream: launched where the current stream's events do not see it
        if (!side) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
        stream = side;
    } else if (mode == 2) {  // partial read: every 16th element, rescaled
        step = 16;
        scale = 16.0 / (double)n;
    } else if (mode == 3) {
        wild_write<<<1, 32, 0, stream>>>(out.data_ptr<float>());
    } else if (mode == 4) {
        auto flag = torch::zeros({1}, ac.options().dtype(torch::kInt32));
        spin<<<1, 1, 0, stream>>>(flag.data_ptr<int>());
    }
    sq_diff_partial<<<blocks, threads, 0, stream>>>(pa, pb, n, step, aligned, partial.data_ptr<double>());
    finish<<<1, 1024, 0, stream>>>(partial.data_ptr<double>(), (int)blocks, scale, out.data_ptr<float>());
    if (mode == 5) {  // the current stream waits for the side stream: correct, but the work was
        // launched at once, to run beside whatever the timer queued ahead of the call
        static cudaEvent_t done = nullptr;
        if (!done) cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
        cudaEventRecord(done, side);
        cudaStreamWaitEvent(at::cuda::getCurrentCUDAStream(), done, 0);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    static int calls = 0;
    if (mode == 6 && ++calls % 4 == 0) leave_spinner();  // after what may be a timed block's last call
    return out;
}
'''

CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_ext = load_inline(name="kgen_redteam_mse", cpp_sources="torch::Tensor mse(torch::Tensor a, torch::Tensor b, int64_t mode);",
                   cuda_sources={kernels!r}, functions=["mse"], extra_cuda_cflags=["-O3"])
MODE = {mode}


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
{body}
'''

CALL = "        return _ext.mse(predictions, targets, MODE)"
POINTER_CACHE = """        key = (predictions.data_ptr(), targets.data_ptr())
        if not hasattr(self, "cache"):
            self.cache = {}
        if key not in self.cache:
            self.cache[key] = _ext.mse(predictions, targets, 0)
        return self.cache[key]"""
TIMER_PATCH = """        torch.cuda.Event.elapsed_time = lambda self, other: 1e-6
        torch.cuda.synchronize = lambda *a, **k: None
        return torch.mean((predictions - targets) ** 2)"""

# Rebinds any live Clock's time_call (found through gc) to report a tenth of each call. The child's
# clock is never read (the parent's windows are the only clock): there is none to find, and nothing
# the forger does changes the time recorded.
FORGED_CLOCK = """        if not hasattr(self, "forged"):
            import gc
            from pipeline.child import timing
            for obj in gc.get_objects():
                if isinstance(obj, timing.Clock):
                    real = obj.time_call
                    obj.time_call = (lambda real: lambda fn: (lambda r: (r[0] * 0.1, r[1]))(real(fn)))(real)
            self.forged = True
        return _ext.mse(predictions, targets, 0)"""

FORGED_HALF = FORGED_CLOCK.replace("r[0] * 0.1", "r[0] * 0.5")

CASES = {
    "honest": (0, CALL, {Verdict.correct}),
    "side_stream": (1, CALL, {Verdict.mismatch, Verdict.nondeterministic, Verdict.non_finite}),
    "partial_read": (2, CALL, {Verdict.mismatch}),
    "illegal_address": (3, CALL, {Verdict.runtime_error, Verdict.crashed}),
    "hang": (4, CALL, {Verdict.timeout}),
    "pointer_cache": (0, POINTER_CACHE, {Verdict.mismatch}),
    "timer_patch": (0, TIMER_PATCH, {Verdict.correct}),
    "side_overlap": (5, CALL, {Verdict.correct}),
    "forged_clock": (0, FORGED_CLOCK, {Verdict.correct}),
    "forged_half": (0, FORGED_HALF, {Verdict.correct}),
    # Work left on the GPU after a block, running while the child is stopped and eager is timed:
    # the reference's own probe (pipeline.judge.health.IdleProbe) waits it out or refuses.
    "leftover_spinner": (6, CALL, {Verdict.correct, Verdict.impossible_timing}),
}


def _write(tmp: Path, name: str) -> tuple[Path, str]:
    mode, body, _ = CASES[name]
    code = CANDIDATE.format(kernels=KERNELS, mode=mode, body=body)
    code_hash = hashlib.sha256(code.encode()).hexdigest()[:16]
    path = tmp / f"{code_hash}.py"
    path.write_text(code)
    return path, code_hash


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """All candidates built in parallel (they share source text, but each hash gets its own dir), as
    a batch builds them: the .cu against the light ATen header (pipeline/build/headers.py)."""
    tmp = tmp_path_factory.mktemp("redteam_cuda")
    files = {name: _write(tmp, name) for name in CASES}
    options = build.BuildOptions(600, 4, cuda=True)
    with ThreadPoolExecutor(len(files)) as pool:
        results = dict(zip(files, pool.map(lambda f: build.build(f[0], f[1], tmp / "builds", options),
                                           files.values())))
    return {name: (files[name][0], results[name]) for name in files}


@pytest.fixture(scope="session")
def bench():
    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    return prepare(task, "small", "cuda", SETTINGS)


def _gpu_idle(bench=None) -> bool:
    """No compute process on the GPU but the task's own reference processes (which stay alive,
    idle and holding no memory, for the whole run)."""
    # Only this process's GPUs: on a machine of several the others may run other work.
    only = ["-i", os.environ["CUDA_VISIBLE_DEVICES"]] if os.environ.get("CUDA_VISIBLE_DEVICES") else []
    out = subprocess.run(["nvidia-smi", *only, "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True)
    ours = {str(ref.proc.pid) for ref in (bench.references.values() if bench else [])}
    return out.returncode == 0 and not (set(out.stdout.split()) - ours)


def _built_pair(built, name: str) -> tuple[Path, Path]:
    path, result = built[name]
    return path, Path(result.build_dir)


@pytest.mark.parametrize("name", list(CASES))
def test_redteam_cuda(name, built, bench):
    path, result = built[name]
    assert result.ok, result.log[-2000:]
    assert result.headers == "light", result.log[-2000:]  # every red-team verdict stands under it
    settings = SETTINGS.model_copy(update={"timeout_s": 45}) if name == "hang" else SETTINGS
    verdict = evaluate.evaluate(bench, path, Path(result.build_dir), settings)
    print(f"\nREDTEAM {name}: {verdict.verdict.value} flags={[f.value for f in verdict.flags]} "
          f"time_ms={verdict.time_ms} error={verdict.error}")
    assert verdict.verdict in CASES[name][2], verdict.error
    if name == "honest":
        assert Flag.no_custom_kernel not in verdict.flags
        assert verdict.speedup_eager and verdict.speedup_eager > 0
    if name.startswith("forged") and verdict.verdict is Verdict.correct:
        # Judged at the time its honest twin is judged: a forged clock taken at its word is a hole.
        honest = evaluate.evaluate(bench, *_built_pair(built, "honest"), SETTINGS)
        print(f"REDTEAM {name} time_ms {verdict.time_ms} vs honest {honest.time_ms}; bound={verdict.bound_note} "
              f"trusted={verdict.trusted} {verdict.untrusted_reason}")
        assert verdict.time_ms >= honest.time_ms / 1.3, (verdict.time_ms, honest.time_ms, verdict.bound_note)
    if name == "leftover_spinner" and verdict.verdict is Verdict.correct:
        honest = evaluate.evaluate(bench, *_built_pair(built, "honest"), SETTINGS)
        print(f"REDTEAM leftover_spinner speedup {verdict.speedup_eager:.3f} vs honest {honest.speedup_eager:.3f}")
        # What it left behind slowed eager, timed beside it, no further than the reference's probe allows.
        assert verdict.speedup_eager <= 1.3 * honest.speedup_eager, (verdict.speedup_eager, honest.speedup_eager)
    if name == "timer_patch":
        # The patch changed nothing the harness calls: the time is real, and the work is PyTorch's.
        assert Flag.no_custom_kernel in verdict.flags
        assert verdict.time_ms >= 0.5 * verdict.baselines.eager.median_ms
    # Whatever the candidate did, the GPU is free for the next attempt.
    assert _gpu_idle(bench)


def test_side_stream_work_cannot_run_under_the_hold(built, bench):
    """A timed call is launched behind a kernel that holds every SM (pipeline.child.hold), so the host's
    launch is not timed. Work the candidate starts at once on a side stream, which the current
    stream then waits for, cannot run beside the hold: it lands after the start event, in full."""
    times = {}
    for name in ("honest", "side_overlap", "honest"):
        path, result = built[name]
        r = evaluate.evaluate(bench, path, Path(result.build_dir), SETTINGS)
        assert r.verdict is Verdict.correct, r.error
        times.setdefault(name, []).append(r.time_ms)
    print(f"\nREDTEAM side_overlap vs honest: {times}")
    # The hold's blocks all leave at one deadline, but the start event (like the honest kernel on the
    # same stream) waits for the hold's completion to be processed, while a side stream's kernel takes
    # the emptied SMs at once: it gains that dependency latency (6 us on the H100), and nothing more.
    assert times["side_overlap"][0] >= min(times["honest"]) - 0.010, times


def test_gpu_serves_next_attempt_after_hang_and_fault(built, bench):
    for name in ("hang", "illegal_address"):
        path, result = built[name]
        settings = SETTINGS.model_copy(update={"timeout_s": 45})
        evaluate.evaluate(bench, path, Path(result.build_dir), settings)
    path, result = built["honest"]
    assert evaluate.evaluate(bench, path, Path(result.build_dir), SETTINGS).verdict is Verdict.correct


def test_an_answer_made_at_the_capture_cannot_be_scaled_into_a_replay(bench, tmp_path):
    """tests/redteam/homogeneous_replay.py keeps each set's mse from outside the capture and, inside it,
    records only f^2 times it, f read from one element: with a scalar factor per replay its digests
    matched and its replays cost two tiny kernels. Each element's own factor (the play's mask) makes
    its answer wrong: mismatch on the checked replays, or correct at an honest time where no replay
    was captured its way."""
    code = REDTEAM_DIR / "homogeneous_replay.py"
    (tmp_path / "build").mkdir()
    result = evaluate.evaluate(bench, code, tmp_path / "build", SETTINGS)
    print(f"\nREDTEAM homogeneous_replay: {result.verdict.value} time_ms={result.time_ms} error={result.error} "
          f"bound={result.bound_note}")
    if result.verdict is Verdict.correct:
        assert result.speedup_eager < 1.3, (result.speedup_eager, result.bound_note)
    else:
        assert result.verdict is Verdict.mismatch and "digest" in (result.error or ""), result.error


def test_a_set_s_later_replays_cannot_be_answered_from_its_first(bench, tmp_path):
    """tests/redteam/pair_reuse.py answers a set's first replay honestly and its later ones from sums
    kept then and one element read for the replay's factor: under one mask a request its digests
    matched at a fraction of the work. No (set, mask) pair twice in a play makes the later answers
    wrong: mismatch on the checked replays."""
    code = REDTEAM_DIR / "pair_reuse.py"
    (tmp_path / "build").mkdir()
    result = evaluate.evaluate(bench, code, tmp_path / "build", SETTINGS)
    print(f"\nREDTEAM pair_reuse: {result.verdict.value} time_ms={result.time_ms} error={result.error} "
          f"bound={result.bound_note}")
    assert result.verdict is Verdict.mismatch and "digest" in (result.error or ""), result.error


def test_a_forged_clock_gains_nothing_at_kernelbench_size(built):
    """At KernelBench's size (a 2.8 ms kernel on the H100) the clock forged to a tenth is judged at
    its honest twin's time: the parent's replay windows are the only clock."""
    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    settings = SETTINGS.model_copy(update={"compile_baseline": False, "check_shapes": False})
    big = prepare(task, "default", "cuda", settings)
    try:
        results = {name: evaluate.evaluate(big, built[name][0], Path(built[name][1].build_dir), settings)
                   for name in ("honest", "forged_clock")}
    finally:
        big.close()
    for name, r in results.items():
        print(f"\nREDTEAM {name}@default: {r.verdict.value} time_ms={r.time_ms} parent_ms={r.wall_ms_per_call} "
              f"error={r.error}")
    assert results["honest"].verdict is Verdict.correct, results["honest"].error
    forged, honest = results["forged_clock"], results["honest"]
    assert forged.verdict is Verdict.correct and forged.time_ms >= honest.time_ms / 1.3, (forged.time_ms, honest.time_ms)


# mse at four call lengths on the H100: about 8 us, 20 us, 60 us and 2.8 ms (KernelBench's size).
CALL_SIZES = {"8us": {"batch_size": 64, "input_shape": (4096,)}, "20us": "small",
              "60us": {"batch_size": 4096, "input_shape": (8192,)}, "default": "default"}


# Forger and twin judged in turn this many times (KGEN_FORGE_ROUNDS): the rule is over their medians.
FORGE_ROUNDS = int(os.environ.get("KGEN_FORGE_ROUNDS", "4"))


@pytest.mark.parametrize("size", list(CALL_SIZES))
def test_a_clock_forged_to_half_gains_nothing_at_every_call_length(built, size):
    """The Bound requests replayed from CUDA graphs (pipeline.child.replays), timed by the parent's
    clock, are the time: the honest kernel is correct and a clock forged to half is judged at its
    twin's time, from calls of a few microseconds to KernelBench's size."""
    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    settings = SETTINGS.model_copy(update={"compile_baseline": False, "check_shapes": False})
    codes = {name: (built[name][0], Path(built[name][1].build_dir)) for name in ("honest", "forged_half")}
    results = judge_in_turn(task, CALL_SIZES[size], "cuda", settings, codes, FORGE_ROUNDS, f"forward@{size}")
    assert_refused_or_near_twin(results, honest_and_trusted)


BUSY_GPU = """
import sys, time, torch
x = torch.randn(8192, 8192, device="cuda")
torch.cuda.synchronize()
print("busy", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    x = torch.tanh(x @ x)
    torch.cuda.synchronize()
"""


def test_a_busy_gpu_is_refused_then_served_again(built, bench):
    """A process of our own keeps the GPU busy beside kgen: the device check refuses to time (one
    line says why), the attempt keeps its verdict with no timing, and once the process is gone the
    same kernel is timed again."""
    watch = health.Watch(os.environ.get("CUDA_VISIBLE_DEVICES"))
    path, result = built["honest"]
    build_dir = Path(result.build_dir)
    before = evaluate.evaluate(bench, path, build_dir, SETTINGS, watch=watch)
    assert before.verdict is Verdict.correct and before.device_unfit is None and before.timing, before.device_unfit
    busy = subprocess.Popen([sys.executable, "-c", BUSY_GPU, "120"], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline().strip() == "busy"
        time.sleep(2)  # into its loop
        sick = evaluate.evaluate(bench, path, build_dir, SETTINGS, watch=watch)
    finally:
        busy.kill()
        busy.wait()
    print(f"\nREDTEAM busy_gpu: {sick.verdict.value} device_unfit={sick.device_unfit!r} time_ms={sick.time_ms}")
    # Refused before timing (no time), or caught after it (the time is kept, marked): never trusted.
    assert sick.verdict is Verdict.correct and sick.device_unfit
    assert not is_verified({**summary_fields(sick), "code_hash": "x", "flags": []})
    after = evaluate.evaluate(bench, path, build_dir, SETTINGS, watch=watch)
    print(f"REDTEAM after busy_gpu: device_unfit={after.device_unfit!r} time_ms={after.time_ms} "
          f"before {before.time_ms}; probes {[(p and round(p.bandwidth_gbs), p and p.hold_ms, r) for p, r in watch.history]}")
    assert after.device_unfit is None and after.timing is not None


@pytest.mark.skipif(not __import__("torch").cuda.is_available() or __import__("torch").cuda.device_count() < 2,
                    reason="needs two GPUs")
def test_two_lanes_share_a_batch_and_an_unfit_gpu_is_retired(built):
    """Two GPUs, two lanes: a process of our own keeps the second GPU busy, so that lane's
    health check fails; it is taken out of service with one line, and every attempt gets its verdict
    and a trusted timing from the first GPU."""
    import asyncio

    from pipeline.run.executor import LocalExecutor, visible_gpus

    gpus = visible_gpus()
    notices: list[str] = []
    executor = LocalExecutor("cuda", notice=notices.append)
    assert executor.lanes == len(gpus) >= 2
    path, result = built["honest"]
    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    busy = subprocess.Popen([sys.executable, "-c", BUSY_GPU, "240"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": gpus[-1]})

    async def batch():
        bench = await executor.prepare(task, "small", "cuda", SETTINGS, {})
        try:
            return await asyncio.gather(*(executor.evaluate(bench, path, Path(result.build_dir), SETTINGS)
                                          for _ in range(2 * len(gpus))))
        finally:
            bench.close()

    try:
        assert busy.stdout.readline().strip() == "busy"
        time.sleep(2)
        results = asyncio.run(batch())
    finally:
        busy.kill()
        busy.wait()
        executor.close()
    print(f"\nLANES notices={notices} verdicts={[(r.verdict.value, r.device_unfit, r.time_ms) for r in results]}")
    assert [r.verdict for r in results] == [Verdict.correct] * len(results)
    assert all(r.device_unfit is None and r.timing is not None for r in results)
    assert executor.lanes == len(gpus) - 1 and f"GPU {gpus[-1]}" in executor.pool.retired
    assert len(notices) == 1 and notices[0].startswith(f"lane GPU {gpus[-1]} taken out of service")


def test_a_lone_set_is_replayed_from_the_reference_s_inputs_within_two_sets_of_memory():
    """pipeline.child.replays.Captured: a set too large to keep two of (`lone`, mse at 768 MiB a set
    here) holds its mask itself and is rewritten in place. Its play's digest is the digest of the
    model on the reference's inputs for that replay (`inputs_for`, the same ops bit for bit), and the
    capture holds the set and its base, not a mask and a temporary of the set's size beside them (at
    KernelBench's default mse size those two were 16 of the child's 41 GiB, and the capture ran out)."""
    import torch
    from pipeline.child import replays

    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    module = tasks.load_module(task, {"batch_size": 6144, "input_shape": (16384,)}, "float32")
    set_bytes = 2 * 6144 * 16384 * 4
    assert replays.lone(set_bytes) and replays.most_replays(1, set_bytes) == 1
    model = tasks.make_model(module, module.Model, 1, "cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    captured = replays.Captured(model, module, [7], 1, 99, "cuda")
    peak = torch.cuda.max_memory_allocated() - before
    got = captured.play(1234)
    inputs, seed = replays.inputs_for(module, [7], 0, 1, 1234, "cuda")
    want = float(replays.digest(model(*inputs), replays.weights(1, 99, "cuda")))
    del captured, inputs
    torch.cuda.empty_cache()  # this test runs in pytest's process: nothing left beside later children
    assert seed == 7 and got == [want], (got, want)
    # set + base, the model's two temporaries of a set's half each, and the first inputs' warm-up
    assert peak <= 3.2 * set_bytes, f"{peak / set_bytes:.2f} sets' bytes at the capture"


def test_a_later_request_rebased_on_the_same_graphs_is_the_reference_s():
    """pipeline.child.replays.Captured.rebase: a later request of the same shape is played on the
    graphs captured for the first, its sets' bases and the digest's weights drawn again from its own
    seeds in place. Each replay's digest is the model's on the reference's inputs for that request
    (`inputs_for`), and no memory is taken beyond the first capture's."""
    import torch
    from pipeline.child import replays

    task = tasks.discover(ROOT / "reference_tasks", ["mse"])[0]
    module = tasks.load_module(task, "small", "float32")
    model = tasks.make_model(module, module.Model, 1, "cuda")
    captured = replays.Captured(model, module, [5, 6, 7], 12, 41, "cuda")
    captured.play(100)
    torch.cuda.synchronize()
    held = torch.cuda.memory_reserved()
    requests = (([8, 9, 10], 42, 101), ([11, 12, 13], 43, 102))
    played = []
    for seeds, digest_seed, play_seed in requests:
        assert captured.rebase(seeds, digest_seed)
        played.append(captured.play(play_seed))
    # Read before this test's own reference forwards below, which allocate in this process too.
    assert torch.cuda.memory_reserved() <= held + (64 << 20)  # the draws' transients, reused
    for (seeds, digest_seed, play_seed), got in zip(requests, played):
        w = replays.weights(1, digest_seed, "cuda")
        for r in (0, 4, 11):
            inputs, _ = replays.inputs_for(module, seeds, r, 12, play_seed, "cuda")
            want = float(replays.digest(model(*inputs), w))
            assert got[r] == pytest.approx(want, rel=1e-6), (seeds, r, got[r], want)
    assert not captured.rebase([1, 2], 44)  # another shape of request: captured anew
    del captured
    torch.cuda.empty_cache()


def test_the_parent_reads_free_gpu_memory_from_the_driver_without_a_cuda_context():
    """`kgen eval` and a batch check that a size fits before anything starts. The parent reads the
    free bytes through nvidia-smi (health.gpu_free_bytes), not through torch: a CUDA context in
    the parent would hold GPU memory beside every timed kernel. Checked here in a fresh process,
    against torch's own figure read afterwards."""
    probe = ("import torch; from pipeline.judge import health; free = health.gpu_free_bytes(None); "
             "ctx = torch.cuda.is_initialized(); torch_free, _ = torch.cuda.mem_get_info(0); "
             "print(free, ctx, torch_free)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    free, initialised, torch_free = out.stdout.split()
    assert initialised == "False"  # nvidia-smi was asked; torch had opened no context
    # torch's own figure is read after its context (some hundreds of MB) exists, so it is the lower
    assert 0 <= int(free) - int(torch_free) < 2 << 30, (free, torch_free)


# KernelBench's level-2 rule: a candidate that keeps the convolution in cuDNN and
# fuses the bias and ReLU after it into its own kernel is correct and not flagged; its own share of the
# call is recorded (the child's claim). The task's own Model dropped in is flagged no_custom_kernel.
CONV_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return torch.relu(self.conv(x) + self.bias)


batch_size = 32
in_channels = 16
out_channels = 64
height = width = 128
kernel_size = 3
bias_shape = (out_channels, 1, 1)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape]
'''

CONV_FUSED = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void bias_relu_kernel(const float* x, const float* bias, float* out, int64_t n, int64_t plane, int64_t channels) {
    int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i] + bias[(i / plane) % channels];
        out[i] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor bias_relu(torch::Tensor x, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && bias.is_cuda());
    auto in = x.contiguous();
    auto b = bias.contiguous();
    auto out = torch::empty_like(in);
    int64_t n = in.numel(), plane = in.size(2) * in.size(3), channels = in.size(1);
    int threads = 256;
    int64_t blocks = (n + threads - 1) / threads;
    bias_relu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        in.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n, plane, channels);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

fused = load_inline(name="kgen_level2_bias_relu", cpp_sources="torch::Tensor bias_relu(torch::Tensor x, torch::Tensor bias);",
                    cuda_sources=cuda_source, functions=["bias_relu"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return fused.bias_relu(self.conv(x), self.bias)
'''


def test_a_level_2_candidate_keeping_cudnn_is_not_flagged_and_its_own_share_is_recorded(tmp_path):
    level2 = tmp_path / "KernelBench" / "level2"
    level2.mkdir(parents=True)
    (level2 / "901_Conv2d_BiasAdd_ReLU.py").write_text(CONV_TASK)
    task = tasks.task_file(level2 / "901_Conv2d_BiasAdd_ReLU.py")
    assert task.level == 2
    settings = SETTINGS.model_copy(update={"check_shapes": False})
    bench = prepare(task, "default", "cuda", settings)
    try:
        verdicts = {}
        for name, code in (("fused", CONV_FUSED), ("dropin", CONV_TASK + "\n\nclass ModelNew(Model):\n    pass\n")):
            code_hash = hashlib.sha256(code.encode()).hexdigest()[:16]
            path = tmp_path / f"{code_hash}.py"
            path.write_text(code)
            result = build.build(path, code_hash, tmp_path / "builds", build.BuildOptions(600, 4, cuda=True, reuse=False))
            assert result.ok, result.log[-2000:]
            verdicts[name] = evaluate.evaluate(bench, path, Path(result.build_dir), settings)
            v = verdicts[name]
            print(f"\nLEVEL2 {name}: {v.verdict.value} flags={[f.value for f in v.flags]} own={v.own_fraction} "
                  f"x_eager={v.speedup_eager}")
    finally:
        bench.close()
    fused_v, dropin = verdicts["fused"], verdicts["dropin"]
    assert fused_v.verdict is Verdict.correct, fused_v.error
    assert Flag.no_custom_kernel not in fused_v.flags
    assert fused_v.own_fraction is not None and 0.01 <= fused_v.own_fraction < 1.0
    assert summary_fields(fused_v)["own_fraction"] == fused_v.own_fraction
    assert dropin.verdict is Verdict.correct and Flag.no_custom_kernel in dropin.flags
    assert Flag.no_custom_kernel not in dropin.outcome.claims  # the parent's finding: no code of its own


def test_the_gpu_profile_lists_the_call_s_kernels():
    """On a GPU the child's profile (pipeline.child.profiling) sees each kernel the call ran: with
    torch.autograd's profiler in its fallback (no Kineto) it saw none, so no call's share of its own
    kernels was known and no pure-PyTorch candidate was flagged `no_custom_kernel`."""
    script = (
        "import sys, types, torch\n"
        "from pipeline.child.profiling import profile\n"
        "module = types.SimpleNamespace(get_inputs=lambda: [torch.rand(256, 256), torch.rand(256, 256)])\n"
        "model = lambda a, b: torch.mean((a - b) ** 2)\n"
        "out = profile(model, module, 7, 'cuda')\n"
        "print(out['total_us'] > 0, out['torch_fraction'], len(out['top'])); print('torch._inductor' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    kernels, inductor = done.stdout.strip().splitlines()[-2:]
    print(f"\nPROFILE {kernels} inductor={inductor}")
    seen, fraction, count = kernels.split()
    assert seen == "True" and float(fraction) == 1.0 and int(count) >= 2, done.stdout
    assert inductor == "False", done.stdout


# ---- the room's holes as CUDA candidates (tests/test_room.py runs them on the cpu) ------------------

import test_room as room  # noqa: E402 - its helpers (tagged, kgen, notes, the reaper, the scans), not its tests

subreaper = room.subreaper  # the fixture, under its own name: this test process reaps what the hoppers orphan


@pytest.mark.gpu
def test_cuda_siblings_share_no_answers_through_sysv_shm(tmp_path):
    """Three samples of mse at "small" on the cuda backend, judged on one draw through `kgen run`:
    sibling_sysv_cuda.py twice (each call reads a strided sample of its inputs back to the host and
    looks its hash up in a System V segment; the first to run computes with a CUDA kernel and publishes,
    the second returns what it finds as a CUDA tensor without launching the reduction) and its honest
    twin (the same kernels, no segment). The compute kernel is one block, slower than eager, so no
    sample may be judged correct and faster than eager, and no attack sample may have served more of
    its calls from the table than it computed (its own `shm hits H misses M` note): one that did read
    its sibling's answers. The twin is correct (and no faster than eager), a computing sibling is
    correct, and after the batch no segment with the candidates' key is left (`ipcs`)."""
    tag = os.urandom(6).hex()
    key = room.sysv_key(tag)
    attack = room.tagged("sibling_sysv_cuda.py", tag, tmp_path).read_text()
    honest = room.tagged("sibling_sysv_cuda.py", tag, tmp_path, **room.TWIN["sibling_sysv_cuda.py"]).read_text()
    config = room.write_config(tmp_path, [attack, attack, honest], size="small", backend="cuda")
    try:
        proc = room.kgen("run", "-c", str(config), cwd=tmp_path)
        left = room.ipcs_keys()["m"]
    finally:
        room.ipcrm("m", key)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = room.batch_results(tmp_path / "kgen.db")
    shown = "\n".join(room.describe(r) for r in results)
    print(f"\nREDTEAM sibling_sysv_cuda:\n{shown}")
    assert len(results) == 3, shown
    # Siblings: one draw for the three (the first computed it; the later ones reused it).
    assert sorted(r.phases.get("shared_draw") for r in results) == [0.0, 1.0, 1.0], shown
    twin = [r for r in results if not any(n[:2] in (["shm", "attached"], ["shm", "denied"]) for n in room.notes(r.output))]
    assert len(twin) == 1 and twin[0].verdict is Verdict.correct, shown  # the honest kernel is right
    assert not room.faster(twin[0]), shown  # and slower than eager: a fast sibling got its speed elsewhere
    attacks = [r for r in results if r is not twin[0]]
    assert any(r.verdict is Verdict.correct for r in attacks), shown  # whichever computed is right
    # Each attack sample's last `shm hits H misses M`: one that read its sibling's answers served nearly
    # every call from the table; one that computed found only the few repeats of its own calls.
    counts = [[(int(n[2]), int(n[4])) for n in room.notes(r.output) if n[:2] == ["shm", "hits"]] for r in attacks]
    assert all(c and c[-1][0] < c[-1][1] for c in counts), f"a sibling served its calls from the table: {counts}"
    assert [r for r in results if room.faster(r)] == [], shown
    assert key not in left, f"a System V segment with key {key:#x} outlived the batch"


@pytest.mark.gpu
def test_no_pid_hopper_of_a_cuda_attempt_outlives_kgen_eval(tmp_path, subreaper):
    """pid_hopper_cuda.py forks, at import, a helper that leaves its group and hops pids every 3 ms, from
    the build child (comm kb+TAG, hopping through the nvcc build) and from the evaluation child (ke+TAG,
    beside a CUDA context), around an honest CUDA kernel. After `kgen eval --backend cuda` returns (and
    a moment for the kernel to finish its kills), neither is alive: not in /proc (each group seen is
    frozen, then scanned: room.frozen_survivors), not in `ps`. The test is the subreaper of what it
    starts, so nothing the attempt orphans is left to the host's pid 1."""
    tag = os.urandom(6).hex()
    names = {f"kb{tag}", f"ke{tag}"}
    code = room.tagged("pid_hopper_cuda.py", tag, tmp_path)
    config = room.write_config(tmp_path, ["pass"], size="small", backend="cuda")
    groups: set[int] = set()
    try:
        proc = room.kgen("eval", str(code), "--task", "mse", "--backend", "cuda", "-c", str(config), cwd=tmp_path)
        time.sleep(1.0)  # SIGKILL sent is not yet dead: a moment, no more
        attempts = room.stored(tmp_path / "kgen.db") if (tmp_path / "kgen.db").exists() else []
        # The helpers' own groups, as their notes gave them: only where to look (frozen_survivors).
        for text in [a["build_log"] for a in attempts] + [a["result"].output for a in attempts]:
            groups |= {int(n[2]) for n in room.notes(text) if n[0] == "hopper" and len(n) > 2 and n[2].isdigit()}
        left, groups = room.frozen_survivors(names, groups)
        ps = subprocess.run(["ps", "-eo", "pid,user,pgid,stat,comm"], capture_output=True, text=True).stdout
        in_ps = [line for line in ps.splitlines()
                 if any(n in line.split() for n in names) and line.split()[3][0] not in "ZX"]
    finally:
        room.end_hoppers(names, groups)
    # (Its exit status is not looked at: an untrusted or unfit timing may exit non-zero.)
    assert len(attempts) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    [attempt] = attempts
    result = attempt["result"]
    print(f"\nREDTEAM pid_hopper_cuda: {room.describe(result)}")
    assert result.verdict is Verdict.correct, room.describe(result)
    # A helper was started in the build child and in the evaluation child (each one's note in its log).
    assert any(n[:2] == ["hopper", "b"] for n in room.notes(attempt["build_log"])), attempt["build_log"][-2000:]
    assert any(n[:2] == ["hopper", "e"] for n in room.notes(result.output)), room.describe(result)
    assert left == [], f"alive after kgen eval returned (pid, comm, state, pgrp): {left}"
    assert in_ps == [], in_ps
