"""Which verified kernel library.load() runs here, in which calls, and why not: the choice and its description.

    choice = from_db(task, db, backend, kind, generated, builds, grad, dtype)   # or from_export(...)
    why_eager, why_compiled = speed_reasons(choice.entry)   # None where the kernel runs
    print(description(choice, backend, kind, dtype, reasons, loaded=True))   # what library.describe returns

A kernel is a candidate only where it was verified faster than eager (leaderboard.faster, the one
rule) on this device kind, torch version, dtype and mode; among candidates, the best ranked
(leaderboard.rank_key) with intact files is chosen. A compiled caller (torch.compile tracing the
module) gets it only when it was also faster than torch.compile. Every "no" keeps its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..backends import GPU_BACKENDS
from ..leaderboard import faster, is_verified, none_verified, not_faster_reason, rank_key
from .export import open_export, task_row_of
from .kernels import Envelope, KernelEntry, LibraryError, _Record, device_kind, entry_from_attempt, sha256_text

# Reasons that send every call to the reference, whatever the call's inputs.
BLOCKING = ("disabled", "parameters", "import", "no_kernel", "slower")


@dataclass
class Choice:
    """What load() found: the reference to fall back on and, maybe, a kernel to run."""

    task: str
    task_source: str
    size: str
    entry: KernelEntry | None = None
    kernel_source: str | None = None
    kernel_path: Path | None = None
    build_dir: Path | None = None
    reasons: list[tuple[str, str]] = field(default_factory=list)
    slow: KernelEntry | None = None  # the best verified kernel here, left out as not faster than eager


def here(backend: str | None) -> tuple[str, str]:
    """The backend (cuda where a GPU is visible, else cpu) and this process's device kind."""
    backend = backend or ("cuda" if torch.cuda.is_available() else "cpu")
    if backend in GPU_BACKENDS and not torch.cuda.is_available():  # an interpreted Triton kernel never pays
        raise LibraryError(f"backend {backend}: no CUDA device is visible")
    return backend, device_kind(backend, torch.cuda.get_device_name() if backend in GPU_BACKENDS else "cpu")


def _fits(backend: str, kind: str, row_backend: str, row_device: str, torch_version: str | None,
          cuda_version: str | None) -> bool:
    if row_backend != backend or device_kind(row_backend, row_device or "") != kind:
        return False
    if torch_version != torch.__version__:
        return False
    return backend != "cuda" or cuda_version == torch.version.cuda


def _none_here(backend: str, kind: str, elsewhere: int) -> tuple[str, str]:
    note = f" ({elsewhere} verified for other devices or torch versions)" if elsewhere else ""
    return "no_kernel", f"no verified kernel for {kind} ({backend}) with torch {torch.__version__}{note}"


def _mode_key(grad: bool | None, row_grad: bool) -> int | None:
    """None: a row of the other mode, skipped; else its place (gradient-mode kernels first when
    either will do: their forward passed the same checks, and they bring a backward)."""
    if grad is not None and row_grad != grad:
        return None
    return 0 if row_grad else 1


def speed_reasons(entry: KernelEntry) -> tuple[str | None, str | None]:
    """(why eager calls do not run it, why compiled calls do not): None where it runs. An entry
    recorded before the verdicts were (beats_* None) is judged by the same rule on its numbers."""
    def verdict(stored: bool | None, base_ms: float | None) -> bool | None:
        return stored if stored is not None else faster(entry.time_ms, entry.time_p75_ms, base_ms)

    def why(baseline: str, base_ms: float | None) -> str:
        return not_faster_reason(entry.code_hash, entry.device, baseline, entry.time_ms, entry.time_p75_ms, base_ms)

    why_eager = None if verdict(entry.beats_eager, entry.eager_ms) else why("eager", entry.eager_ms)
    if why_eager or entry.compile_ms is None:  # no compile time: the reference did not compile there
        return why_eager, why_eager
    return None, None if verdict(entry.beats_compile, entry.compile_ms) else why("torch.compile", entry.compile_ms)


def _slower(slow: list[tuple[KernelEntry, str]]) -> tuple[str, str]:
    more = f" (and {len(slow) - 1} more verified here, none faster)" if len(slow) > 1 else ""
    return "slower", slow[0][1] + more


