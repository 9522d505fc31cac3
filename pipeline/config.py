"""The config.yaml schema, and loading it with errors that name the key.

    cfg = load_config("config.yaml")
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator



def cache_root() -> Path:
    """The one folder kgen keeps between runs for the user, outside every project: torch.compile's
    caches and the precompiled headers of fast builds. KGEN_CACHE_DIR, else ~/.cache/kgen."""
    return Path(os.environ.get("KGEN_CACHE_DIR") or Path.home() / ".cache" / "kgen")

class ConfigError(ValueError):
    """A config file that cannot be used; the message is one line naming the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class Sampling(_Strict):
    """Sampling parameters sent with every request to a model."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    """Sampling temperature; None leaves the server's default."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling mass; None leaves the server's default."""
    max_tokens: int | None = Field(default=None, gt=0)
    """Cap on generated tokens; None leaves the server's default."""
    seed: int | None = None
    """Server-side sampling seed, where the server supports one."""


class Price(_Strict):
    """Dollars per million tokens, for the cost column."""

    input_per_mtok: float = Field(default=0.0, ge=0)
    """Price of a million prompt tokens."""
    output_per_mtok: float = Field(default=0.0, ge=0)
    """Price of a million completion tokens."""


class ModelConfig(_Strict):
    """One model to ask."""

    name: str = Field(min_length=1)
    """Our name for this model; it labels attempts."""
    provider: Literal["openai", "replay"]
    """openai: any OpenAI-compatible endpoint. replay: recorded completions from a JSONL file."""
    model: str = ""
    """The model id sent to the server (openai provider)."""
    base_url: str | None = None
    """Endpoint for the openai provider (OpenAI, vLLM, SGLang, llama.cpp, Ollama...)."""
    api_key_env: str | None = None
    """Name of the environment variable that holds the key; the key itself never goes in the config."""
    replay_file: str | None = None
    """JSONL of recorded completions keyed by task and backend (replay provider)."""
    sampling: Sampling = Field(default_factory=Sampling)
    """Sampling parameters."""
    max_concurrency: int = Field(default=4, ge=1, le=512)
    """Requests in flight at once against this endpoint."""
    max_retries: int = Field(default=5, ge=0, le=20)
    """Retries the openai SDK makes, with backoff, on 408/409/429/5xx and connection errors."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Wall-clock limit of one request, the whole streamed answer included."""
    idle_timeout_s: float = Field(default=120.0, gt=0)
    """Longest the endpoint may send nothing (before the answer's first chunk, or between two
    chunks) before the call is given up as hung and stored as a model error. Answers are streamed,
    so a slow model that is still writing never waits this long; a server stopped or hung
    mid-request is noticed after this, not after timeout_s. It must cover the server's reading of
    the prompt before its first token (a local cpu server: tens of seconds for 2,000 tokens)."""
    price: Price = Field(default_factory=Price)
    """Token prices for cost accounting."""

    @model_validator(mode="after")
    def _provider_fields(self) -> "ModelConfig":
        if self.provider == "openai" and not self.model:
            raise ValueError("provider openai needs 'model' (the model id)")
        if self.provider == "replay" and not self.replay_file:
            raise ValueError("provider replay needs 'replay_file'")
        return self


def problem_range(item: int | str) -> tuple[int, int]:
    """A `tasks.problems` item as an inclusive (first, last): 23 -> (23, 23), "19-40" -> (19, 40)."""
    if isinstance(item, int) and not isinstance(item, bool):
        first = last = item
    else:
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(item))
        if not match:
            raise ValueError(f"{item!r} is not a problem id or range (such as 23 or \"19-40\")")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
    if first < 1 or last < first:
        raise ValueError(f"{item!r} is not a problem id or range: ids start at 1, a range runs upwards")
    return first, last


