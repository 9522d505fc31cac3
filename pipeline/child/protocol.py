"""The one protocol between the parent and a candidate's child: typed JSON lines (the parent never
unpickles what a child wrote) and the outbox. The parent speaks first (Init, Job, the calibration's
Bound requests, Import, Setup, then Trial / Bound / Play / Profile, Finish) and the child answers each
request with exactly one reply, in order. Inputs are revealed by the request that uses them, so nothing
is computed ahead; output values go into the outbox, a memfd the parent sized (pipeline.child.memfd).
Everything the child says is a claim: the parent checks values itself and times requests with its own
clock. A reply that does not parse, comes out of order or too late ends the attempt (`protocol_error`).
"""

from __future__ import annotations

import math
import os
import select
import time
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .memfd import Outbox, copy_out

MAX_LINE = 1 << 20  # a reply longer than this is a protocol error, never a MemoryError


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---- parent -> child -------------------------------------------------------------------------


class Init(Message):
    """First line; a spare child waits for it with torch loaded but no device touched."""
    op: Literal["init"] = "init"
    device: str
    """'cpu' or 'cuda' (the lane's one visible GPU)."""
    profiler: bool = False
    """Start CUPTI now, so the first profile costs nothing inside the attempt."""


class Job(Message):
    """What to evaluate; the child confines itself right after reading it."""
    op: Literal["job"] = "job"
    task_path: str
    """The task file (KernelBench contract), read-only to the child."""
    size: str | dict[str, Any]
    """Size preset name or explicit module globals for the main trials and timing."""
    code_path: str
    """The candidate's source, read-only to the child."""
    build_dir: str
    """The candidate's built extension, read-only to the child: the child loads, never compiles."""
    device: str
    """'cpu' or 'cuda'."""
    memory_gb: float | None = None
    """Address-space cap (cpu only; CUDA reserves huge virtual ranges)."""
    out_shape: list[int]
    """The reference's output shape at the main size, for the null model the parent calibrates with."""
    slot_values: int
    """Float64 values per outbox slot (the largest reference output of any size this attempt uses)."""
    slots: int
    """Outbox slots."""
    inbox_set_bytes: int = 0
    """Bytes of one packed input set in the inbox (`packed`); 0: no inbox, Bound requests carry seeds."""
    inbox_sets: int = 0
    """Input sets the inbox holds."""
    threads: int | None = None
    """torch's thread count on the cpu (the reference process times eager with the same)."""
    grad: bool = False
    """Gradient mode: a call is forward plus backward (pipeline.child.grad)."""
    dtype: str = "float32"
    """The floating dtype the harness casts inputs and the model to."""
    own_kernels: list[str] = []
    """Kernel names the source defines (@triton.jit functions, read by the parent): the profiler counts them as its own."""


class Import(Message):
    """Import the candidate (after calibration: until here no candidate code has run)."""
    op: Literal["import"] = "import"


class Setup(Message):
    """Build ModelNew at the main size under the shared init seed and warm it up."""
    op: Literal["setup"] = "setup"
    init_seed: int
    warm_seed: int
    warmup: int


class Trial(Message):
    """One checked call: output to slot 0, again after a device sync to slot 1, a repeat to slot 2."""
    op: Literal["trial"] = "trial"
    index: int
    seed: int
    variant: str
    size: str | dict[str, Any]
    repeat: bool = True


class Bound(Message):
    """Fill the input sets, call on each back to back, sync, write outputs: the parent times the whole
    request with its own clock. Before Import the child runs a null model instead."""
    op: Literal["bound"] = "bound"
    index: int
    seeds: list[int] = Field(default_factory=list)
    """One seed per call: a set drawn from each on the device (cuda), in gradient mode its upstream too (inbox: Arm's)."""
    inbox: int = 0
    """Or this many calls on the sets the parent wrote into the inbox, read in place (cpu: drawing would drown a call)."""
    replays: int = 0
    """Or (cuda) capture this many replays on `seeds`' sets (pipeline.child.replays), answer BoundReady; Play runs them."""
    digest_seed: int = 0
    """The seed of the digests' weights (with `replays`)."""

    @property
    def calls(self) -> int:
        return self.replays or self.inbox or len(self.seeds)