def from_db(task: str, db: Path, backend: str, kind: str, generated: Path, builds: Path,
            grad: bool | None = None, dtype: str = "float32") -> Choice:
    from ..store.store import Store

    if not db.is_file():
        raise LibraryError(f"{db}: no database (run `kgen run`, or pass export_dir=)")
    store = Store.open(db, reader=True)
    try:
        newest = store.attempts(task=task, limit=1)
        if not newest:
            if store.attempts(task=task, limit=1, evals=True):
                raise LibraryError(f"{db}: task {task!r} has only `kgen eval` results, which the library never "
                                   "uses; a `kgen run` with the task in its config makes batch attempts")
            raise LibraryError(f"{db}: no attempts for task {task!r}; a `kgen run` with the task in its config "
                               "makes some")
        verified = [r for r in store.attempts(task=task, verdict="correct") if is_verified(r)
                    and (r.get("dtype") or "float32") == dtype and _mode_key(grad, bool(r.get("grad"))) is not None]
        fitting = sorted((r for r in verified if _fits(backend, kind, r["backend"], r["device"], r["torch_version"],
                                                        r["cuda_version"])),
                         key=lambda r: (_mode_key(grad, bool(r.get("grad"))), rank_key(r)))
        reasons: list[tuple[str, str]] = []
        slow: list[tuple[KernelEntry, str]] = []
        for row in fitting:
            path = generated / f"{row['code_hash']}.py"
            task_row = task_row_of(store, row["task_id"])
            if not path.is_file() or task_row is None:
                reasons.append(("missing", f"attempt {row['id']}: {path} or its task source is missing"))
                continue
            source = path.read_text()
            if sha256_text(source)[:16] != row["code_hash"]:
                raise LibraryError(f"{path}: its content does not hash to its name (changed after evaluation)")
            entry = entry_from_attempt(store.attempt(row["id"]), task_row["source"], sha256_text(source))
            why_eager, _ = speed_reasons(entry)
            if why_eager:
                slow.append((entry, why_eager))
                continue
            return Choice(task, task_row["source"], row["size"], entry, source, path, builds / row["code_hash"],
                          reasons)
        if slow:
            reasons.append(_slower(slow))
        elif not fitting and not any(is_verified(r) for r in store.attempts(task=task, verdict="correct")):
            # none verified anywhere: why (unfit, flagged, untrusted, none correct) and what to run
            reasons.append(("no_kernel", f"{_none_here(backend, kind, 0)[1]} in {db}: "
                                         f"{none_verified(store.attempts(task=task))}"))
        elif not fitting:
            reasons.append(_none_here(backend, kind, len(verified)))
        task_row = task_row_of(store, newest[0]["task_id"])
        if task_row is None:
            raise LibraryError(f"{db}: the reference source of task {task!r} is not in the database")
        return Choice(task, task_row["source"], newest[0]["size"], reasons=reasons,
                      slow=slow[0][0] if slow else None)
    finally:
        store.close()


def from_export(task: str, export_dir: Path, backend: str, kind: str, grad: bool | None = None,
                dtype: str = "float32") -> Choice:
    manifest, read = open_export(export_dir)
    kernels = manifest.tasks.get(task)
    if not kernels:
        known = ", ".join(sorted(manifest.tasks)) or "none"
        raise LibraryError(f"{export_dir}: no kernel for task {task!r} in this export (has: {known})")
    ours = sorted((k for k in kernels if k.dtype == dtype and _mode_key(grad, k.grad) is not None),
                  key=lambda k: _mode_key(grad, k.grad))  # stable: best first within a mode
    slow: list[tuple[KernelEntry, str]] = []
    for k in ours:
        if _fits(backend, kind, k.backend, k.device, k.torch_version, k.cuda_version):
            entry = KernelEntry(**k.model_dump(exclude={"source", "reference"}))
            why_eager, _ = speed_reasons(entry)  # an export from before the rule may hold slower kernels
            if why_eager:
                slow.append((entry, why_eager))
                continue
            source = read(k.source)
            if sha256_text(source) != k.sha256:
                raise LibraryError(f"{export_dir / k.source}: sha256 differs from manifest.json; refusing to load it")
            return Choice(task, read(k.reference), k.size, entry, source, Path(export_dir) / k.source,
                          Path(export_dir) / "builds" / k.code_hash)
    reasons = [_slower(slow) if slow else _none_here(backend, kind, len(kernels))]
    return Choice(task, read(kernels[0].reference), kernels[0].size, reasons=reasons,
                  slow=slow[0][0] if slow else None)


