"""Every threshold the judge plans or decides by, in one versioned record.

The judge's modules read `POLICY`; each attempt stores the version it was judged under
(`EvalResult.policy`). A change to any value, or to how one is used, is a new version. The
measurements behind each value are in docs/decisions/ (cpu-timing, gpu-timing, memory-and-outputs).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Policy(BaseModel):
    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True, extra="forbid")

    version: str = "13"
    """Stored with each attempt; bumped with any change below."""

    # ---- the plan: how many calls, in what requests -----------------------------------------------
    checked_timed: int = 16
    """Timed calls whose outputs are compared in full, chosen in secret per attempt (on the cpu, which
    has no timed blocks, Bound calls: one of each request, then more up to this many)."""
    checked_output_bytes: int = 2 << 30
    """... fewer where their outputs together would pass this many bytes; so too the Bound requests
    whose one call is checked (each check's float64 expected values, twice its output, are made by
    the reference and compared by the parent: 2.4 s for 512 MiB on an H100's host, 11 s for 1 GiB on
    the 2-core box; docs/decisions/memory-and-outputs.md) ..."""
    checked_min: int = 2
    """... but never fewer than this. A stale output on a share f of the calls is then caught with
    probability 1 - (1 - f)^2 at the least, beside the trials and, on a GPU, the replays' digests."""
    bound_requests: int = 5
    """Bound requests an attempt makes at least (a GPU's estimate is the fastest of them)."""
    cpu_bound_requests: int = 8
    """On the cpu, Bound requests where the inputs fit ahead: short requests fit between a loaded
    box's preemptions often enough (12 until policy 5: docs/decisions/cpu-timing.md)."""
    cpu_short_ms: float = 4.0
    """On the cpu, where eager takes under this a call, a Bound request holds a timed block's calls
    (or more), else one: a long call is its own request's measure."""
    cpu_bound_ms: float = 4.0
    """... and a call so short that a block's calls take under this gets more calls a request, so what
    a request costs besides its calls is spread thinner."""
    cpu_bound_max_calls: int = 128
    """The most calls a cpu Bound request holds: 32 calls of 5 us were a sixth of the millisecond of
    protocol around them."""
    cpu_bound_set_bytes: int = 256 << 20
    """Input bytes a cpu Bound request's sets hold together at most."""
    inbox_bytes: int = 1 << 30
    """On the cpu, Bound inputs come from the parent through the inbox up to this many bytes a set:
    made in the child (torch's normal_, about 7 ms per million values) they cost ten times an mse call."""
    bound_set_bytes: int = 8 << 30
    """Input bytes a GPU Bound request may hold at once."""
    block_output_bytes: int = 512 << 20
    """Outputs a timed block or a Bound request writes at most, each in its own outbox slot until
    checked (fewer calls a block for outputs of a gigabyte)."""
    memory_factor: dict[str, int] = {"cpu": 4, "cuda": 3}
    """Bytes a size needs per byte of its footprint (inputs, weights and output, where the meta device
    can tell), at the judge's peak; a size that needs more than the device has free is refused
    (pipeline.child.sizes.check_memory). On a GPU: the reference's float64 forward of one checked
    call, its inputs and output in float64 (2), while the candidate's child holds its own inputs,
    weights and the output slots not yet judged (1). Nothing else is kept beside them: past
    ahead_bytes of an attempt's expected values the parent asks for one call's float64 values at a
    time, and it compares them in chunks, never as whole float64 copies; the reference drops its
    float32 inputs during the float64 forward and its eager blocks' large input sets before it
    (pipeline.judge.reference.Reference.expected); a block keeps one input set where a set is over a
    gigabyte (timing.input_sets), and its outputs take at most about block_output_bytes of slots. Not
    counted: the float64 model's own temporaries, and a model kept twice (its float32 and float64
    copies, 3x the weights, beside the child's); where weights dominate, the check is that much too
    lenient (docs/decisions/memory-and-outputs.md). On the cpu every process shares one memory, and
    more of the judge is there: the parent's and the child's shared slots (the output judged, and on
    the inbox path, for inputs up to a GiB, the Bound calls' inputs beside the child's own set), and
    three Python processes with torch loaded (about 1.5 GiB together); tests/test_big_output.py
    measures the whole tree against it."""
    ahead_bytes: int = 256 << 20
    """An attempt's expected values and inbox sets computed before its child starts, at most: made
    between the child's requests, on its cores, they slowed its calls."""

    # ---- the calibration and the clocks -------------------------------------------------------------
    calibration_blocks: dict[str, int] = {"cpu": 10, "cuda": 5}
    """Null-model Bound requests before the import. Ten on the cpu, where about half can stall
    1.5-2 ms in gradient mode (all ten about once in a thousand); five on a GPU (a sixth of an
    attempt's start-up in a batch)."""
    cold_calibration_ms: float = 50.0
    """On the cpu each null request follows a cold eager block, as each of the candidate's requests
    does, where such a block takes at most this (and five null requests where it takes more)."""
    loaded_share: float = 0.6
    """On the cpu, the share of the timed windows that went to run-queue waits beyond which the
    timing is unfit (no figure, re-timed). The load is taken out of both sides below it; at 30-62%
    an honest kernel read 0.80-0.98x eager beside a running suite."""
    cpu_noise: float = 0.25
    """On the cpu, the null requests' interquartile range over a request's net time past which the
    calls are too short to time (no figure): an add of microseconds read 0.52-1.44x eager beside itself
    at 0.10-1.31, honest references at "small" 0.001-0.077 (docs/decisions/cpu-timing.md)."""
    replays_min: int = 4
    """The fewest replays a replayed Bound request holds."""
    replays_max: int = 512
    """The most: at this many, calls are too short to fill replay_target_ms."""
    replay_target_ms: float = 10.0
    """A replayed Bound request holds about this much of calls at the faster baseline's speed, so the
    request's noise and the graph's launch are spread over many calls."""
    replay_spread: float = 1.5
    """A GPU's replayed requests whose interquartile range is over this many times their median are no
    figure and judged again (verdicts.Again.retime). On the H100 (2026-12-07) 64 evaluations from 8 us
    to 3 ms a call (the red team's call lengths, the batch of 56) read 0.03-0.96; two beside the
    batch's builds read 2.2 and 2.4, one kept at a sixth of its speed, one refused under its floor."""
    replay_checks: int = 3
    """Replays whose digests a replayed request checks, chosen in secret."""

    malloc_env: dict[str, str] = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
                                  "MALLOC_TOP_PAD_": str(64 << 20)}
    """glibc's settings in every child's environment, so freed blocks stay in the heap. glibc hands
    large blocks back to the system when freed (mmap above a threshold that adapts, and heap
    trimming), so a call's temporaries page-fault afresh whenever the heap was trimmed in between:
    about 1 us per 4 KiB page, 2-5 ms for an mse call on 4 MiB inputs that takes 1.3 ms when the heap
    stays. Whether it stayed depended on what else the process did between calls, so the same call
    timed differently in a timed block and in a Bound request. Kept: the reference (baselines) and the
    candidate's child time their calls on the same warm heap."""

    # ---- the device's health --------------------------------------------------------------------------
    bandwidth_tol: float = 0.25
    """A GPU's bandwidth below the run's first figure (or the stored one) by more is unfit: a healthy
    H100 measured 14% below its start mid-run, the sick states seen under a quarter of it."""
    hold_tol: float = 0.05
    """A 1 ms hold that takes over 1.05 ms shares the GPU (or every launch is slowed)."""
    recent_s: float = 3.0
    """A fit check this recent stands for the check before an attempt."""
    stored_bandwidth: dict[str, float] = {"NVIDIA H100 80GB HBM3": 2995.0}
    """GB/s measured by the health check on healthy devices of a name (docs/decisions/gpu-timing.md):
    a run's first check is held to it too, so a device already sick when the run begins is caught."""

    # ---- correctness and flags ------------------------------------------------------------------------
    dtype_eps: dict[str, float] = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}
    """The least relative tolerance a low-precision dtype gets: its machine epsilon. A fixed 1e-4 fails
    every honest bfloat16 kernel; the rounding of the output alone is up to half an epsilon."""
    tf32_tol: float = 2.0 ** -8
    """On a GPU in float32, a task whose call runs a convolution is judged at this tolerance at least:
    PyTorch lets cuDNN convolve in TF32 (10 bits of mantissa) by default, and which engine runs, with
    TF32 or not, differs between processes. KernelBench's own level-2 references dropped in read 1.7e-3
    to 1.9e-3 in the elementwise metric against float64 and failed at 1e-3 while the reference's own
    float32 run read under a quarter of it (H100, 2026-12-06). ref_err_factor x TF32's epsilon 2^-10."""
    ref_err_factor: float = 4.0
    """A low-precision output may be off by this many times PyTorch's own error in that dtype."""
    own_err_cap: float = 10.0
    """... and by no more than this many times the tolerance, element by element."""
    digest_sum_eps: float = 1e-5
    """A replayed call's digest's float32 summing, beside the tolerance."""
    no_custom_kernel_fraction: float = 0.5
    """The share of a call in PyTorch's own ops that raises no_custom_kernel."""
    cpu_short_profile_us: float = 20_000
    """On the cpu, a call whose profiled span is under this is profiled again and the median share
    taken: a short call's span holds the gaps between its ops, and one preemption there can put a
    pure-PyTorch call under half ..."""
    cpu_short_profiles: int = 3
    """... up to this many profiles."""
    library_levels: tuple[int, ...] = (2, 3)
    """KernelBench's levels where a candidate may keep library operators (a GEMM, a convolution)."""
    library_own_fraction: float = 0.01
    """At KernelBench's levels 2 and 3, where a library GEMM or convolution may stay, the share of the
    call its own kernels must do (more than a token launch)."""
    own_code_files: int = 16
    """Extension files the parent reads symbols from (the build folder is the candidate's to fill)."""
    own_code_names: int = 20
    """Function and kernel names a build's OwnCode keeps of each kind."""
    tool_s: int = 30
    """The longest one run of `nm`, `c++filt` or `readelf` over a build's files may take."""

    # ---- the judge's own work: memory, threads, retries ---------------------------------------------
    compare_chunk: int = 1 << 22
    """Values a step of the reference's comparison (judge.tensor_stats) and error pass on a GPU, and of
    the parent's byte comparison of two slots (32 MiB of float64 an array)."""
    compare_piece: int = 1 << 16
    """Values each chunk is worked through at a time, in the comparison and, on the cpu, in the
    reference's comparison (tensor_stats) and own check: the float64 temporaries (512 KiB each) stay in the core's cache, which whole 4M-value
    chunks miss, and a gigabyte output's comparison took two to three times as long
    (docs/decisions/memory-and-outputs.md)."""
    digest_chunk: int = 1 << 22
    """Values a step where the reference works through a replayed output's float64 digest."""
    large_sets_bytes: int = 256 << 20
    """Input sets this large the reference frees before an `expect` (made again when needed), and its
    cold blocks beside the cpu's Bound requests keep sets only below it; on the cpu, a checked call's
    inputs up to it stay beside its float64 forward."""
    discard_slot_bytes: int = 64 << 20
    """On the cpu, outbox slots this large are given back once judged (Session.discard)."""
    seal_tries: int = 40
    """Tries at sealing a memfd while the kernel answers EBUSY (its own memory work holds pages for a
    moment: one `expect` on the 2-core box went unjudged without them) ..."""
    seal_pause_s: float = 0.05
    """... and the pause between them."""
    log_tail_bytes: int = 200_000
    """Bytes of a child's log the parent reads, the last ones: nvcc can print megabytes of warnings."""
    outbox_bytes: int = 1 << 31
    """A spare child's outbox (virtual: pages cost memory only when the child writes them)."""


POLICY = Policy()
