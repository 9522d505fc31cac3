"""Evaluation lanes: one job per lane at a time, and a lane whose device fails is retired.

The GPU side (two real lanes, one made unfit by a foreign process) is tests/test_gpu.py's
test_two_lanes_share_a_batch_and_an_unfit_gpu_is_retired; here the pool itself, with plain jobs."""

import asyncio
import json
import os
import subprocess
import sys

import pytest

from pipeline.run.executor import lane_gpus, ray_lane_count
from pipeline.run.lanes import LaneFailed, Lanes


def test_a_failed_lane_is_retired_and_its_job_goes_to_another():
    notices: list[str] = []
    pool = Lanes(["0", "1"], notices.append, name=lambda gpu: f"GPU {gpu}")
    ran: list[tuple[int, str]] = []
    busy: set[str] = set()

    async def job_for(n: int):
        async def job(lane: str):
            assert lane not in busy, "two jobs on one lane at once"
            busy.add(lane)
            try:
                await asyncio.sleep(0.01)
                if lane == "1":
                    raise LaneFailed("another compute process is on the GPU (123 hog)", f"unfit {n}")
                ran.append((n, lane))
                return f"ok {n}"
            finally:
                busy.discard(lane)
        return await pool.run(job)

    async def main():
        return await asyncio.gather(*(job_for(n) for n in range(6)))

    results = asyncio.run(main())
    assert results == [f"ok {n}" for n in range(6)]  # every job's result came from the fit lane
    assert sorted(n for n, _ in ran) == list(range(6)) and {lane for _, lane in ran} == {"0"}
    assert pool.live == ["0"] and list(pool.retired) == ["GPU 1"] and len(pool) == 1
    assert notices == ["lane GPU 1 taken out of service: another compute process is on the GPU (123 hog); "
                       "its attempts go to lane GPU 0"]


def test_the_last_lane_is_kept_and_its_jobs_keep_what_they_found():
    notices: list[str] = []
    pool = Lanes([None], notices.append)

    async def job(lane):
        raise LaneFailed("bandwidth 673 GB/s against 3002 GB/s when the run began", "correct, timing unfit")

    async def main():
        return [await pool.run(job), await pool.run(job)]

    assert asyncio.run(main()) == ["correct, timing unfit"] * 2
    assert pool.live == [None] and notices == []


def test_an_error_that_is_not_the_device_frees_the_lane():
    pool = Lanes(["0"])

    async def broken(lane):
        raise ValueError("the task's reference failed")

    async def fine(lane):
        return lane

    async def main():
        try:
            await pool.run(broken)
        except ValueError as exc:
            assert "reference" in str(exc)
        else:
            raise AssertionError("the error was swallowed")
        return await asyncio.wait_for(pool.run(fine), 5)

    assert asyncio.run(main()) == "0"


def _batch(pool: Lanes, jobs: list[tuple[str, float]]) -> list[tuple[str, str]]:
    """Run (key, seconds) jobs at once; which lane ran each key."""
    ran: list[tuple[str, str]] = []

    async def one(key: str, seconds: float):
        async def job(lane: str):
            await asyncio.sleep(seconds)
            ran.append((key, lane))
        await pool.run(job, key)

    async def main():
        await asyncio.gather(*(one(k, s) for k, s in jobs))

    asyncio.run(main())
    return ran


def test_a_task_stays_on_the_lane_that_holds_its_reference():
    # Task a's attempts are slow, b's fast: a plain queue would hand b's free lane the next a.
    # Once b's are done, lane 1 takes a's rather than stay idle.
    ran = _batch(Lanes(["0", "1"]), [("a", 0.05), ("b", 0.01)] * 4)
    on = {lane: [k for k, ran_on in ran if ran_on == lane] for lane in "01"}
    assert len(ran) == 8 and on["1"][:4] == ["b"] * 4 and set(on["0"]) == {"a"}, ran


def test_no_lane_idles_while_attempts_wait():
    ran = _batch(Lanes(["0", "1"]), [("a", 0.02)] * 6)
    assert {lane for _, lane in ran} == {"0", "1"}, ran


# How many lanes a machine gets: one per visible GPU, read the way CUDA reads them.


