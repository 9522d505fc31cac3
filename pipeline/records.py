"""Typed records that cross a stage or process boundary.

Each stage takes and returns these, so a stage can be run, tested and stored on its own.
Nothing here imports the rest of the package.
"""

from __future__ import annotations

from typing import Any, Literal

from .child.protocol import Confinement
from .verdicts import _LEGACY, Flag, Outcome, Record, Standing, Verdict, _outcome_of
from pydantic import ConfigDict, Field, model_validator

Backend = Literal["cuda", "triton", "cpu"]


class Usage(Record):
    prompt_tokens: int = 0
    """Tokens in the prompt, as the server reported them."""
    completion_tokens: int = 0
    """Tokens generated, reasoning included."""
    reasoning_tokens: int = 0
    """Tokens the server says were spent on hidden reasoning (0 where not reported)."""


class Completion(Record):
    """What a model answered for one prompt."""

    text: str = ""
    """The answer's visible content."""
    reasoning: str | None = None
    """Reasoning text, where the server returns it separately."""
    usage: Usage = Field(default_factory=Usage)
    """Token counts for this call."""
    model_id: str = ""
    """The model id the server answered as."""
    finish_reason: str | None = None
    """Why generation stopped (stop, length, ...)."""
    seconds: float = 0.0
    """Wall time of the call."""
    error: str | None = None
    """Set when the call failed; the text is then empty."""


class Extraction(Record):
    """The ModelNew code pulled out of a completion."""

    code: str | None = None
    """The final fenced block that defines ModelNew, or None."""
    code_hash: str | None = None
    """sha256 of the code (first 16 hex digits), which names its file and build directory."""
    error: str | None = None
    """Why nothing could be extracted."""
    blocks_seen: int = 0
    """How many fenced blocks the completion held."""


class BuildResult(Record):
    """The outcome of compiling one candidate (running its module-level load_inline)."""

    code_hash: str
    """Which code was built."""
    ok: bool
    """True when the module imported and every extension compiled."""
    timed_out: bool = False
    """True when the build ran past its limit and was killed."""
    log: str = ""
    """The compiler's and the import's full output."""
    seconds: float = 0.0
    """Wall time of the build."""
    build_dir: str = ""
    """The per-hash directory the extension lives in."""
    cached: bool = False
    """True when a previous successful build of the same hash was reused."""
    headers: Literal["light", "fast", "plain"] = "plain"
    """light: the .cu files against kgen's light ATen header, main.cpp as in fast; fast: against
    kgen's precompiled subset of torch's headers (pipeline/build/headers.py); plain: against
    torch/extension.h as written (fast builds off, or after the faster builds failed)."""


class TrialResult(Record):
    """One correctness trial of a candidate against the float64 reference."""

    index: int
    """Trial number, in order."""
    variant: str
    """Which input family was used (base, scaled, heavy, needle, alt_shape...)."""
    ok: bool
    """True when every check of this trial passed."""
    verdict: Verdict | None = None
    """The failing check's verdict; None when ok."""
    error: str | None = None
    """What went wrong, in one line."""
    max_abs_err: float | None = None
    """Largest absolute difference from the reference."""
    max_rel_err: float | None = None
    """Largest difference relative to the reference's magnitude."""
    worst_index: list[int] | None = None
    """A mismatch's worst element: its index in the output (furthest past the tolerance)."""
    expected: float | None = None
    """The reference's value there (float64): the only reference value feedback ever shows."""
    got: float | None = None
    """The candidate's value there."""


class Timing(Record):
    """Timing statistics of one callable, in milliseconds."""

    median_ms: float
    """Median over the timed calls (of the means of blocks of calls, see pipeline.child.timing.METHOD.block)."""
    p25_ms: float
    """25th percentile, of the same."""
    p75_ms: float
    """75th percentile, of the same."""
    n: int
    """Number of timed calls."""


class Ratio(Record):
    """A speedup taken pair by pair: each of the candidate's Bound requests against the reference's
    calls timed right beside it (pipeline.judge.clocks.pair_ratios)."""

    median: float
    """Median over the pairs of the reference block's mean over the candidate block's mean."""
    p25: float
    """25th percentile, of the same."""
    p75: float
    """75th percentile, of the same."""
    pairs: int
    """Number of block pairs."""


