"""The protocol between the parent (TaskBench.request) and a task's reference process: typed JSON lines
(Start first, then requests, each answered by events ending in Done) and memfds handed over beside them.
A line that does not parse is an error on either side: the reference exits on it, and the parent takes
a reference that sent one as failed. Expected values (and the cpu's packed Bound inputs) travel as
sealed memfds over a Unix socket, never as files a child out of its sandbox could read: sent just
before the line that names them (ExpectedCall.fds), held by the parent for the attempt, passed to no child.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError

from ..policy import POLICY
from ..records import Baselines


class Message(BaseModel):
    # "constants": inf and NaN (an all-zero part's error is infinite) as json writes them, not as null.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, ser_json_inf_nan="constants")


# ---- parent -> reference ---------------------------------------------------------------------


class Start(Message):
    """The first line, before any request: what the process serves for its whole life."""
    task_path: str
    """The task file."""
    device: str
    """'cpu' or 'cuda' (the lane's one visible GPU)."""
    threads: int | None = None
    """torch's thread count on the cpu: the candidate's child's."""
    dtype: str = "float32"
    """The run's dtype: inputs and weights are cast to it."""
    grad: bool = False
    """Gradient mode: a call is forward plus backward (pipeline.child.grad)."""
    warm_compiler: bool = False
    """Warm torch.compile up in a thread from the start (compiling.CompilerWarmup)."""
    off_lane: bool = False
    """Started ahead of its lane: no GPU work until it is moved there (TaskBench.early)."""
    spread_cores: list[int] | None = None
    """The cpu's cores an `expect` may spread over (reference._spread); None: its own."""


class AtSize(Message):
    """A request about one size's model, under one init seed."""
    size: str | dict[str, Any]
    """A size preset's name or explicit module globals."""
    init_seed: int
    """The seed of the model's weights (the attempt's, or the baselines' own)."""


class Rates(Message):
    """A GPU's measured rates (Baselines.bandwidth_gbs, flops_per_s), the same for every task."""
    bandwidth_gbs: float
    """Device memory bandwidth, GB/s."""
    flops_per_s: float | None = None
    """The best arithmetic rate; None where no task's forward had arithmetic to count."""


class MeasureBaselines(AtSize):
    """Time eager (and torch.compile) as a candidate is timed, and the floors: Measured."""
    op: Literal["baselines"] = "baselines"
    rates: Rates | None = None
    """On a GPU, the rates an earlier task's reference measured in this kgen process: not measured again."""
    baseline_seeds: list[int]
    """One input seed per timed call, at most."""
    warmup: int
    """Untimed calls first (torch.compile gets two more)."""
    compile_baseline: bool
    """Time torch.compile of the model too."""
    timed_ms: float
    """The time the timed calls should fill (timing.calls_for)."""
    timed_calls: int
    """The fewest timed calls."""
    max_timed_calls: int
    """The most timed calls."""


class CheckHealth(Message):
    """The device's bandwidth and a 1 ms hold (pipeline.judge.health): HealthFigures."""
    op: Literal["health"] = "health"


class TimeBlock(AtSize):
    """One block of the reference's eager calls beside the candidate's (Reference.time_block): Block."""
    op: Literal["time_block"] = "time_block"
    seeds: list[int]
    """One input seed per call."""
    warmup: int = 0
    """Untimed calls where the block's sets are new (the attempt's first block)."""
    pair: bool = False
    """Each set timed eager, then compiled (Block.compiled_ms)."""
    cold: bool = False
    """Every set drawn first, then one call on each (the cpu's Bound requests, timing.time_cold)."""


class Spec(Message):
    """One call whose output (or inputs) an attempt needs."""
    key: str
    """Names the call's ExpectedCall."""
    size: str | dict[str, Any]
    """The call's size."""
    seed: int
    """Its inputs' seed (tasks.make_inputs)."""
    variant: str
    """Its inputs' variant (tasks.VARIANTS)."""
    inputs: bool = False
    """Also its inputs, packed as the inbox holds them (inputs_fd)."""
    output: bool = True
    """Its output; False: its inputs alone."""
    values: bool = True
    """The output's float64 values (values_fd); False: only its shapes and dtypes."""
    errors: bool = True
    """Also PyTorch's own error in the run's dtype here (another forward); False: the float64 values alone."""


class Expect(Message):
    """Expected outputs of an attempt's calls: an ExpectedCall each, in order."""
    op: Literal["expect"] = "expect"
    init_seed: int
    """The attempt's seed of the model's weights."""
    specs: list[Spec]
    """The calls."""


class Compare(Message):
    """One checked call's output compared here, where its float64 values are computed (past
    POLICY.ahead_bytes of an attempt's values): Compared. The outbox's memfd comes just before the line."""
    op: Literal["compare"] = "compare"
    init_seed: int
    """The attempt's seed of the model's weights."""
    spec: Spec
    """The call."""
    parts: list[tuple[int, str, int]]
    """(first byte in the memfd, dtype as written, values) of the output and each gradient, in order."""
    tol: float
    """The task's tolerance (judge.tolerance_for widens it per part)."""
    errs: list[tuple[float | None, float | None]] | None = None
    """(rel_err, own_err) per part from the call's size's trial; None: measured here (a trial)."""


class DigestItem(Message):
    """One replayed Bound call whose digest the parent checks."""
    key: str
    """Names the replay's Digest."""
    seeds: list[int]
    """The Bound request's seeds."""
    replay: int
    """Which of its replays."""
    replays: int
    """How many the request has (which set and mask a replay reads: pipeline.child.replays.layout)."""
    digest_seed: int
    """The seed of the digest's weights."""
    factor_seed: int
    """The seed of the replays' factors (pipeline.child.replays)."""


class Digests(AtSize):
    """Replayed Bound calls' expected digests: a Digest each."""
    op: Literal["digests"] = "digests"
    items: list[DigestItem]
    """The replays."""


class Play(Message):
    """Replay, as the candidate's replayed Bound request is played, a null model shaped as the
    candidate's and the `models` (Reference.play): Played, or PlayFailed where the null failed."""
    op: Literal["play"] = "play"
    size: str | dict[str, Any]
    """The main size."""
    init_seed: int
    """The attempt's seed of the model's weights."""
    n_seeds: int
    """Input sets, as the candidate's request has."""
    replays: int
    """Replays a request."""
    out_shape: list[int]
    """The candidate's output shape."""
    models: list[Literal["eager", "compiled"]] = []
    """Besides the null model: eager's forward, torch.compile's."""


class Release(Message):
    """Free what an attempt's blocks and null replays kept."""
    op: Literal["release"] = "release"


class Floor(Message):
    """Both floors measured again (TaskBench.floor_now): Floors."""
    op: Literal["floor"] = "floor"
    input_bytes: int
    """Bytes of one call's inputs (the bandwidth floor's)."""
    flops: int
    """Floating-point operations of one call; 0: no compute floor."""


class Settle(Message):
    """Wait for the compiler's warm-up: Settled."""
    op: Literal["settle"] = "settle"


Request = Annotated[Union[MeasureBaselines, CheckHealth, TimeBlock, Expect, Compare, Digests, Play, Release, Floor, Settle],
                    Field(discriminator="op")]
REQUEST = TypeAdapter(Request)


# ---- reference -> parent ---------------------------------------------------------------------


class Ready(Message):
    """The task is loaded; what the baselines' cache key names (bench.baseline_key)."""
    event: Literal["ready"] = "ready"
    device_name: str
    """The GPU's name, or the cpu's."""
    torch_version: str
    """torch.__version__."""
    cuda_version: str | None = None
    """torch.version.cuda; None: a torch without CUDA."""


class Measured(Message):
    event: Literal["baselines"] = "baselines"
    baselines: Baselines
    """Eager's (and torch.compile's) times and the floors, as the bench keeps them."""


class HealthFigures(Message):
    event: Literal["health"] = "health"
    bandwidth_gbs: float
    """The device's measured bandwidth."""
    hold_ms: float | None = None
    """A 1 ms hold between CUDA events; None on the cpu."""


class Busy(Message):
    """What the reference's idle probe saw where the GPU ran other work (health.IdleProbe.timed)."""
    after_ms: float | None = None
    """Still busy after the block and its re-timing: the times stand on a busy device."""
    idle_ms: float
    """The probe on an idle device."""


class Block(Message):
    event: Literal["block"] = "block"
    times_ms: list[float]
    """Eager's times, a call each."""
    compiled_ms: list[float] | None = None
    """With `pair`, torch.compile's; None where it failed (compile_error) or was not asked."""
    compile_error: str | None = None
    """With `pair`: why torch.compile failed, and eager was timed alone."""
    busy: Busy | None = None
    """None: the times do not stand on a busy device (or it is the cpu)."""


class Described(Message):
    """What describes one call's output."""
    shape: list[int] | None = None
    """The output's shape."""
    numel: int | None = None
    """Values of the output and, in gradient mode, every gradient."""
    ref_dtype: str | None = None
    """The output's dtype in the run's dtype."""
    parts: list[tuple[str, list[int]]] | None = None
    """(label, shape) of the output and each gradient (judge.Expected.parts)."""
    dtypes: list[str] | None = None
    """Each part's dtype: what the candidate's must be."""
    fp32_rel_err: float | None = None
    """PyTorch's own error in the run's dtype against float64, the output's (rel_errs[0])."""
    rel_errs: list[float] | None = None
    """The same, part by part: largest |a - b| over largest |b| (judge.tolerance_for)."""
    own_errs: list[float] | None = None
    """The same in the judge's elementwise metric (judge.own_error)."""


class Compared(Described):
    """A Compare's call: what describes it and judge.compare's stats, part by part."""
    event: Literal["compared"] = "compared"
    key: str
    """The Spec's key."""
    stats: list[tuple[float, float, tuple[float, int, float, float] | None] | None]
    """Per part (max |got - ref|, max |ref|, (excess, index, ref, got) furthest past its bound or None); None: NaN or Inf."""


class ExpectedCall(Described):
    """One Spec's call: what describes its output (none where `output` was False) and its memfds."""
    event: Literal["expected"] = "expected"
    key: str
    """The Spec's key."""
    fds: list[str] = []
    """Names ('values_fd', 'inputs_fd') of the descriptors sent just before this line, in order."""
    _taken: dict[str, int] = PrivateAttr(default_factory=dict)  # the parent's descriptors, by name

    def take(self, sock: socket.socket) -> None:
        """Parent side: the descriptors sent before this line, close-on-exec from the moment they arrive.
        OSError if they are not there (they never wait: the line came after them)."""
        _, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(4 * len(self.fds)),
                                          socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
        fds = [fd for level, kind, data in ancillary if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
               for fd in memoryview(data).cast("i")]
        if len(fds) != len(self.fds):
            for fd in fds:
                os.close(fd)
            raise OSError(f"{len(fds)} descriptors came for {len(self.fds)} named")
        self._taken = dict(zip(self.fds, fds))

    def fd(self, name: str) -> int | None:
        return self._taken.get(name)


class Digest(Message):
    """A replay's expected digest (replays.expected_digest)."""
    event: Literal["digest"] = "digest"
    key: str
    """The DigestItem's key."""
    digest: float
    """The digest of the float64 output (and gradients)."""
    scale: float
    """What the digest's tolerance is relative to."""


class Played(Message):
    event: Literal["played"] = "played"
    ms: dict[str, float]
    """Milliseconds on the reference's clock by model ("null", "eager", "compiled"); one not replayable is missing."""
    busy: Busy | None = None
    """None: the times do not stand on a busy device."""


class PlayFailed(Message):
    event: Literal["play_failed"] = "play_failed"
    error: str
    """Why (out of memory beside the paused child, say), in one line."""


class Floors(Message):
    """timing.floors_again: None where a floor could not be measured now."""
    event: Literal["floor"] = "floor"
    floor_ms: float | None = None
    """The bandwidth floor (Baselines.floor_ms)."""
    bandwidth_gbs: float | None = None
    """The bandwidth it stands on."""
    compute_floor_ms: float | None = None
    """The compute floor (Baselines.compute_floor_ms)."""
    flops_per_s: float | None = None
    """The rate it stands on."""
    flops: int = 0
    """The Floor request's, back."""


class Settled(Message):
    """The compiler's warm-up has ended (CompilerWarmup.join)."""
    event: Literal["settled"] = "settled"
    warm_s: float | None = None
    """The warm-up's seconds; None: none ran."""
    waited_s: float = 0.0
    """How long this request waited for it."""
    error: str | None = None
    """Why it failed, where it did."""


class Done(Message):
    """The last event of every request."""
    event: Literal["done"] = "done"
    op: str
    """The request's op."""
    memory_mib: tuple[int, int] | None = None
    """On a GPU, this process's allocator after the request: (allocated, reserved) MiB (beside.replayed)."""


Event = Annotated[Union[Ready, Measured, HealthFigures, Block, ExpectedCall, Compared, Digest, Played, PlayFailed,
                        Floors, Settled, Done], Field(discriminator="event")]
# The reference writes its lines with this adapter: its config reaches a nested Baselines, a model's own would not.
EVENT = TypeAdapter(Event, config=ConfigDict(ser_json_inf_nan="constants"))


class Unparsed(ValueError):
    """A line that is not what it should be (`parse`)."""


def parse(into: TypeAdapter | type[Message], line: str | bytes, what: str) -> Any:
    """A line as a Request (REQUEST), an Event (EVENT) or a Start; where it is none, Unparsed, saying why."""
    try:
        return into.validate_json(line) if isinstance(into, TypeAdapter) else into.model_validate_json(line)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise Unparsed(f"{what} that does not parse ({exc.error_count()} errors, first at "
                         f"{'.'.join(map(str, first['loc'])) or 'the top'}: {first['msg']}): {line[:120]!r}") from None


# ---- descriptors -----------------------------------------------------------------------------


def pair() -> tuple[socket.socket, socket.socket]:
    """(the parent's end, the reference's end): datagrams, each a line's descriptors."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def sealed_memfd(name: str, *data) -> int:
    """A memfd holding the `data` one after another (bytes or contiguous arrays, each written without
    a copy, so a caller can hand over an output's parts without joining them), sealed: its size and
    contents can no longer change, and whoever holds it can only map it read-only."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        for item in data:
            view = memoryview(item).cast("B")
            at = 0
            while at < len(view):
                at += os.write(fd, view[at:at + (1 << 30)])
            del view
        _seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _seal(fd: int) -> None:
    """Seal the memfd, again while the kernel answers EBUSY: F_SEAL_WRITE waits for every extra
    reference to its pages to go, and the kernel's own memory work (compaction, page monitoring)
    holds some for a moment, with nothing else holding the memfd (POLICY.seal_tries)."""
    seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
    for attempt in range(POLICY.seal_tries):
        try:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == POLICY.seal_tries - 1:
                raise
            time.sleep(POLICY.seal_pause_s)


def give(sock: socket.socket, fds: list[int]) -> None:
    """Reference side: send `fds` (then close them: the parent's copies are the only ones left)."""
    try:
        socket.send_fds(sock, [b"x"], fds)
    finally:
        for fd in fds:
            os.close(fd)


def close_all(events: list[Any]) -> None:
    """Close the descriptors that came with `events` (TaskBench.request's)."""
    for event in events:
        if isinstance(event, ExpectedCall):
            for fd in event._taken.values():
                os.close(fd)
            event._taken = {}
