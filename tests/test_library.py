"""The kernel library on the cpu backend, with a real C++ MSE kernel stored as the best attempt."""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from pipeline import library
from pipeline.library.export import LOCK, MANIFEST
from pipeline.library.kernels import KernelEntry
from pipeline.library.replay import KgenFallbackWarning, LibraryError, import_kernel
from pipeline.records import Baselines, EvalResult, Flag, Provenance, ShapeRun, Timing, TrialResult, Verdict
from pipeline.store.store import Store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
MSE_TASK = ROOT / "reference_tasks" / "mse.py"

# Double accumulation, a 0-dim float32 result: what a careful generated CPU kernel looks like.
KERNEL = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>

torch::Tensor mse(torch::Tensor p, torch::Tensor t) {
    TORCH_CHECK(p.scalar_type() == torch::kFloat && t.scalar_type() == torch::kFloat, "float32 only");
    TORCH_CHECK(p.is_contiguous() && t.is_contiguous(), "contiguous only");
    TORCH_CHECK(p.numel() == t.numel(), "sizes differ");
    const float* a = p.data_ptr<float>();
    const float* b = t.data_ptr<float>();
    const int64_t n = p.numel();
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = (double)a[i] - (double)b[i];
        acc += d * d;
    }
    torch::Tensor out = torch::empty({}, p.options());
    out.data_ptr<float>()[0] = (float)(acc / (double)n);
    return out;
}
"""

_ext = load_inline(name="kgen_test_mse", cpp_sources=_CPP, functions=["mse"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _ext.mse(predictions, targets)
'''
CODE_HASH = hashlib.sha256(KERNEL.encode()).hexdigest()[:16]


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, n=20)


# Held-out sizes as pipeline.judge.checks records them: correct, and its own kernel ran.
SERVED_ODD = [ShapeRun(size="odd", correct=True, own_ran=True)]


def _result(shape_trials: bool, verdict: Verdict = Verdict.correct, kernel: Timing | None = None, eager: float = 1.0,
            compiled: float = 0.8, shapes: list[ShapeRun] | None = None) -> EvalResult:
    trials = [TrialResult(index=i, variant=v, ok=True) for i, v in enumerate(("base", "scaled", "heavy"))]
    shapes = SERVED_ODD if shapes is None and shape_trials else shapes or []
    for i, run in enumerate(shapes):
        trials.append(TrialResult(index=3 + i, variant=f"scaled@{run.size}", ok=True))
    if verdict != Verdict.correct:
        return EvalResult(verdict=verdict, error="mismatch", trials=trials[:1], device="cpu: Test CPU",
                          torch_version=torch.__version__)
    return EvalResult(verdict=verdict, trials=trials, timing=kernel or _timing(0.5), shapes=shapes,
                      sizes=["small", *(run.size for run in shapes)],
                      baselines=Baselines(eager=_timing(eager), compiled=_timing(compiled), floor_ms=0.1),
                      device="cpu: Test CPU", torch_version=torch.__version__)


def _db(path: Path, shape_trials: bool = True, verdict: Verdict = Verdict.correct, **timings) -> Path:
    with Store.open(path) as store:
        run = store.start_run("{}", "[]", "cpu", "cpu: Test CPU", torch.__version__, None)
        task_id = store.upsert_task("mse", str(MSE_TASK), MSE_TASK.read_text())
        store.save_attempt(Provenance(run_id=run, task_id=task_id, task="mse", model="m1", sample=0, backend="cpu",
                                      template="t", completion_id=None, code_hash=CODE_HASH,
                                      size="small"), _result(shape_trials, verdict, **timings))
    return path


@pytest.fixture(scope="session")
def dirs(tmp_path_factory):
    """generated/ and builds/ shared by every test: the extension compiles once per session."""
    root = tmp_path_factory.mktemp("kgen")
    generated, builds = root / "generated", root / "builds"
    generated.mkdir()
    (generated / f"{CODE_HASH}.py").write_text(KERNEL)
    import_kernel(KERNEL, CODE_HASH, generated / f"{CODE_HASH}.py", builds / CODE_HASH)
    return {"generated_dir": generated, "builds_dir": builds}


@pytest.fixture
def mse(tmp_path, dirs):
    return library.load("mse", db=_db(tmp_path / "kgen.db"), backend="cpu", **dirs)


def _inputs(*shape, dtype=torch.float32, grad=False):
    torch.manual_seed(sum(shape))
    p = torch.randn(*shape, dtype=dtype) * 3 + 1
    t = torch.rand(*shape, dtype=dtype)
    return p.requires_grad_(grad), t.requires_grad_(grad)


def _ref(p, t):
    return torch.mean((p - t) ** 2)


def _ran_kernel(fn, *args, **kwargs) -> bool:
    """True when the call went through the kgen custom op (it shows in the profiler by name)."""
    with torch.profiler.profile() as prof:
        fn(*args, **kwargs)
    return any(e.name == f"kgen::mse_{CODE_HASH}" for e in prof.events())


def test_matches_reference_on_fresh_inputs(mse):
    assert mse.entry.code_hash == CODE_HASH
    assert mse.entry.envelope.shape_general is True
    assert [s.shape for s in mse.entry.envelope.inputs] == [[256, 4096], [256, 4096]]
    assert list(inspect.signature(mse.forward).parameters) == ["predictions", "targets"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", KgenFallbackWarning)
        for shape in ((256, 4096), (97, 1023)):  # its timed size, and odd: served there (SERVED_ODD)
            p, t = _inputs(*shape)
            out = mse(p, t)
            assert out.shape == () and out.dtype == torch.float32
            torch.testing.assert_close(out, _ref(p, t), rtol=1e-5, atol=0)
            assert _ran_kernel(mse, p, t)
        assert _ran_kernel(mse, predictions=p, targets=t)


def test_held_out_sizes_are_served_only_where_its_own_kernel_ran(tmp_path, dirs):
    """Correct at every held-out size is not enough: the kernel is used at a held-out size only
    where its own kernel ran there (pipeline.judge.checks); elsewhere, and at any shape no trial
    saw, the reference runs. A row stored before policy 5, with the child's times there, still loads."""
    shapes = [ShapeRun(size="odd", correct=True, own_ran=True),
              ShapeRun(size="batch_size=161,input_shape=(2599,)", correct=True, own_ran=False),
              ShapeRun.model_validate({"size": "batch_size=285,input_shape=(4607,)", "correct": True, "own_ran": None,
                                       "time": _timing(0.2).model_dump(), "faster": False})]
    mse = library.load("mse", db=_db(tmp_path / "kgen.db", shapes=shapes), backend="cpu", **dirs)
    assert list(mse.entry.envelope.served) == ["odd"]
    assert [s.shape for s in mse.entry.envelope.served["odd"]] == [[97, 1023], [97, 1023]]
    with warnings.catch_warnings():
        warnings.simplefilter("error", KgenFallbackWarning)
        for shape in ((256, 4096), (97, 1023)):
            assert _ran_kernel(mse, *_inputs(*shape))
    p, t = _inputs(161, 2599)
    with pytest.warns(KgenFallbackWarning, match=r"shape \(161, 2599\); the kernel is validated only at \(256, 4096\) "
                                                 r"and served at \(97, 1023\)"):
        assert torch.equal(mse(p, t), _ref(p, t))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KgenFallbackWarning)
        for shape in ((161, 2599), (285, 4607), (50, 60)):
            p, t = _inputs(*shape)
            assert torch.equal(mse(p, t), _ref(p, t)) and not _ran_kernel(mse, p, t)


