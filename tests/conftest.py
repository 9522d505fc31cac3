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


# The test files that judge real candidates many times over (each a jailed child and a reference
# process, minutes of a 2-core box), build C++ extensions or install a wheel. Every other test, unless
# marked gpu or slow, is `fast`: `python -m pytest -m fast -n 2` is a maintainer's loop of a few
# minutes; CI runs them all.
SLOW_FILES = frozenset({
    "test_big_output.py", "test_cpu_outputs.py", "test_grad.py", "test_headers.py", "test_health.py",
    "test_honest.py", "test_kb_sweep.py", "test_library.py", "test_redteam.py", "test_run.py",
    "test_sandbox_threads.py", "test_search.py", "test_serve.py", "test_timing.py", "test_triton.py",
    "test_wheel.py",
})


def pytest_collection_modifyitems(config, items):
    fast = pytest.mark.fast
    for item in items:
        if item.path.name not in SLOW_FILES and "gpu" not in item.keywords and "slow" not in item.keywords:
            item.add_marker(fast)

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