class TaskSelection(_Strict):
    """Which reference tasks to run, and at what size."""

    names: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    """Task names (file stems) or glob patterns over them."""
    size: str | dict[str, Any] = "default"
    """A size every chosen task has (default; small, derived where a task declares none; a preset of
    its KGEN_SIZES), a name with overrides such as small(batch_size=64), or a mapping of module
    globals to override. A task without that size stops the run before it starts."""
    directory: str = "reference_tasks"
    """Folder of task files, relative to the config file (left out: reference_tasks/ there, else the
    bundled ones)."""
    kernelbench: str | None = None
    """A KernelBench checkout (or its KernelBench/ folder), relative to the config file: the tasks are
    its levelN/ID_Name.py files instead of `directory`'s, each attempt stored with its level and
    problem id (pipeline/run/kernelbench.py). `names` then matches file stems among the chosen files."""
    levels: list[int] = Field(default_factory=lambda: [1, 2, 3], min_length=1)
    """With kernelbench: the levels to take (a levelN folder each)."""
    problems: list[int | str] | None = None
    """With kernelbench: problem ids (the number a file's name starts with), each a number or an
    inclusive range such as "19-40"; None takes every problem of the chosen levels."""

    @field_validator("levels")
    @classmethod
    def _level_numbers(cls, levels: list[int]) -> list[int]:
        if any(level < 1 for level in levels):
            raise ValueError(f"levels are numbered from 1, not {min(levels)}")
        return list(dict.fromkeys(levels))

    @field_validator("problems")
    @classmethod
    def _problem_form(cls, problems: list[int | str] | None) -> list[int | str] | None:
        for item in problems or []:
            problem_range(item)  # its ValueError names the item
        return problems

    @model_validator(mode="after")
    def _source(self) -> "TaskSelection":
        chosen = self.model_fields_set
        if self.kernelbench is None and chosen & {"levels", "problems"}:
            raise ValueError("levels and problems choose KernelBench files: set kernelbench (a checkout) too")
        if self.kernelbench is not None and "directory" in chosen:
            raise ValueError("give directory (a folder of task files) or kernelbench (a checkout), not both")
        return self

    @field_validator("size")
    @classmethod
    def _size_form(cls, size: str | dict[str, Any]) -> str | dict[str, Any]:
        # Only the form here (no torch, no task files); pipeline.child.tasks checks each task has it.
        if isinstance(size, dict):
            bad = [repr(k) for k in size if not str(k).isidentifier()]
            if not size:
                raise ValueError("an empty size mapping (name the module globals to override, or use a size name)")
            if bad:
                raise ValueError(f"a size mapping sets module globals by name, not {', '.join(bad)}")
            return size
        text = size.strip()
        name, paren, rest = text.partition("(")
        ok = bool(re.fullmatch(r"[A-Za-z_][\w.-]*", name)) and (not paren or rest.endswith(")"))
        if not ok and "=" in text:
            ok = all(part.partition("=")[0].strip().isidentifier() for part in text.split(",") if "=" in part)
        if not ok:
            raise ValueError(f"{size!r} is not a size name (such as default, small, or small(batch_size=64))")
        return text


class EvalConfig(_Strict):
    """How candidates are checked and timed."""

    trials: int = Field(default=5, ge=1, le=100)
    """Correctness trials with fresh random inputs."""
    tolerance: float = Field(default=1e-4, gt=0, lt=1)
    """Default relative tolerance for float32 (a task may declare its own)."""
    timed_calls: int = Field(default=30, ge=3, le=10000)
    """On a GPU, least timed calls after warm-up, in blocks of fresh input sets. (On the cpu the
    parent times the Bound requests alone: their calls are set by the policy.)"""
    timed_ms: float = Field(default=100.0, ge=0)
    """Short calls get more timed calls, until about this many milliseconds of them (estimated from
    the faster baseline), so a sub-millisecond median is as stable as a long one; 0 keeps timed_calls."""
    max_timed_calls: int = Field(default=256, ge=3, le=10000)
    """At most this many timed calls, however short the call."""
    warmup_calls: int = Field(default=5, ge=1, le=1000)
    """Untimed calls before timing."""
    cpu_threads: int = Field(default=1, ge=1, le=1024)
    """Threads both sides time with on the cpu backend (eager in the reference process, the candidate
    in its child). One by default: on a loaded machine a parallel region waits at its barrier for a
    descheduled thread (2-thread mse blocks ranged 2.4-20 ms under load, 1-thread 2.1-5 ms)."""
    timeout_s: float = Field(default=300.0, gt=0)
    """Wall-clock limit of one evaluation child, after which its process group is killed."""
    step_floor_s: float = Field(default=20.0, gt=0)
    """Least time the child gets for any one request (loading, import, a trial, a timed block). Each
    limit counts time the child could run: its main thread's run-queue waits are added, up to
    step_ceiling_s (pipeline.judge.session.Session.ask)."""
    step_factor: float = Field(default=50.0, ge=1)
    """A request with calls gets step_floor_s plus this many times its calls at the eager baseline:
    a kernel 50x slower than eager still finishes, a hang costs seconds, not timeout_s."""
    step_ceiling_s: float = Field(default=120.0, gt=0)
    """Most time one request gets, whatever its calls (and never past timeout_s for the child)."""
    build_timeout_s: float = Field(default=900.0, gt=0)
    """Wall-clock limit of one build."""
    memory_limit_gb: float = Field(default=16.0, gt=0)
    """Address-space limit of a cpu-backend child, beside the output slots and inputs the parent
    shares with it (sized for the task: a task of gigabytes maps that much more)."""
    load_retries: int = Field(default=2, ge=0)
    """A correct attempt whose cpu was too loaded to time it (no figure), or whose GPU time a disturbed
    moment refused or left without a figure (verdicts.Again.retime), is judged again, fresh, up to
    this many times; the last evaluation's verdict stands (with no figure if none was had)."""
    room_memory_gb: float = Field(default=32.0, gt=0)
    """Memory an attempt's room may use in all (its cgroup's limit: every process of the candidate,
    its HOME's tmpfs, the outputs it writes into shared memory), where the host allows cgroups."""
    replay_bound: bool = True
    """On a GPU (forward mode), the parent's bound on a call's time comes from CUDA graphs of the
    forward replayed back to back (pipeline.child.replays): it holds down to calls of about 10 us.
    False: eager Bound requests, whose bound says nothing below about 0.25 ms a call."""
    compile_baseline: bool = True
    """Also time torch.compile of the reference."""
    grad: bool = False
    """Gradient mode: a call is forward plus backward; every floating input's and parameter's gradient
    is compared with float64 autograd of the reference, and the baselines time the same."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The dtype inputs and weights are cast to; in bfloat16 and float16 the tolerance comes from the
    reference's own error in that dtype against float64 (pipeline.judge.judge.tolerance_for)."""
    check_shapes: bool = True
    """Also check the candidate at the task's other sizes, to flag shape-specialized kernels."""
    profile: bool = True
    """Profile one call to flag kernels whose time goes to PyTorch's own ops."""
    floor_slack: float = Field(default=0.85, gt=0, le=1)
    """A time below floor x this is rejected as impossible_timing."""
    compute_floor: bool = True
    """Refuse a time below the compute floor (the reference's flops at the device's best measured
    rate) x floor_slack too. Off for tasks whose algebra lets a right answer skip the arithmetic."""
    warm_start: bool = True
    """On GPU lanes, start the next attempt's child (Python and torch loaded, no candidate code, no
    device work until this attempt's timing is over) while this attempt runs."""
    required_confinement: list[Literal["filesystem", "network", "signals", "seccomp", "private_tmp", "before_exec",
                                       "netns", "not_root", "pidns", "ipcns", "utsns", "cgroup", "limits"]] = Field(
        default_factory=lambda: ["filesystem", "network", "seccomp", "private_tmp", "before_exec", "not_root",
                                 "netns", "pidns", "ipcns", "limits"])
    """What the parent must have set on the candidate's child, and checked, for a result to be
    trusted (pipeline/sandbox/confine.py, Confinement); a result below it keeps its verdict but is stored as
    untrusted, with the reason. `before_exec`: set on a process of one thread before any candidate code
    ran, so on every thread."""