class Baselines(Record):
    """Reference timings measured on the same device in the same run."""

    eager: Timing | None = None
    """The reference Model, as written, in float32."""
    compiled: Timing | None = None
    """torch.compile of the reference Model."""
    floor_ms: float | None = None
    """Bytes every input must be read, over the measured device bandwidth."""
    bandwidth_gbs: float | None = None
    """The measured device bandwidth (the better of a copy's read plus write bytes and a read, per
    second): of a large buffer on a GPU, of a warm one of the inputs' size on the cpu."""
    input_bytes: int = 0
    """Bytes of all inputs at the timed size."""
    compute_floor_ms: float | None = None
    """The reference's floating-point operations over the device's best measured rate (None: the
    flop counter sees none, as in every loss): a time below it x floor_slack is impossible_timing
    where EvalConfig.compute_floor is on."""
    flops: int | None = None
    """Floating-point operations of one reference call at the timed size (torch.utils.flop_counter)."""
    flops_per_s: float | None = None
    """The device's best measured rate: square matmuls in float32 and bfloat16 (float16 too on a GPU)."""
    eager_plain_ms: float | None = None
    """Eager timed the way other benchmarks commonly do (synced back-to-back calls on one input set,
    no flush): for comparison with numbers measured elsewhere, never for a verdict. GPU only."""
    compiled_plain_ms: float | None = None
    """torch.compile timed that same way."""
    compile_error: str | None = None
    """Why torch.compile of the reference failed, where it did (then `compiled` is None): a cached
    baseline that says so is not timed again only to fail again."""
    seconds: dict[str, float] = {}
    """Where the reference's time measuring these went, part by part (eager, compiled, the
    floors): the run's `reference` line shows it."""
    null_ms: float | None = None
    """Read from rows stored under policy 8 and before (the child's clock around a call doing no
    work); nothing reads it now."""


class OwnCode(Record):
    """The parent's own look at what a candidate built (pipeline.judge.owncode): the extension files in its
    build folder and, for Triton, the @triton.jit functions in its source. It can show that there is
    no code of the candidate's own (then `no_custom_kernel` is the parent's finding); code it finds
    may still never run, which only the child's profile says (a claim)."""

    holds_own: bool | None = None
    """True: some function or kernel of the candidate's own was found; False: none (pure PyTorch);
    None: the parent could not tell (no symbol table, no nm), and the child's claim stands alone."""
    extensions: list[str] = Field(default_factory=list)
    """The extension files found, relative to the build folder."""
    functions: list[str] = Field(default_factory=list)
    """Defined functions that are not pybind11's, torch's or the C++ library's (mangled; at most 20)."""
    device_kernels: list[str] = Field(default_factory=list)
    """CUDA __global__ kernels (their host stubs), at most 20."""
    device_code: bool = False
    """An extension holds a CUDA fat binary (.nv_fatbin section)."""
    triton_kernels: list[str] = Field(default_factory=list)
    """@triton.jit functions the source defines (triton backend)."""
    error: str | None = None
    """Why the look failed, where it did."""


class ShapeRun(Record):
    """One held-out size after its trial passed: whether the candidate's own kernel ran there. What
    the library serves beyond the main size. Nothing is timed there (pipeline.judge.checks)."""

    # Rows judged under policy 4 or before also carry the child's times there (time, wall_ms, eager,
    # faster): read and dropped, as nothing now uses a time the child measured.
    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)

    size: str
    """The size's label (as in EvalResult.sizes)."""
    correct: bool
    """Its trial matched the reference (the parent's check)."""
    own_ran: bool | None = None
    """The child's claim, from its profile at this size: under half the call's time in PyTorch's own
    ops (at KernelBench's levels 2 and 3, over 1% in its own code: pipeline.judge.owncode.library_allowed).
    False when the parent found no code of the candidate's own; None: not profiled."""
    torch_fraction: float | None = None
    """The profile's share of the call in PyTorch's ops (the child's claim)."""
    error: str | None = None
    """Why it is not served, where a step failed."""

    @property
    def served(self) -> bool:
        """Verified correct and its own kernel ran: the library may use it here."""
        return self.correct and self.own_ran is True