@pytest.mark.parametrize("listed, count, lanes", [
    (None, 4, ["0", "1", "2", "3"]),          # unset: every device CUDA found
    (None, 0, []),                            # no GPU (this box): no GPU lane
    ("2,3", 2, ["2", "3"]),                   # a subset, kept as written: the lane's child gets "2"
    (" 1 , 0 ", 2, ["1", "0"]),
    ("0,1,2,3", 2, ["0", "1"]),               # more listed than exist: only as many as CUDA found
    ("0,-1,1", 2, ["0"]),                     # CUDA stops at the first entry naming no device
    ("-1", 4, []),
    ("", 4, []),                              # set but empty hides every GPU
    ("GPU-6f0c5f1a,GPU-9b2e", 2, ["GPU-6f0c5f1a", "GPU-9b2e"]),
    ("MIG-4a1d", 1, ["MIG-4a1d"]),
])
def test_one_lane_per_gpu_cuda_can_see(listed, count, lanes):
    assert lane_gpus(listed, count) == lanes


def test_ray_makes_one_actor_per_gpu():
    assert ray_lane_count({"CPU": 64.0, "GPU": 4.0}, on_gpu=True) == 4
    assert ray_lane_count({"CPU": 16.0}, on_gpu=True) == 1  # none yet: one actor waits for a GPU
    assert ray_lane_count({"CPU": 16.0, "GPU": 2.0}, on_gpu=False) == 8
    assert ray_lane_count({"CPU": 1.0}, on_gpu=False) == 1


def _lanes_in_a_fresh_process(visible: str | None) -> dict:
    """visible_gpus() and a LocalExecutor's lanes in a new interpreter with this CUDA_VISIBLE_DEVICES
    (torch reads it once, when CUDA first starts), with nvidia-smi kept off the PATH."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PATH"] = os.path.dirname(sys.executable)  # python only: no nvidia-smi, as on a box without a driver
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    code = ("import json, torch; from pipeline.run.executor import LocalExecutor, visible_gpus;"
            "ex = LocalExecutor('cuda', build_workers=1);"
            "print(json.dumps({'gpus': visible_gpus(), 'cuda': torch.cuda.device_count() if torch.cuda.is_available() else 0,"
            " 'lanes': ex.lanes, 'pool': ex.pool.live})); ex.close()")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("visible", [None, "0,1", "-1"])
def test_the_local_executor_makes_a_lane_per_gpu_it_can_see(visible):
    """The real visible_gpus() and LocalExecutor: on a machine with GPUs one lane each; on this cpu box
    (whatever CUDA_VISIBLE_DEVICES lists, and no nvidia-smi) none that names a GPU, and the one lane
    it still needs to judge anything."""
    seen = _lanes_in_a_fresh_process(visible)
    expected = lane_gpus(visible, seen["cuda"])
    assert seen["gpus"] == expected
    assert seen["lanes"] == max(1, len(expected))
    assert seen["pool"] == (expected or [None])


WARM_OFF_LANE = """
import json, time, torch
from pipeline.judge.compiling import CompilerWarmup
started = time.monotonic()
warm = CompilerWarmup("cuda", False, off_lane=True).join()
print(json.dumps({**warm, "cuda_initialized": torch.cuda.is_initialized(),
                  "inductor": "torch._inductor.compile_fx" in __import__("sys").modules}))
"""


def test_a_reference_started_ahead_of_its_lane_warms_its_compiler_without_the_gpu():
    """pipeline.judge.reference.CompilerWarmup with off_lane (TaskBench.early): a batch's references
    started ahead of the lane ran CUDA start-up and a compiled probe beside the lane's timing on an
    H200, and honest attempts were refused for a busy GPU. Off the lane the warm-up touches no CUDA,
    generates no code (inductor's C++ took 70 s beside builds), and still imports inductor."""
    out = subprocess.run([sys.executable, "-c", WARM_OFF_LANE], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    warm = json.loads(out.stdout.strip().splitlines()[-1])
    assert warm["error"] is None, warm
    assert warm["cuda_initialized"] is False and warm["inductor"] is True
    assert warm["warm_s"] < 60, warm  # no C++ compiled: 1.8 s idle on the 2-core box, 15 s with inductor's