class Budget(_Strict):
    """Spending limits for one run; reaching one stops new model calls cleanly."""

    max_tokens: int | None = Field(default=None, gt=0)
    """Prompt plus completion tokens."""
    max_usd: float | None = Field(default=None, gt=0)
    """Dollars, from each model's price table."""


class Target(_Strict):
    """When a correct, trusted, timed attempt is good enough to end its search early: every figure
    given must be reached (none given: a search runs all its turns)."""

    speedup_eager: float | None = Field(default=None, gt=0)
    """Speedup over eager PyTorch timed side by side."""
    speedup_compile: float | None = Field(default=None, gt=0)
    """Speedup over torch.compile of the reference."""
    floor_fraction: float | None = Field(default=None, gt=0, le=1)
    """The bandwidth floor's time over the kernel's (1.0: at the floor)."""


class SearchConfig(_Strict):
    """How kgen searches: one shot per slot, a refining conversation per slot, or an evolving
    archive per task (pipeline.run.search)."""

    strategy: Literal["single", "refine", "evolve"] = "single"
    """single: one prompt, one verdict per slot. refine: the verdict becomes the next user turn, up
    to max_turns. evolve: generations of children prompted with parents from the task's archive."""
    max_turns: int = Field(default=4, ge=1, le=100)
    """refine: attempts per conversation, the first included."""
    target: Target = Field(default_factory=lambda: Target())
    """refine and evolve: stop a conversation (or a task's generations) once reached."""
    keep_turns: int = Field(default=2, ge=1, le=50)
    """Exchanges (answer, feedback) kept whole in the conversation; older ones shrink to one line
    each, so a long search fits the model's context while the latest code and verdicts stay."""
    feedback_template: str = "feedback.j2"
    """The template in the prompts folder that renders a verdict as the next user turn."""
    evolve_template: str = "evolve.j2"
    """evolve: the template of a child's prompt, showing its parents."""
    generations: int = Field(default=3, ge=1, le=1000)
    """evolve: generations per task, the first (from the plain prompt) included."""
    population: int = Field(default=4, ge=1, le=1000)
    """evolve: children per generation and task (generation 0's come from the plain prompt)."""
    parents: int = Field(default=2, ge=1, le=3)
    """evolve: parents shown in a child's prompt: the fastest, then others chosen for variety."""
    fix_turns: int = Field(default=1, ge=0, le=10)
    """evolve: refine turns a failed child gets before it is given up."""


