"""A verdict as the next user turn of a search (pipeline.run.search), and a child's prompt with parents.

    text = feedback.render(cfg.search.feedback_template, prompts_dir, result, diagnostics, turn=0, max_turns=4)

Everything shown comes from typed records: the evaluator's EvalResult (its trials, timings and
the profile it stored) and the build stage's compiler Diagnostics, never from scraping free-form
logs. Nothing secret goes in: no seeds, no reference values but the one worst element of a
mismatch, so a model learns what to fix and not what the checker will ask next.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..child.protocol import ProfileDone
from ..records import EvalResult, Flag, Record, TrialResult, Verdict
from .diagnostics import Diagnostic
from .prompts import render_file

# One line per verdict: what it means and where to look.
HINTS: dict[Verdict, str] = {
    Verdict.extract_failed: "No ```python block defining ModelNew was found in your answer.",
    Verdict.build_failed: "The extension did not compile or the module did not import.",
    Verdict.build_timeout: "The build ran past its time limit: keep the sources small, avoid heavy templates.",
    Verdict.load_failed: "The module failed while being imported, before ModelNew was built.",
    Verdict.runtime_error: "ModelNew raised an error when it was built or called.",
    Verdict.timeout: "A call did not return within its time limit: look for a hang or a far too slow loop.",
    Verdict.crashed: "The process died while running your code (a segfault, an abort or out of memory).",
    Verdict.wrong_type: "forward must return exactly a torch.Tensor on the inputs' device.",
    Verdict.wrong_shape: "The output's shape differs from the reference's.",
    Verdict.wrong_dtype: "The output's dtype differs from the reference's.",
    Verdict.non_finite: "The output held NaN or Inf where the reference has none.",
    Verdict.mismatch: "The values differ from the reference beyond the tolerance.",
    Verdict.no_gradient: "Gradient mode: the output has no gradient. Wrap your kernels in a "
                         "torch.autograd.Function whose backward is a kernel too, and do not detach the result.",
    Verdict.missing_gradient: "Gradient mode: backward returned None for an input that needs a gradient.",
    Verdict.wrong_gradient: "Gradient mode: a gradient differs from the reference's beyond the tolerance.",
    Verdict.inputs_mutated: "forward changed its inputs; it must leave them as they were.",
    Verdict.nondeterministic: "Two calls on the same inputs gave different results, or the output changed "
                              "after the call returned (work left running on another stream or thread).",
    Verdict.impossible_timing: "The measured times are impossible for the work (work done outside the call, "
                               "or a tampered timer); only honest kernels are accepted.",
    Verdict.protocol_error: "The evaluation's protocol was broken (output written from outside forward?).",
    Verdict.correct: "It is correct.",
    Verdict.model_error: "The model call failed.",
    Verdict.waiting_gpu: "It was not run: no GPU was available.",
}

FLAGS: dict[Flag, str] = {
    Flag.no_custom_kernel: "most of the time went to PyTorch's own kernels, not yours: do the work in your kernel.",
    Flag.shape_specialized: "it failed at another input size: do not hard-code sizes, read them from the inputs.",
}


# An error as the model and `kgen attempts` see it: its reason and the lines that explain it, bounded.
ERROR_LINES = 24
ERROR_CHARS = 3000
_EXPLAINED = (Verdict.runtime_error, Verdict.load_failed)


def explain_error(error: str | None, detail: str | None) -> str | None:
    """`error` (one line: where it failed and the exception's first line) with what the traceback in
    `detail` adds: the candidate's last frame and the rest of the exception's message (a TypeError's
    list of the argument types a function accepts, say), at most ERROR_LINES lines and ERROR_CHARS
    characters. Without a traceback, `error` as it is."""
    if not error or not detail:
        return error
    lines = detail.rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    if not frames:
        return error
    body = frames[-1] + 1
    while body < len(lines) and (lines[body].startswith("    ") or not lines[body].strip()):
        body += 1  # the frame's source line and its ^^^ marks
    message = [line.rstrip() for line in lines[body:] if line.strip()]
    if not message:
        return error
    where = [line.strip() for line in lines[frames[-1]:body] if line.strip() and set(line.strip()) - set("^~ ")]
    if message[0].strip() and message[0].strip()[:200] in error:
        message = message[1:]  # the first line is the error's own
    extra = _hide_values("\n".join(["at " + " | ".join(where)] + message)).splitlines()
    if len(extra) > ERROR_LINES:
        extra = extra[:ERROR_LINES - 1] + [f"... ({len(extra) - ERROR_LINES + 1} more lines)"]
    text = "\n".join([error] + extra)
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS - 4] + " ..."


def _hide_values(text: str) -> str:
    """`text` with every tensor's printed values cut to `tensor(...)`: an error that prints the
    arguments a call got (pybind's "Invoked with: tensor([[0.16, ...") would show the judge's inputs."""
    out, at = [], 0
    while (start := text.find("tensor(", at)) >= 0:
        depth, end = 0, start + len("tensor")
        while end < len(text):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
            if depth == 0:
                break
        out += [text[at:start], "tensor(...)"]
        at = end
    return "".join(out) + text[at:]


def explained(result: EvalResult) -> EvalResult:
    """The result with its error explained (explain_error) where it failed in the candidate's code."""
    if result.verdict not in _EXPLAINED:
        return result
    error = explain_error(result.error, result.detail)
    return result if error == result.error else result.model_copy(update={"error": error})


class TimingView(Record):
    """The numbers of a correct attempt, rounded for a prompt."""

    time_ms: float
    """The candidate's median time a call."""
    calls: int
    """How many timed calls the median is over."""
    eager_ms: float | None = None
    """Eager PyTorch timed beside it."""
    speedup_eager: float | None = None
    """eager_ms over time_ms."""
    compile_ms: float | None = None
    """torch.compile of the reference."""
    speedup_compile: float | None = None
    """compile_ms over time_ms."""
    floor_ms: float | None = None
    """The bandwidth floor: every input read once at the measured bandwidth."""
    floor_percent: float | None = None
    """The floor's time over the kernel's, in percent."""


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def timing_view(result: EvalResult) -> TimingView | None:
    if result.time_ms is None or result.verdict is not Verdict.correct:
        return None
    b = result.baselines
    eager = result.eager_beside or (b.eager if b else None)
    compiled = result.compiled_beside or (b.compiled if b else None)
    return TimingView(time_ms=_r(result.timing.median_ms), calls=result.timing.n,
                      eager_ms=_r(eager.median_ms) if eager else None, speedup_eager=_r(result.speedup_eager, 3),
                      compile_ms=_r(compiled.median_ms) if compiled else None,
                      speedup_compile=_r(result.speedup_compile, 3),
                      floor_ms=_r(b.floor_ms) if b and b.floor_ms else None,
                      floor_percent=_r(100 * result.floor_fraction, 3) if result.floor_fraction else None)


def _profile(result: EvalResult) -> ProfileDone | None:
    """The profile a correct attempt stored (its `detail`), or None; at most five entries shown."""
    if result.verdict is not Verdict.correct or not result.detail:
        return None
    try:
        profile = ProfileDone.model_validate_json(result.detail)
    except ValidationError:
        return None
    if profile.error or not profile.top:
        return None
    return profile.model_copy(update={"top": [(str(n)[:80], float(us)) for n, us in profile.top[:5]]})


def _scale_note(failing: TrialResult, passed: list[TrialResult]) -> str | None:
    """Whether the error shows only on larger or rarer inputs (the trials' input families say so)."""
    if not passed or failing.verdict not in (Verdict.mismatch, Verdict.non_finite, Verdict.wrong_gradient):
        return None
    if failing.variant.startswith(("scaled", "heavy", "needle")) and any(t.variant == "base" for t in passed):
        worst_ok = max((t.max_rel_err or 0.0) for t in passed)
        return (f"The ordinary inputs passed (relative error at most {worst_ok:.3g}); the error grows on the "
                f"{failing.variant} inputs, which have larger magnitudes or rare large values: look for "
                f"overflow, lost precision in the accumulation, or elements never read.")
    return None


def render(template: str, prompts_dir: Path, result: EvalResult, diagnostics: list[Diagnostic] | None = None,
           turn: int = 0, max_turns: int = 1) -> str:
    """The user turn that tells the model how its answer of `turn` (0-based) was judged."""
    failed = [t for t in result.trials if not t.ok]
    failing = failed[-1] if failed and result.verdict is not Verdict.correct else None
    passed = [t for t in result.trials if t.ok]
    correct = result.verdict is Verdict.correct
    context: dict[str, Any] = dict(
        verdict=result.verdict.value, hint=HINTS.get(result.verdict, ""), error=result.error,
        diagnostics=list(diagnostics or []), failing=failing, passed=passed,
        scale_note=_scale_note(failing, passed) if failing else None,
        timing=timing_view(result), profile=_profile(result), unfit=result.device_unfit if correct else None,
        flags=[(f.value, FLAGS[f]) for f in result.flags if f in FLAGS],
        turn=turn, max_turns=max_turns,
        ask="Make it faster while keeping it correct." if correct else "Fix it.")
    return render_file(template, prompts_dir, **context)


class ParentView(Record):
    """One archive kernel as a child's prompt shows it."""

    code: str
    """Its ModelNew source."""
    time_ms: float | None
    """Its median time a call."""
    speedup_eager: float | None = None
    """Over eager, side by side."""
    speedup_compile: float | None = None
    """Over torch.compile."""
    floor_percent: float | None = None
    """The floor's time over its time, in percent."""
    flags: list[str] = []
    """Its flags (no_custom_kernel, shape_specialized)."""
    untimed: str | None = None
    """Why it has no figures: the device was unfit to time it (a loaded machine)."""


def parent_view(row: dict[str, Any], code: str) -> ParentView:
    """An archive row (pipeline.store.store.Store.archive) and its code, rounded as the timing view is."""
    return ParentView(code=code, time_ms=_r(row["time_ms"]), speedup_eager=_r(row.get("speedup_eager"), 3),
                      speedup_compile=_r(row.get("speedup_compile"), 3),
                      floor_percent=_r(100 * row["floor_fraction"], 3) if row.get("floor_fraction") else None,
                      flags=list(row.get("flags") or []), untimed=row.get("device_unfit"))


def render_evolve(template: str, prompts_dir: Path, task_name: str, task_source: str, backend: str,
                  generation: int, parents: list[ParentView], grad: bool = False, dtype: str = "float32",
                  level: int | None = None) -> str:
    """A child's prompt: the task and its parents' code and numbers, for the run's evaluation mode
    (`level`: the task's KernelBench level, which sets what may stay in PyTorch)."""
    return render_file(template, prompts_dir, task_name=task_name, task_source=task_source, backend=backend,
                       generation=generation, parents=parents, grad=grad, dtype=dtype, level=level)
