import os

import pytest


def pytest_configure(config):
    """Each xdist worker's cpu evaluations time on a core of their own (KGEN_CPU_CORES,
    pipeline.sandbox.cpu_cores): both on the first, core 0 ran at 99% while core 1 sat two-thirds
    idle, and every child and reference process of both workers queued on it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    cores = sorted(os.sched_getaffinity(0))
    if worker.startswith("gw") and len(cores) > 1 and "KGEN_CPU_CORES" not in os.environ:
        os.environ["KGEN_CPU_CORES"] = str(cores[int(worker[2:]) % len(cores)])


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cpu_ticks():
    """A process's cpu time so far (user + system, in clock ticks), read from /proc by the test
    itself: what a spinning or loading process really used, not what it says."""
    def ticks(pid: int) -> int:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    return ticks


@pytest.fixture(scope="module")
def mse_bench(request):
    """One reference process for the bundled mse at "small" on the cpu, under the test module's
    SETTINGS, for the whole module."""
    from pathlib import Path

    from pipeline.child import tasks
    from pipeline.judge.bench import prepare

    task = tasks.discover(Path(__file__).resolve().parent.parent / "reference_tasks", ["mse"])[0]
    bench = prepare(task, "small", "cpu", request.module.SETTINGS)
    yield bench
    bench.close()