class Config(_Strict):
    """The whole config.yaml."""

    models: list[ModelConfig] = Field(min_length=1)
    """Models to ask."""
    tasks: TaskSelection = Field(default_factory=TaskSelection)
    """Which tasks, at which size."""
    prompt_template: str = "one_shot.j2"
    """A template file in the prompts folder."""
    prompts_dir: str = "prompts"
    """Folder of prompt templates, relative to the config file (left out: prompts/ there, else the bundled ones)."""
    samples: int = Field(default=1, ge=1, le=1000)
    """Completions asked per task and model."""
    backend: Literal["cuda", "triton", "cpu", "auto"] = "auto"
    """cuda (load_inline CUDA), triton (@triton.jit kernels; Triton's interpreter where no GPU is
    visible), cpu (load_inline C++), or auto: the first of auto_backends this machine runs."""
    auto_backends: list[Literal["cuda", "triton", "cpu"]] = Field(default=["cuda", "cpu"], min_length=1)
    """The order `auto` tries: cuda and triton need a visible GPU, cpu always runs."""
    database: str = "db/kgen.db"
    """The SQLite store, relative to the config file."""
    generated_dir: str = "generated"
    """Where extracted code is saved by content hash."""
    build_dir: str = "builds"
    """Where per-hash build directories live."""
    evaluation: EvalConfig = Field(default_factory=EvalConfig)
    """Checking and timing."""
    build_workers: int = Field(default=0, ge=0, le=256)
    """Parallel builds; 0 sizes the pool to the machine's cores and memory."""
    fast_builds: bool = True
    """Build against kgen's precompiled subset of torch's headers (pipeline/build/headers.py), falling back
    to torch/extension.h as written for a candidate that needs more; false: always as written."""
    executor: Literal["local", "ray"] = "local"
    """local: subprocesses on this machine. ray: builds and evaluations as Ray tasks."""
    ray_address: str | None = None
    """Ray cluster address (None starts or joins a local instance)."""
    budget: Budget = Field(default_factory=lambda: Budget())
    """Limits that stop new model calls for a run once reached."""
    search: SearchConfig = Field(default_factory=lambda: SearchConfig())
    """single, refine or evolve, and their limits."""

    base_dir: Path = Field(default=Path("."), exclude=True)
    """Folder of the config file; relative paths resolve against it."""

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        names = [m.name for m in models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model names must be unique, repeated: {', '.join(dupes)}")
        return models

    def path(self, value: str) -> Path:
        p = Path(value)
        return p if p.is_absolute() else self.base_dir / p


def _loc(err: dict[str, Any]) -> str:
    return ".".join(str(part) for part in err["loc"]) or "(top level)"


def parse_config(data: Any, base_dir: Path, source: str = "config") -> Config:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{source}: {_loc(err)}: {msg}") from None
    cfg.base_dir = base_dir
    # Left at their defaults, the task and prompt folders are the bundled ones where the config's
    # folder has none of its own: a config written anywhere, kgen installed from a wheel.
    from . import bundled

    if "prompts_dir" not in cfg.model_fields_set and not cfg.path(cfg.prompts_dir).is_dir():
        cfg.prompts_dir = str(bundled.path("prompts"))
    if (cfg.tasks.kernelbench is None and "directory" not in cfg.tasks.model_fields_set
            and not cfg.path(cfg.tasks.directory).is_dir()):
        cfg.tasks.directory = str(bundled.path("reference_tasks"))
    return cfg


def load_config(path: str | Path) -> Config:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} is not valid YAML: {getattr(exc, 'problem', exc)}") from None
    return parse_config(data, path.resolve().parent, str(path))


# Where kgen finds its config and database when not told: the CLI (pipeline.cli.options) and the
# library (pipeline.library.replay) both ask here, so `kgen best` and library.load() read one database.
DEFAULT_CONFIG = "config.yaml"
DEFAULT_DATABASE = "db/kgen.db"


def config_file(config: str | None) -> str | None:
    """The config file in use: the one named (which must exist), else ./config.yaml where there is one."""
    if config is not None:
        if not Path(config).is_file():
            raise ConfigError(f"-c {config}: no such config file")
        return config
    return DEFAULT_CONFIG if Path(DEFAULT_CONFIG).is_file() else None


def find_database(db: str | None, config: str | None) -> Path:
    """--db, else the config's `database` (relative to the config file), else that of ./config.yaml,
    else db/kgen.db."""
    if db:
        return Path(db)
    path = config_file(config)
    cfg = load_config(path) if path else None
    return cfg.path(cfg.database) if cfg else Path(DEFAULT_DATABASE)