class EvalResult(Record):
    """The parent's verdict on one candidate, with what it measured."""

    outcome: Outcome
    """The verdict, its marks and what may be read of its figure (pipeline.verdicts)."""
    own_code: OwnCode | None = None
    """The parent's look at the built code (None: rows from before it, or no build folder)."""
    own_fraction: float | None = None
    """The child's claim, from its profile of one call at the main size: the share of the call's time
    in the candidate's own code, not PyTorch's ops and kernels (cuDNN, cuBLAS, ATen). KernelBench's
    levels 2 and 3 let a candidate keep a convolution or GEMM in the library; this says how much of
    the call it did itself. On the cpu, and under Triton's interpreter, the part of the call outside
    PyTorch's ops counts as its own (Python's overhead included). None: not profiled, or the profile failed."""
    shapes: list[ShapeRun] = Field(default_factory=list)
    """Per held-out size whose trial passed: whether the own kernel ran there."""
    error: str | None = None
    """One-line reason for a failure."""
    detail: str | None = None
    """Longer text: a traceback or the child's last output."""
    trials: list[TrialResult] = Field(default_factory=list)
    """Per-trial outcomes."""
    timing: Timing | None = None
    """The candidate's timing, when it was correct."""
    eager_beside: Timing | None = None
    """Eager PyTorch timed by the reference process in blocks interleaved with the candidate's, in the
    same window: what `speedup_eager` divides (the prepared baselines only size the plan)."""
    compiled_beside: Timing | None = None
    """torch.compile of the reference, timed the same way right after each eager block: what
    `speedup_compile` divides (where the task's baseline compiled)."""
    eager_ratio: Ratio | None = None
    """Eager's time over the candidate's, pair by pair: what `speedup_eager` reports. A machine whose
    speed drifts within an attempt moves both blocks of a pair alike, while a ratio of the two
    medians may take them from different moments."""
    compiled_ratio: Ratio | None = None
    """torch.compile's time over the candidate's, pair by pair: what `speedup_compile` reports."""
    baselines: Baselines | None = None
    """Eager, compile and floor on the same device."""
    policy: str | None = None
    """The version of the judge's thresholds this verdict was reached under (pipeline.policy);
    None for attempts judged before it was recorded."""
    bound_note: str | None = None
    """How the parent measured its bound on the child's times (on a GPU: replayed from CUDA graphs,
    or eager requests and why); not stored."""
    wall_ms_per_call: float | None = None
    """The parent's own estimate of one call: its clock around blocks of back-to-back calls on fresh
    inputs, less what the same blocks cost with a null model before the candidate was imported (on the
    cpu, the median of them, whose calls are the time recorded)."""
    confinement: Confinement | None = None
    """How the candidate's child was confined (it reported this before any candidate code ran)."""
    output: str | None = None
    """The last characters the candidate's child printed (hostile text: shown literally)."""
    device: str = ""
    """Device name the attempt ran on."""
    torch_version: str = ""
    cuda_version: str | None = None
    eval_seconds: float = 0.0
    grad: bool = False
    """Judged in gradient mode: forward plus backward, every gradient compared and timed."""
    dtype: str = "float32"
    """The dtype the inputs and weights were cast to."""
    sizes: list[str] = Field(default_factory=list)
    """Every size the candidate was judged correct at (the main one first, then held-out shapes)."""
    """Wall time of the whole evaluation, build excluded."""
    phases: dict[str, float] = Field(default_factory=dict)
    """Seconds spent in each stage of the evaluation (start-up, import, trials, timing, profile,
    other sizes, teardown): where an attempt's cost goes."""

    @model_validator(mode="before")
    @classmethod
    def _fold(cls, data: Any) -> Any:
        if isinstance(data, dict) and "outcome" not in data and "verdict" in data:
            data = {k: v for k, v in data.items() if k not in _LEGACY} | {"outcome": _outcome_of(data)}
        return data

    @property
    def verdict(self) -> Verdict:
        return self.outcome.verdict

    @property
    def flags(self) -> list[Flag]:
        return self.outcome.flags

    @property
    def trusted(self) -> bool:
        """Not kept out of `best` for its room (Standing.untrusted)."""
        return self.outcome.standing is not Standing.untrusted

    @property
    def untrusted_reason(self) -> str | None:
        return self.outcome.why if not self.trusted else None

    @property
    def device_unfit(self) -> str | None:
        """Why the device was unfit to time it (Standing.unfit); None otherwise."""
        return self.outcome.why if self.outcome.standing is Standing.unfit else None

    @property
    def time_ms(self) -> float | None:
        """The candidate's median time; None where the device was unfit to time it (no figure)."""
        return self.timing.median_ms if self.timing and not self.device_unfit else None

    def _ratio(self, base: Timing | None) -> float | None:
        if self.time_ms is None or base is None or self.timing.median_ms <= 0:
            return None
        return base.median_ms / self.timing.median_ms

    @property
    def speedup_eager(self) -> float | None:
        """Over eager timed side by side, pair by pair (`eager_ratio`); rows from before that existed
        divide the medians (`eager_beside`), and rows older still the prepared baseline."""
        if self.eager_ratio is not None and self.time_ms is not None:
            return self.eager_ratio.median
        return self._ratio(self.eager_beside or (self.baselines.eager if self.baselines else None))

    @property
    def speedup_compile(self) -> float | None:
        """Over torch.compile timed side by side, pair by pair (`compiled_ratio`); older rows divide
        the medians (`compiled_beside`), and where that is missing too (older still, or the compiled
        blocks failed) the prepared baseline."""
        if self.compiled_ratio is not None and self.time_ms is not None:
            return self.compiled_ratio.median
        return self._ratio(self.compiled_beside or (self.baselines.compiled if self.baselines else None))

    @property
    def floor_fraction(self) -> float | None:
        """Floor time over our time: 1.0 means the kernel runs at the bandwidth floor."""
        if self.time_ms is None or not self.baselines or not self.baselines.floor_ms:
            return None
        return self.baselines.floor_ms / self.timing.median_ms