def test_dtype_outside_envelope_falls_back_once(mse):
    p, t = _inputs(64, 100, dtype=torch.float64)
    with pytest.warns(KgenFallbackWarning, match="dtype float64; validated with float32"):
        out = mse(p, t)
    assert out.dtype == torch.float64 and torch.equal(out, _ref(p, t))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert not _ran_kernel(mse, p, t)
    assert [w for w in seen if issubclass(w.category, KgenFallbackWarning)] == []


def test_rank_outside_envelope_falls_back(mse):
    p, t = _inputs(4, 8, 16)
    with pytest.warns(KgenFallbackWarning, match="rank 3; validated with rank 2"):
        assert torch.equal(mse(p, t), _ref(p, t))


def test_shape_specialized_kernel_only_at_its_shape(tmp_path, dirs):
    mse = library.load("mse", db=_db(tmp_path / "kgen.db", shape_trials=False), backend="cpu", **dirs)
    assert mse.entry.envelope.shape_general is False
    p, t = _inputs(256, 4096)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KgenFallbackWarning)
        assert _ran_kernel(mse, p, t)
    p, t = _inputs(97, 1023)
    with pytest.warns(KgenFallbackWarning, match=r"shape \(97, 1023\); the kernel is validated only at "
                                                 r"\(256, 4096\)"):
        assert torch.equal(mse(p, t), _ref(p, t))


