"""The results store, against real SQLite files."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from pipeline.store.migrations import MIGRATIONS
from pipeline.records import Baselines, BuildResult, Completion, EvalResult, Flag, Provenance, Timing, Usage, Verdict
from pipeline.store.store import Store, StoreError, new_id


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "kgen.db")
    yield s
    s.close()


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, n=10)


def _result(verdict=Verdict.correct, ms=1.0, eager=2.0, compiled=0.5, flags=()):
    if verdict != Verdict.correct:
        return EvalResult(verdict=verdict, error=f"{verdict.value} happened", detail="tb")
    return EvalResult(
        verdict=verdict,
        flags=list(flags),
        timing=_timing(ms),
        baselines=Baselines(eager=_timing(eager), compiled=_timing(compiled), floor_ms=0.25),
        device="Test GPU",
        torch_version="2.6.0",
        cuda_version="12.4",
    )


def _run(store: Store) -> str:
    return store.start_run("{}", "[]", "cuda", "Test GPU", "2.6.0", "12.4")


def _attempt(store, run_id, *, task="relu", model="m1", sample=0, template="t", result=None,
             completion_id=None, code_hash=None):
    return store.save_attempt(Provenance(run_id=run_id, task_id=f"{task}:0", task=task, model=model, sample=sample,
                                         backend="cuda", template=template, completion_id=completion_id,
                                         code_hash=code_hash, size="small"), result or _result())


def test_ids_sort_in_creation_order():
    ids = [new_id() for _ in range(2000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 26 for i in ids)


def test_migrations_run_once(tmp_path):
    path = tmp_path / "sub" / "kgen.db"
    Store.open(path).close()
    Store.open(path).close()
    conn = sqlite3.connect(path)
    names = [r[0] for r in conn.execute("SELECT name FROM _kgen_migrations")]
    conn.close()
    assert names == [fn.__name__ for fn in MIGRATIONS]
    assert names[0] == "m001_initial"


def test_wal_mode(store):
    assert store.db.journal_mode == "wal"


@pytest.mark.parametrize("content", [
    b"these are my notes, not a database\n" * 50,
    b"x",
    b"SQLite format 3\x00" + b"\xff" * 5000,  # right header, garbage after it
])
def test_non_sqlite_file_is_refused_and_untouched(tmp_path, content):
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    with pytest.raises(StoreError) as err:
        Store.open(path)
    message = str(err.value)
    assert message.startswith(f"{path}: not a kgen database (")
    assert "\n" not in message
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_other_programs_database_is_refused_and_untouched(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not a kgen database"):
        Store.open(path)
    assert path.read_bytes() == before


def test_run_lifecycle(store):
    first = _run(store)
    second = _run(store)
    assert store.latest_run_id() == second
    store.finish_run(first, "done")
    run = store.get_run(first)
    assert run["status"] == "done" and run["finished_utc"]
    assert store.get_run(second)["status"] == "running"


def test_task_and_prompt_ids_are_content_addressed(store):
    a = store.upsert_task("relu", "tasks/relu.py", "source one")
    assert a == store.upsert_task("relu", "tasks/relu.py", "source one")
    assert a.startswith("relu:") and len(a) == len("relu:") + 16
    assert store.upsert_task("relu", "tasks/relu.py", "source two") != a
    p = store.save_prompt(a, "t", "cuda", "write a kernel")
    assert p == store.save_prompt(a, "t", "cuda", "write a kernel")
    assert store.db["prompts"].count == 1


def test_completion_cache_skips_errors(store):
    run_id = _run(store)
    good = Completion(text="answer", reasoning="thinking", model_id="m-1",
                      usage=Usage(prompt_tokens=10, completion_tokens=20, reasoning_tokens=5),
                      finish_reason="stop", seconds=1.5)
    good_id = store.save_completion(run_id, "relu:0", "p", "m1", "openai", None, 0, "key",
                                    good, 0.01)
    store.save_completion(run_id, "relu:0", "p", "m1", "openai", None, 0, "key",
                          Completion(error="HTTP 500"), 0.0)
    cached_id, cached = store.cached_completion("key")
    assert cached_id == good_id
    assert cached == good
    assert store.cached_completion("other-key") is None

    store.save_completion(run_id, "relu:0", "p", "m1", "openai", None, 0, "errors-only",
                          Completion(error="timeout"), 0.0)
    assert store.cached_completion("errors-only") is None


def test_completion_cache_returns_newest(store):
    run_id = _run(store)
    store.save_completion(run_id, "t", "p", "m", "x", None, 0, "k", Completion(text="old"), 0)
    newest = store.save_completion(run_id, "t", "p", "m", "x", None, 0, "k",
                                   Completion(text="new"), 0)
    assert store.cached_completion("k") == (newest, Completion(text="new"))


def test_build_roundtrip_and_upsert(store):
    assert store.get_build("abc") is None
    store.save_build(BuildResult(code_hash="abc", ok=False, log="error: nvcc exploded",
                                 seconds=3.0, build_dir="/b/abc"), "cuda", "2.6.0")
    store.save_build(BuildResult(code_hash="abc", ok=True, log="fine", seconds=4.0,
                                 build_dir="/b/abc"), "cuda", "2.6.0")
    assert store.db["builds"].count == 1
    assert store.get_build("abc") == BuildResult(code_hash="abc", ok=True, log="fine",
                                                 seconds=4.0, build_dir="/b/abc")


def test_save_attempt_replaces_same_slot(store):
    run_id = _run(store)
    _attempt(store, run_id, result=_result(Verdict.waiting_gpu))
    second = _attempt(store, run_id, result=_result())
    _attempt(store, run_id, sample=1)
    rows = store.attempts(run=run_id)
    assert len(rows) == 2
    slot0 = [r for r in rows if r["sample"] == 0]
    assert [r["id"] for r in slot0] == [second]
    assert slot0[0]["verdict"] == "correct"
    assert store.attempt_slots(run_id) == {
        ("relu", "m1", "t", 0, "cuda"), ("relu", "m1", "t", 1, "cuda"),
    }
    # The same slot in another run is a different slot.
    _attempt(store, _run(store))
    assert store.db["attempts"].count == 3


def test_attempt_row_fields(store):
    run_id = _run(store)
    _attempt(store, run_id, result=_result(flags=[Flag.shape_specialized]), code_hash="h1")
    [row] = store.attempts()
    assert row["run"] == run_id
    assert row["flags"] == ["shape_specialized"]
    assert row["time_ms"] == 1.0 and row["eager_ms"] == 2.0 and row["compile_ms"] == 0.5
    assert row["speedup_eager"] == 2.0 and row["speedup_compile"] == 0.5
    assert row["floor_fraction"] == 0.25 and row["floor_ms"] == 0.25
    assert row["code_hash"] == "h1"
    for key in ("id", "task", "model", "sample", "backend", "verdict", "error",
                "completion_id", "created_utc"):
        assert key in row


def test_attempt_filters(store):
    run_a, run_b = _run(store), _run(store)
    _attempt(store, run_a, task="relu", result=_result(flags=[Flag.no_custom_kernel]))
    _attempt(store, run_a, task="relu", sample=1, result=_result(Verdict.mismatch))
    _attempt(store, run_a, task="gelu", model="m2",
             result=_result(flags=[Flag.shape_specialized, Flag.no_custom_kernel]))
    newest = _attempt(store, run_b, task="gelu", result=_result(Verdict.build_failed))

    assert len(store.attempts()) == 4
    assert store.attempts()[0]["id"] == newest
    assert len(store.attempts(run=run_a)) == 3
    assert {r["task"] for r in store.attempts(task="gelu")} == {"gelu"}
    assert len(store.attempts(task="gelu")) == 2
    assert len(store.attempts(model="m2")) == 1
    assert [r["verdict"] for r in store.attempts(verdict="mismatch")] == ["mismatch"]
    assert len(store.attempts(verdict=Verdict.correct)) == 2
    assert len(store.attempts(flag=Flag.no_custom_kernel)) == 2
    assert len(store.attempts(flag="shape_specialized")) == 1
    assert store.attempts(flag="custom") == []
    assert len(store.attempts(run=run_a, verdict="correct", task="relu")) == 1
    assert len(store.attempts(limit=2)) == 2


def test_attempt_lookup_joins_everything(store):
    run_id = _run(store)
    task_id = store.upsert_task("relu", "tasks/relu.py", "class Model: ...")
    prompt_id = store.save_prompt(task_id, "t", "cuda", "please write relu")
    completion = Completion(text="```python\nclass ModelNew: ...\n```", reasoning="hmm",
                            usage=Usage(prompt_tokens=3, completion_tokens=4))
    completion_id = store.save_completion(run_id, task_id, prompt_id, "m1", "openai",
                                          "http://x", 0, "k", completion, 0.02)
    store.save_build(BuildResult(code_hash="h1", ok=True, log="built ok"), "cuda", "2.6.0")
    result = _result()
    attempt_id = _attempt(store, run_id, completion_id=completion_id, code_hash="h1",
                          result=result)

    got = store.attempt(attempt_id)
    assert got["result"] == result
    assert got["prompt"] == "please write relu"
    assert got["completion"] == completion
    assert got["completion_text"] == completion.text and got["reasoning"] == "hmm"
    assert got["usage"].completion_tokens == 4
    assert got["cost_usd"] == 0.02
    assert got["build_log"] == "built ok"
    assert got["build"].ok
    assert got["code_hash"] == "h1"
    assert store.attempt(attempt_id[:20])["id"] == attempt_id
    assert store.attempt("no-such-id") is None


def test_attempt_without_completion_or_build(store):
    attempt_id = _attempt(store, _run(store), result=_result(Verdict.model_error))
    got = store.attempt(attempt_id)
    assert got["result"].verdict == Verdict.model_error
    assert got["completion"] is None and got["prompt"] is None and got["build"] is None


def test_ambiguous_prefix(store):
    run_id = _run(store)
    a = _attempt(store, run_id, sample=0)
    b = _attempt(store, run_id, sample=1)
    common = 0
    while a[common] == b[common]:
        common += 1
    with pytest.raises(StoreError, match="ambiguous"):
        store.attempt(a[:common])
    assert store.attempt(a[: common + 1])["id"] == a
    # A prefix is matched literally, never as a LIKE pattern.
    assert store.attempt("%") is None and store.attempt("_") is None


def test_fts_finds_build_log_and_completion_words(store):
    run_id = _run(store)
    store.save_build(BuildResult(code_hash="h1", ok=False, log="ptxas fatal: unresolved"),
                     "cuda", "2.6.0")
    store.save_build(BuildResult(code_hash="h2", ok=True, log="all good"), "cuda", "2.6.0")
    store.save_completion(run_id, "t", "p", "m", "x", None, 0, "k",
                          Completion(text="use shared memory tiling", reasoning="warpshuffle"),
                          0)
    hits = store.db.execute(
        "SELECT builds.code_hash FROM builds_fts JOIN builds ON builds.rowid = builds_fts.rowid "
        "WHERE builds_fts MATCH 'ptxas'").fetchall()
    assert hits == [("h1",)]
    assert store.db.execute(
        "SELECT count(*) FROM completions_fts WHERE completions_fts MATCH 'tiling'"
    ).fetchone() == (1,)
    assert store.db.execute(
        "SELECT count(*) FROM completions_fts WHERE completions_fts MATCH 'warpshuffle'"
    ).fetchone() == (1,)

    # Upserting a build must move its words in the index too.
    store.save_build(BuildResult(code_hash="h1", ok=True, log="recompiled"), "cuda", "2.6.0")
    assert store.db.execute(
        "SELECT count(*) FROM builds_fts WHERE builds_fts MATCH 'ptxas'").fetchone() == (0,)
    assert store.db.execute(
        "SELECT count(*) FROM builds_fts WHERE builds_fts MATCH 'recompiled'").fetchone() == (1,)


def test_baselines(store):
    assert store.get_baseline("relu|small|gpu|2.6") is None
    store.save_baseline("relu|small|gpu|2.6", "relu", "small", "gpu", "2.6", '{"a": 1}')
    store.save_baseline("relu|small|gpu|2.6", "relu", "small", "gpu", "2.6", '{"a": 2}')
    assert store.get_baseline("relu|small|gpu|2.6") == '{"a": 2}'


def test_run_summary(store):
    run_id = _run(store)
    s = iter(range(100))
    _attempt(store, run_id, sample=next(s), result=_result(ms=1.0, eager=2.0, compiled=0.5))
    _attempt(store, run_id, sample=next(s), result=_result(ms=1.0, eager=3.0, compiled=1.5))
    _attempt(store, run_id, sample=next(s), result=_result(ms=1.0, eager=0.5, compiled=0.25))
    _attempt(store, run_id, sample=next(s), result=_result(Verdict.mismatch))
    _attempt(store, run_id, sample=next(s), result=_result(Verdict.build_failed))
    _attempt(store, run_id, sample=next(s), result=_result(Verdict.extract_failed))
    _attempt(store, run_id, sample=next(s), result=_result(Verdict.waiting_gpu))
    _attempt(store, run_id, model="m2", sample=0, result=_result(Verdict.model_error))
    _attempt(store, _run(store), sample=0)  # another run: not counted

    rows = store.run_summary(run_id)
    assert rows == [
        {"task": "relu", "model": "m1", "attempts": 7, "compiled": 4, "correct": 3,
         "fast_1": 2, "fast_compile": 1},
        {"task": "relu", "model": "m2", "attempts": 1, "compiled": 0, "correct": 0,
         "fast_1": 0, "fast_compile": 0},
    ]


def test_store_shared_between_threads(store):
    run_id = _run(store)
    errors = []

    def work(model):
        try:
            for sample in range(20):
                _attempt(store, run_id, model=model, sample=sample)
        except Exception as e:  # surfaced below; a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=work, args=(f"m{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.attempt_slots(run_id)) == 80


def test_reopen_sees_data(tmp_path):
    path = tmp_path / "kgen.db"
    with Store.open(path) as s:
        run_id = _run(s)
        _attempt(s, run_id)
    with Store.open(path) as s:
        assert s.latest_run_id() == run_id
        assert len(s.attempts()) == 1