class Description(_Record):
    """Which kernel library.load(task) runs in this process, in which calls, and why the reference
    runs where it does. str() reads as a few lines."""

    task: str
    """The task (the reference file's stem)."""
    backend: str
    """The backend kernels were looked up for: cuda, triton or cpu."""
    device: str
    """This process's device kind: the CUDA device name, or cpu (any CPU)."""
    dtype: str
    """The dtype kernels were looked up for (load's dtype=)."""
    torch_version: str
    """This process's torch, which a kernel's record must match."""
    kernel: str | None = None
    """Code hash of the verified kernel this is about: the one that runs, or the best one here
    that was left out as not faster than eager. None when none is verified here."""
    attempt: str | None = None
    """The attempt that verified it (for `kgen show`)."""
    speedup_eager: float | None = None
    """Its recorded speedup over eager (median over median)."""
    speedup_compile: float | None = None
    """Its recorded speedup over torch.compile of the reference."""
    eager: bool = False
    """Eager calls inside the envelope run the kernel."""
    compiled: bool = False
    """Calls traced by torch.compile inside the envelope run the kernel (the reference otherwise,
    compiled with the caller)."""
    eager_reason: str | None = None
    """Why eager calls run the reference; None when they run the kernel."""
    compiled_reason: str | None = None
    """Why compiled calls run the reference; None when they run the kernel."""
    envelope: Envelope | None = None
    """Where the kernel may run (device, dtypes, shapes); a call outside it runs the reference."""
    notes: list[str] = []
    """Anything else load() noticed on the way (a better kernel whose files are missing)."""

    def __str__(self) -> str:
        lines = [f"kgen {self.task} on {self.device} ({self.backend}), {self.dtype}, torch {self.torch_version}"]
        for label, used, why, speedup, base in (
                ("eager calls", self.eager, self.eager_reason, self.speedup_eager, "eager"),
                ("compiled calls", self.compiled, self.compiled_reason, self.speedup_compile, "torch.compile")):
            if used:
                x = f"{speedup:.2f}x {base}" if speedup is not None else f"no {base} time"
                lines.append(f"  {label}: kernel {self.kernel} ({x}, attempt {self.attempt})")
            else:
                lines.append(f"  {label}: the reference; {why}")
        if self.envelope is not None and (self.eager or self.compiled):
            lines.append(f"  inside: {_envelope_text(self.envelope)}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _envelope_text(env: Envelope) -> str:
    args = [f"{i.dtype}[{', '.join(map(str, i.shape or []))}]" if i.kind == "tensor" else f"{i.kind} {i.value!r}"
            for i in env.inputs]
    served = [env.sizes[0] if env.sizes else "its timed size", *env.served]  # pipeline.judge.checks
    grad = "its own verified backward" if env.backward else "the reference's backward"
    return (f"{', '.join(args)} (at these shapes only, contiguous; served at sizes {', '.join(served)}; "
            f"correct at {', '.join(env.sizes)}); {grad}")


def description(choice: Choice, backend: str, kind: str, dtype: str, reasons: list[tuple[str, str]],
                loaded: bool) -> Description:
    """What a module built from `choice` runs. `reasons`: the module's (load adds disabled,
    parameters and import failures to the choice's); `loaded`: its kernel was imported."""
    entry = choice.entry or choice.slow
    blocking = next((message for kind_, message in reasons if kind_ in BLOCKING), None)
    if choice.entry is not None and loaded and blocking is None:
        why_eager, why_compiled = None, speed_reasons(choice.entry)[1]
    else:
        why_eager = why_compiled = blocking or "no kernel"
    return Description(
        task=choice.task, backend=backend, device=kind, dtype=dtype, torch_version=torch.__version__,
        kernel=entry.code_hash if entry else None, attempt=entry.attempt_id if entry else None,
        speedup_eager=entry.speedup_eager if entry else None, speedup_compile=entry.speedup_compile if entry else None,
        eager=why_eager is None, compiled=why_compiled is None, eager_reason=why_eager, compiled_reason=why_compiled,
        envelope=entry.envelope if entry else None,
        notes=[message for _, message in reasons if message not in (why_eager, why_compiled)])