def test_kgen_disable(mse, monkeypatch, tmp_path, dirs):
    p, t = _inputs(256, 4096)
    monkeypatch.setenv("KGEN_DISABLE", "1")
    with pytest.warns(KgenFallbackWarning, match="KGEN_DISABLE=1"):
        assert torch.equal(mse(p, t), _ref(p, t))
    assert not _ran_kernel(mse, p, t)
    off = library.load("mse", db=_db(tmp_path / "other.db"), backend="cpu", **dirs)
    assert off.op is None and off.entry is None
    monkeypatch.delenv("KGEN_DISABLE")
    with pytest.warns(KgenFallbackWarning, match="KGEN_DISABLE=1"):  # disabled at load: nothing to run
        assert torch.equal(off(p, t), _ref(p, t))


def test_no_verified_kernel_runs_reference(tmp_path, dirs):
    mse = library.load("mse", db=_db(tmp_path / "kgen.db", verdict=Verdict.mismatch), backend="cpu", **dirs)
    assert mse.op is None
    p, t = _inputs(8, 8)
    with pytest.warns(KgenFallbackWarning, match="no verified kernel for cpu"):
        assert torch.equal(mse(p, t), _ref(p, t))


def test_flagged_attempt_is_not_verified(tmp_path, dirs):
    path = tmp_path / "kgen.db"
    with Store.open(path) as store:
        run = store.start_run("{}", "[]", "cpu", "cpu", torch.__version__, None)
        task_id = store.upsert_task("mse", str(MSE_TASK), MSE_TASK.read_text())
        result = _result(True)
        result = result.model_copy(update={"outcome": result.outcome.model_copy(update={"findings": [Flag.no_custom_kernel]})})
        store.save_attempt(Provenance(run_id=run, task_id=task_id, task="mse", model="m1", sample=0, backend="cpu",
                                      template="t", completion_id=None, code_hash=CODE_HASH, size="small"), result)
    assert library.load("mse", db=path, backend="cpu", **dirs).op is None


def test_gradients_are_the_references(mse):
    p, t = _inputs(256, 4096, grad=True)
    mse(p, t).backward()
    p2, t2 = (x.detach().clone().requires_grad_(True) for x in (p, t))
    _ref(p2, t2).backward()
    assert p.grad is not None and t.grad is not None
    torch.testing.assert_close(p.grad, p2.grad)
    torch.testing.assert_close(t.grad, t2.grad)
    torch.testing.assert_close(t.grad, -p.grad)


def test_opcheck(mse):
    p, t = _inputs(256, 4096, grad=True)
    report = torch.library.opcheck(mse.op.default, (p, t), test_utils=(
        "test_schema", "test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"))
    assert report == {k: "SUCCESS" for k in ("test_schema", "test_faketensor", "test_autograd_registration",
                                             "test_aot_dispatch_dynamic")}


def test_torch_compile_traces_through_the_op(mse):
    torch._dynamo.reset()
    compiled = torch.compile(mse, backend="aot_eager", fullgraph=True)  # fullgraph: no break at the op
    p, t = _inputs(256, 4096, grad=True)
    out = compiled(p, t)
    torch.testing.assert_close(out, _ref(p, t), rtol=1e-5, atol=0)
    assert _ran_kernel(compiled, p, t)
    out.backward()
    torch.testing.assert_close(p.grad, 2 * (p - t).detach() / p.numel())


