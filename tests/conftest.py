import os
import shutil
import tempfile

import pytest


def pytest_configure(config):
    """Each xdist worker's cpu evaluations time on a core of their own (KGEN_CPU_CORES,
    pipeline.sandbox.cpu_cores): both on the first, core 0 ran at 99% while core 1 sat two-thirds
    idle, and every child and reference process of both workers queued on it.

    Builds are kept for the session alone (KGEN_BUILD_CACHE, made here before the workers start,
    so they share it): a candidate built by one test is not built again by the next, and nothing a
    build test checks comes from an earlier session's build."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker and "KGEN_BUILD_CACHE" not in os.environ:
        os.environ["KGEN_BUILD_CACHE"] = config._kgen_builds = tempfile.mkdtemp(prefix="kgen-test-builds-")
    cores = sorted(os.sched_getaffinity(0))
    if worker.startswith("gw") and len(cores) > 1 and "KGEN_CPU_CORES" not in os.environ:
        os.environ["KGEN_CPU_CORES"] = str(cores[int(worker[2:]) % len(cores)])


def pytest_unconfigure(config):
    if getattr(config, "_kgen_builds", None):
        shutil.rmtree(config._kgen_builds, ignore_errors=True)
        del os.environ["KGEN_BUILD_CACHE"]


# The test files that judge real candidates many times over (each a jailed child and a reference
# process, minutes of a 2-core box), build C++ extensions or install a wheel. Every other test, unless
# marked gpu or slow, is `fast`: `python -m pytest -m fast -n 2` is a maintainer's loop of a few
# minutes; CI runs them all.
SLOW_FILES = frozenset({
    "test_big_output.py", "test_cpu_outputs.py", "test_expected_memfd.py", "test_grad.py", "test_headers.py",
    "test_health.py", "test_held_out_failure.py", "test_honest.py", "test_kb_sweep.py", "test_library.py",
    "test_redteam.py", "test_reference.py", "test_run.py", "test_sandbox_threads.py", "test_search.py",
    "test_serve.py", "test_step_limits.py", "test_timing.py", "test_triton.py", "test_wheel.py",
})
# And, in files that are otherwise fast, the tests that judge through a whole `kgen run` or `kgen eval`
# (15-55 s each on a busy 2-core box).
SLOW_TESTS = frozenset({
    "test_bad_input.py::test_a_read_only_database_folder_is_one_line_to_writers_and_still_read",
    "test_kernelbench.py::test_a_batch_over_kernelbench_stores_level_and_problem",
    "test_lanes.py::test_a_reference_started_ahead_of_its_lane_warms_its_compiler_without_the_gpu",
    "test_tasks.py::test_kgen_eval_grad_and_dtype_flags_reach_the_judge_and_the_database",
    "test_tasks.py::test_a_dropped_in_kernelbench_task_with_weights_runs_unchanged",
    "test_tasks.py::test_kgen_eval_json_reports_and_stores_the_size_that_ran",
})


def is_fast(item) -> bool:
    if item.path.name in SLOW_FILES or "gpu" in item.keywords or "slow" in item.keywords:
        return False
    return f"{item.path.name}::{item.originalname}" not in SLOW_TESTS


def pytest_collection_modifyitems(config, items):
    names = {f"{item.path.name}::{item.originalname}" for item in items}
    if {name.split("::")[0] for name in SLOW_TESTS} <= {item.path.name for item in items}:
        stale = SLOW_TESTS - names  # a renamed test would silently join the fast tier
        assert not stale, f"tests/conftest.py SLOW_TESTS names tests that do not exist: {sorted(stale)}"
    for item in items:
        if is_fast(item):
            item.add_marker(pytest.mark.fast)

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