def summary_fields(result: EvalResult) -> dict[str, Any]:
    """The flat numbers stored in an attempt row."""
    b = result.baselines if not result.device_unfit else None  # no figure from an unfit device
    beside = not result.device_unfit
    return {
        "verdict": result.verdict.value,
        "flags": ",".join(f.value for f in result.flags),
        "error": result.error,
        "time_ms": result.time_ms,
        "eager_ms": (result.eager_beside.median_ms if result.eager_beside and beside
                     else b.eager.median_ms if b and b.eager else None),
        "compile_ms": (result.compiled_beside.median_ms if result.compiled_beside and beside
                       else b.compiled.median_ms if b and b.compiled else None),
        "floor_ms": b.floor_ms if b else None,
        "speedup_eager": result.speedup_eager,
        "speedup_compile": result.speedup_compile,
        "floor_fraction": result.floor_fraction,
        "trusted": int(result.trusted),
        "device_unfit": result.device_unfit,
        "grad": int(result.grad),
        "dtype": result.dtype,
        "own_fraction": result.own_fraction,
    }


class FileRequest(Record):
    """One candidate file to judge: what `kgen eval` was asked, and what its client sends `kgen serve`
    (pipeline.run.single.evaluate_file takes it)."""

    path: str
    """The file as the user named it: the stored run's note."""
    code: str | None = None
    """The file's text where it was read already (the server never opens `path`); None: read `path`."""
    task: str
    """A task name in the config's task folder, or a task file's path."""
    backend: Literal["cuda", "triton", "cpu", "auto"] = "auto"
    """Where it runs; auto: the config's order (auto_backends), the first this machine has."""
    size: str | None = None
    """A size preset of the task; None: the config's (tasks.size), else the default."""
    grad: bool | None = None
    """Judge forward plus backward; None: the config's evaluation.grad."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """The inputs' dtype; None: the config's evaluation.dtype."""
    store: bool = True
    """Store the result, as a run of its own of kind "eval"."""


class Provenance(Record, frozen=True):
    """Where a stored attempt came from: the run and slot it fills and the search step that made it
    (pipeline.store.Store.save_attempt stores it beside the EvalResult)."""

    run_id: str
    """The run it belongs to (a batch, or a `kgen eval` run of its own)."""
    task_id: str
    """The task row's id (Store.upsert_task)."""
    task: str
    """The task's name."""
    model: str
    """The model that wrote the code; "(file)" for `kgen eval`."""
    sample: int
    """Its sample index among the model's answers for the task."""
    backend: str
    """cuda, triton or cpu."""
    template: str
    """The prompt template's name; "-" where no prompt was rendered."""
    size: str
    """The task size it was judged at, as it ran (a derived size names the globals it set)."""
    completion_id: str | None = None
    """The completion the code was extracted from; None for a file."""
    code_hash: str | None = None
    """The extracted code's hash (generated/<hash>.py); None where nothing was extracted."""
    turn: int = 0
    """Refine mode: the turn of the conversation (0: the first answer)."""
    generation: int = 0
    """Evolve mode: the generation it was bred in."""
    parents: list[str] = Field(default_factory=list)
    """The attempts whose code or feedback the prompt showed (lineage)."""
    messages: list[dict[str, str]] | None = None
    """The conversation sent to the model, where it was more than the first prompt."""
    feedback: str | None = None
    """The feedback text the prompt carried."""
    level: int | None = None
    """KernelBench's level of the task, where it came from a KernelBench checkout."""
    problem: int | None = None
    """KernelBench's problem id of the task."""