def test_functional(tmp_path, dirs):
    fn = library.functional("mse", db=_db(tmp_path / "kgen.db"), backend="cpu", **dirs)
    assert fn.__name__ == "mse"
    assert list(inspect.signature(fn).parameters) == ["predictions", "targets"]
    p, t = _inputs(256, 4096)
    torch.testing.assert_close(fn(p, t), _ref(p, t), rtol=1e-5, atol=0)
    assert _ran_kernel(fn, p, t)


def test_export_round_trip_without_database(tmp_path, dirs):
    db = _db(tmp_path / "kgen.db")
    out = tmp_path / "export"
    manifest = library.export_best(db, out, generated_dir=dirs["generated_dir"])
    (kernel,) = manifest.tasks["mse"]
    assert (kernel.code_hash, kernel.backend, kernel.size) == (CODE_HASH, "cpu", "small")
    assert (kernel.speedup_eager, kernel.speedup_compile, kernel.time_ms) == (2.0, 1.6, 0.5)
    assert (kernel.beats_eager, kernel.beats_compile, kernel.time_p75_ms) == (True, True, 0.5)
    assert kernel.floor_fraction == pytest.approx(0.2)
    assert kernel.sha256 == hashlib.sha256(KERNEL.encode()).hexdigest()
    assert kernel.envelope.inputs[0].shape == [256, 4096] and kernel.envelope.output.shape == []
    lock = json.loads((out / LOCK).read_text())
    assert set(lock) == {MANIFEST, kernel.source, kernel.reference}
    for rel, sha in lock.items():
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == sha
    on_disk = json.loads((out / MANIFEST).read_text())
    assert on_disk["evaluator_version"] == "1" and on_disk["kgen_export"] == 2
    assert on_disk["tasks"]["mse"][0]["torch_version"] == torch.__version__

    for f in tmp_path.glob("kgen.db*"):
        f.unlink()
    mse = library.load("mse", export_dir=out, backend="cpu")
    assert mse.entry.code_hash == CODE_HASH
    p, t = _inputs(256, 4096)
    torch.testing.assert_close(mse(p, t), _ref(p, t), rtol=1e-5, atol=0)
    assert _ran_kernel(mse, p, t)

    (out / kernel.source).write_text(KERNEL + "# edited\n")
    with pytest.raises(LibraryError, match="does not match kgen.lock"):
        library.load("mse", export_dir=out, backend="cpu")


def test_missing_database_is_one_clear_error(tmp_path):
    with pytest.raises(LibraryError, match="no database"):
        library.load("mse", db=tmp_path / "nope.db", backend="cpu")


def test_cli_export_best_skips_a_missing_source(tmp_path, dirs):
    from click.testing import CliRunner

    from pipeline.cli.inspect import export

    db = _db(tmp_path / "kgen.db")
    with Store.open(db) as store:  # a faster verified attempt whose source is not on disk
        run = store.start_run("{}", "[]", "cpu", "cpu: Test CPU", torch.__version__, None)
        task_id = store.upsert_task("mse", str(MSE_TASK), MSE_TASK.read_text())
        fast = _result(True).model_copy(update={"timing": _timing(0.1)})
        missing = store.save_attempt(Provenance(run_id=run, task_id=task_id, task="mse", model="m2", sample=0,
                                                backend="cpu", template="t", completion_id=None, code_hash="f" * 16,
                                                size="small"), fast)
    out = tmp_path / "export"
    result = CliRunner().invoke(export, ["--db", str(db), "--best", str(out), "--generated",
                                         str(dirs["generated_dir"])])
    assert result.exit_code == 0, result.output
    assert result.stdout == (f"mse: {CODE_HASH} x2 eager, x1.6 compile on cpu: Test CPU (torch {torch.__version__})\n"
                             f"wrote 1 kernels to {out}\n")
    assert result.stderr == f"skipped mse attempt {missing}: {dirs['generated_dir'] / ('f' * 16 + '.py')} is missing\n"
    manifest = json.loads((out / MANIFEST).read_text())
    assert [k["code_hash"] for k in manifest["tasks"]["mse"]] == [CODE_HASH]
    assert len(manifest["skipped"]) == 1