class Arm(Message):
    """Gradient mode on inbox sets (cpu), untimed, right before Bound request `index`: make its sets (inbox
    views) and draw each call's upstream from `seeds` outside the window, where draws would drown a small
    call; an upstream known early buys nothing without the inputs. Answered with BoundReady."""
    op: Literal["arm"] = "arm"
    index: int
    seeds: list[int]


class Play(Message):
    """Replay the graphs the last Bound request captured, each replay's factor drawn from
    `factor_seed` (revealed now), one sync, the digests: the parent times this request alone."""
    op: Literal["play"] = "play"
    index: int
    factor_seed: int


class Profile(Message):
    op: Literal["profile"] = "profile"
    size: str | dict[str, Any] | None = None
    """A held-out size to profile one call at; None: the main size."""
    repeats: int = 1
    short_us: float = 0.0
    """On the cpu, a call whose profiled span is under short_us is profiled again, up to `repeats` times."""


class Finish(Message):
    op: Literal["finish"] = "finish"


class BuildJob(Message):
    """What a build child started ahead (pipeline.build's spares, torch already imported) compiles;
    it confines itself right after reading this, before any candidate code runs."""
    op: Literal["build"] = "build"
    code_path: str
    """The candidate's module, read-only to the child."""
    env: dict[str, str]
    """This build's variables (its build folder, MAX_JOBS, kgen's header routes), set before the
    candidate's module is imported."""


Request = Annotated[Union[Init, Job, Import, Setup, Trial, Bound, Arm, Play, Profile, Finish, BuildJob],
                    Field(discriminator="op")]
REQUEST = TypeAdapter(Request)


# ---- child -> parent -------------------------------------------------------------------------


class Confinement(Message):
    """How the child confined itself before any candidate code ran (it is still trusted then)."""
    landlock_abi: int = 0
    """The kernel's Landlock ABI (0: none)."""
    filesystem: bool = False
    """Reads limited to the system, Python, the task, the code and the build; writes to its temp dir."""
    network: bool = False
    """No TCP bind or connect (Landlock ABI 4+)."""
    signals: bool = False
    """No signals to processes outside its Landlock domain (ABI 6+)."""
    seccomp: bool = False
    """setsid() refused, so nothing it starts leaves the session the parent kills."""
    private_tmp: bool = False
    """HOME and TMPDIR are a directory of this attempt alone, and /dev/shm is not writable."""
    uid: int = -1
    """The uid the child runs as."""
    before_exec: bool = False
    """Landlock and seccomp set on a one-thread process before any candidate code (jail.py), so every thread holds them."""
    netns: bool = False
    """A network namespace of its own: no address of the host, its loopback included, is reachable."""
    pidns: bool = False
    """A pid namespace of its own, whose first process ending ends every process the attempt started."""
    ipcns: bool = False
    """An IPC namespace of its own: no System V object or POSIX queue of the host or another attempt."""
    utsns: bool = False
    """A UTS namespace of its own."""
    cgroup: bool = False
    """In cgroups of its own that limit its processes and memory (pipeline.sandbox.cgroup)."""
    limits: bool = False
    """A limit on the size of any file it writes (RLIMIT_FSIZE)."""
    masked: list[str] = []
    """Folders fresh and empty in the child's mount namespace but for what it needs (/tmp, /dev/shm, a 0700 home)."""
    set_by: str = "child"
    """"parent": set and checked by the parent (pipeline/sandbox/confine.py); "child": its own report, never trusted."""
    detail: str = ""
    """Why a layer is missing, where the parent knows."""

    @property
    def not_root(self) -> bool:
        """Runs as a uid other than root's."""
        return self.uid not in (-1, 0)

    def missing(self, required: list[str]) -> list[str]:
        return [name for name in required if not getattr(self, name, False)]


class OutputHeader(Message):
    """What the child says about one returned object; only `written` values are checked for real."""
    type: str
    exact_tensor: bool
    shape: list[int] | None = None
    dtype: str | None = None
    device: str | None = None
    numel: int = 0
    written: bool = False
    """Its values (float64) are in the outbox slot."""
    grads: list[list[int]] | None = None
    """Gradient mode: each gradient's shape; their values follow the output's in the slot."""
    packed: list[str] | None = None
    """The dtype each part (output, then gradients) was written in, raw, so the child's window holds no widening."""