def test_load_leaves_the_callers_rng_alone(tmp_path, dirs):
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    mse = library.load("mse", db=_db(tmp_path / "kgen.db"), backend="cpu", **dirs)
    assert mse.op is not None
    assert torch.equal(torch.get_rng_state(), before)


# The library only accelerates (leaderboard.faster): a verified kernel slower than eager is never
# run or exported; one faster than eager but not than torch.compile runs in eager calls only. The
# stored times are the test's own; the kernel is the session's one real build.

def re_full(pattern: str, text: str | None) -> bool:
    return text is not None and re.fullmatch(pattern, text) is not None


SLOW = {"kernel": _timing(1.5)}                                            # 0.67x eager
NOISY = {"kernel": Timing(median_ms=0.9, p25_ms=0.8, p75_ms=1.05, n=20)}   # 1.11x, p75 above eager's median
EAGER_ONLY = {"kernel": _timing(0.5), "compiled": 0.4}                     # 2x eager, 0.8x torch.compile


@pytest.mark.parametrize("timings, why", [
    (SLOW, f"kernel {CODE_HASH} verified 0.67x eager on cpu: Test CPU: slower than eager"),
    (NOISY, f"kernel {CODE_HASH} verified 1.11x eager on cpu: Test CPU, within its timing spread "
            r"\(p75 1.05 ms, eager median 1 ms\): not reliably faster than eager")], ids=["slower", "within_spread"])
def test_kernel_not_faster_than_eager_runs_the_reference_and_says_why(tmp_path, dirs, timings, why):
    db = _db(tmp_path / "kgen.db", **timings)
    with pytest.warns(KgenFallbackWarning, match=f"^kgen mse: {why}; running the reference$") as seen:
        mse = library.load("mse", db=db, backend="cpu", **dirs)
    assert len([w for w in seen if issubclass(w.category, KgenFallbackWarning)]) == 1
    assert mse.op is None and mse.entry is None and mse.direct is None
    p, t = _inputs(256, 4096)  # inside the envelope: only the speed keeps the kernel out
    with warnings.catch_warnings():
        warnings.simplefilter("error", KgenFallbackWarning)  # said once, at load
        assert torch.equal(mse(p, t), _ref(p, t))
        assert not _ran_kernel(mse, p, t)
    described = library.describe("mse", db=db, backend="cpu", **dirs)
    assert described == mse.describe()
    assert (described.kernel, described.eager, described.compiled) == (CODE_HASH, False, False)
    assert described.speedup_eager == pytest.approx(1.0 / timings["kernel"].median_ms)
    assert re_full(why, described.eager_reason) and described.compiled_reason == described.eager_reason
    text = str(described)
    assert text.splitlines()[0] == f"kgen mse on cpu (cpu), float32, torch {torch.__version__}"
    assert re_full(f"  eager calls: the reference; {why}", text.splitlines()[1])


def test_kernel_slower_than_torch_compile_runs_in_eager_calls_only(tmp_path, dirs):
    db = _db(tmp_path / "kgen.db", **EAGER_ONLY)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KgenFallbackWarning)
        mse = library.load("mse", db=db, backend="cpu", **dirs)
        p, t = _inputs(256, 4096)
        assert _ran_kernel(mse, p, t)
        torch._dynamo.reset()
        compiled = torch.compile(mse, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(p, t), _ref(p, t))
        assert not _ran_kernel(compiled, p, t)  # the caller's compile took the reference
    described = mse.describe()
    assert (described.eager, described.compiled, described.eager_reason) == (True, False, None)
    assert described.compiled_reason == (f"kernel {CODE_HASH} verified 0.80x torch.compile on cpu: Test CPU: "
                                         "slower than torch.compile")
    lines = str(described).splitlines()
    assert lines[1] == f"  eager calls: kernel {CODE_HASH} (2.00x eager, attempt {described.attempt})"
    assert lines[2] == f"  compiled calls: the reference; {described.compiled_reason}"
    assert lines[3] == ("  inside: float32[256, 4096], float32[256, 4096] (at these shapes only, contiguous; served "
                        "at sizes small, odd; correct at small, odd); the reference's backward")


def test_cli_best_and_export_keep_slow_kernels_out(tmp_path, dirs):
    from click.testing import CliRunner

    from pipeline.cli.inspect import best, export

    slow, eager_only = _db(tmp_path / "slow.db", **SLOW), _db(tmp_path / "eager_only.db", **EAGER_ONLY)
    for db, beats, word in ((slow, [False, False], "no"), (eager_only, [True, False], "eager"),
                            (_db(tmp_path / "fast.db"), [True, True], "both")):
        as_json = CliRunner().invoke(best, ["--db", str(db), "--json"])
        assert as_json.exit_code == 0, as_json.output
        row = json.loads(as_json.stdout)
        assert [row["code_hash"], row["beats_eager"], row["beats_compile"]] == [CODE_HASH, *beats]
        table = CliRunner().invoke(best, ["--db", str(db)])
        assert re_full(rf"(?s).*\bmse\b.*{row['speedup_eager']:.3g} .*{row['speedup_compile']:.3g} .* {word} .*",
                       table.stdout), table.stdout

    out = tmp_path / "export"
    result = CliRunner().invoke(export, ["--db", str(slow), "--best", str(out), "--generated",
                                         str(dirs["generated_dir"])])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote 0 kernels to {out}\n"
    with Store.open(slow) as store:
        (attempt,) = store.attempts()
    reason = f"mse attempt {attempt['id']}: kernel {CODE_HASH} verified 0.67x eager on cpu: Test CPU: slower than eager"
    assert result.stderr == f"skipped {reason}\n"
    manifest = json.loads((out / MANIFEST).read_text())
    assert (manifest["tasks"], manifest["skipped"]) == ({}, [reason])
    assert set(json.loads((out / LOCK).read_text())) == {MANIFEST}  # no kernel file written either

    result = CliRunner().invoke(export, ["--db", str(eager_only), "--best", str(out), "--generated",
                                         str(dirs["generated_dir"])])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (f"mse: {CODE_HASH} x2 eager, x0.8 compile (eager calls only: not faster "
                                             f"than torch.compile) on cpu: Test CPU (torch {torch.__version__})")
    (kernel,) = json.loads((out / MANIFEST).read_text())["tasks"]["mse"]
    assert (kernel["beats_eager"], kernel["beats_compile"]) == (True, False)
    mse = library.load("mse", export_dir=out, backend="cpu")  # the export's verdicts drive the library too
    assert (mse.describe().eager, mse.describe().compiled) == (True, False) and mse.compiled is False


def test_records_without_verdicts_use_the_median_only_margin():
    """An export written before the rule (kgen_export 1) has no quartile and no verdicts: its median
    speedup must be at least MEDIAN_ONLY_SPEEDUP."""
    from pipeline.leaderboard import MEDIAN_ONLY_SPEEDUP, faster
    from pipeline.library.selection import speed_reasons

    assert faster(1.0, None, MEDIAN_ONLY_SPEEDUP) is True and faster(1.0, None, 1.05) is False
    assert faster(1.0, 0.99, 1.0) is True and faster(1.0, 1.0, 1.0) is False and faster(1.0, 0.5, None) is None
    entry = KernelEntry.model_validate(json.loads(json.dumps(_OLD_ENTRY)))
    assert speed_reasons(entry) == (None, None)
    close = entry.model_copy(update={"eager_ms": 1.05, "compile_ms": None})
    why, why_compiled = speed_reasons(close)
    assert why == why_compiled == (f"kernel {CODE_HASH} verified 1.05x eager on cpu: under the 1.1x a median-only "
                                   "record needs to count as faster")


_OLD_ENTRY = {  # a manifest entry as kgen_export 1 wrote it
    "task": "mse", "task_sha256": "0" * 64, "code_hash": CODE_HASH, "sha256": "1" * 64, "attempt_id": "A",
    "run_id": "R", "model": "m1", "size": "small", "backend": "cpu", "device": "cpu", "torch_version": "2",
    "time_ms": 1.0, "eager_ms": 2.0, "compile_ms": 1.5, "speedup_eager": 2.0, "speedup_compile": 1.5,
    "envelope": {"backend": "cpu", "device": "cpu", "inputs": [], "output": {"dtype": "float32", "shape": []},
                 "shape_general": True}}