class Ready(Message):
    event: Literal["ready"] = "ready"
    confinement: Confinement


class Imported(Message):
    event: Literal["imported"] = "imported"


class Failed(Message):
    """The request's work raised (import, a call, a model build): the verdict names it."""
    event: Literal["failed"] = "failed"
    op: str
    index: int | None = None
    error: str
    traceback: str = ""
    kind: Literal["no_gradient", "missing_gradient"] | None = None
    """Gradient mode: the call had no usable gradient (the child's word only ever rejects)."""


class SetupDone(Message):
    event: Literal["setup_done"] = "setup_done"


class TrialDone(Message):
    event: Literal["trial_done"] = "trial_done"
    index: int
    output: OutputHeader
    after_sync: OutputHeader
    repeat: OutputHeader | None = None
    inputs_unchanged: bool = True


class BoundReady(Message):
    """The graphs of a Bound request with `replays` are captured (or could not be: `graph_error`), or an
    Arm's sets are ready."""
    event: Literal["bound_ready"] = "bound_ready"
    index: int
    graph_error: str | None = None
    """Why the forward could not be captured; no Play follows."""


class BoundDone(Message):
    event: Literal["bound_done"] = "bound_done"
    index: int
    outputs: list[OutputHeader]
    digests: list[float] = Field(default_factory=list)
    """After a Play: each replay's digest, in order (claims the parent checks against the reference's)."""


class ProfileDone(Message):
    event: Literal["profile_done"] = "profile_done"
    total_us: float | None = None
    torch_us: float | None = None
    torch_fraction: float | None = None
    top: list[tuple[str, float]] = Field(default_factory=list)
    error: str | None = None


class BuildDone(Message):
    event: Literal["build_done"] = "build_done"
    ok: bool
    error: str | None = None


Reply = Annotated[Union[Ready, Imported, Failed, SetupDone, TrialDone, BoundReady, BoundDone, ProfileDone,
                        BuildDone],
                  Field(discriminator="event")]
REPLY = TypeAdapter(Reply)


class ProtocolError(Exception):
    """A child broke the protocol: garbage, an oversized line, a reply out of order."""


# ---- framing ---------------------------------------------------------------------------------


def write_line(fd: int, text: str) -> None:
    """One line, whole: os.write may take only part of it on a pipe."""
    data = (text + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def send(fd: int, message: Message) -> None:
    write_line(fd, message.model_dump_json())


class Reader:
    """Reads one JSON line at a time from a child's pipe, each under an absolute deadline: a child
    that trickles bytes without a newline still runs out of time, and a line over MAX_LINE bytes is
    a protocol error, never a buffer the parent grows without limit."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = b""
        self.closed = False
        self.arrived = 0.0  # time.monotonic() when the last line was complete, before its parse (reply)

    def line(self, deadline: float) -> bytes | None:
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_LINE:
                raise ProtocolError(f"a line of over {MAX_LINE} bytes")
            if self.closed:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            # poll, not select: select refuses descriptors past 1023, and a parent running a sweep's
            # references, spares and memfds holds more.
            poller = select.poll()
            poller.register(self.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
            if not poller.poll(max(1, math.ceil(left * 1000))):
                raise TimeoutError
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                self.closed = True
                continue
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        if len(line) > MAX_LINE:
            raise ProtocolError(f"a line of over {MAX_LINE} bytes")
        return line

    def reply(self, deadline: float) -> Message | None:
        """The next reply, None at end of stream; ProtocolError if it is not a valid reply. `arrived` is taken
        before the parse, so the parent's own parsing is no part of the child's window (Session.ask)."""
        line = self.line(deadline)
        if line is None:
            return None
        self.arrived = time.monotonic()
        try:
            return REPLY.validate_json(line)
        except ValidationError as exc:
            raise ProtocolError(f"an invalid reply ({exc.error_count()} errors): {line[:120]!r}") from None


def put(outbox: Outbox, slot: int, obj: Any) -> OutputHeader:
    """Child side: the header, and the values written to `slot` when they fit."""
    return OutputHeader(**copy_out(outbox, slot, obj))
