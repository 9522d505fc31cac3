"""The memfd between the parent and a candidate's child: the outbox (output values, child to parent) and
the inbox (a cpu Bound request's inputs, parent to child); how the child copies an output into its slot
(copy_out, copy_quick) and the dtypes the parent reads back (PACKED_DTYPES). The parent creates the
memfd and seals its size; both sides map it.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import fcntl
import mmap
import os
from typing import Any

# Bound at import, before any candidate code: a rebinding of ctypes.memmove later changes nothing here.
_memmove = ctypes.memmove


def _address(buffer: mmap.mmap) -> int:
    """The address of a writable map's first byte (the child's copies: Outbox.write_parts)."""
    import torch

    first = torch.frombuffer(buffer, dtype=torch.uint8, count=1)
    address = first.data_ptr()
    del first
    return address


# ---- the outbox --------------------------------------------------------------------------------

class _Falloc(enum.IntFlag):
    """fallocate(2)'s modes (FALLOC_FL_*, linux/falloc.h), for Outbox.discard."""
    KEEP_SIZE = 0x01
    PUNCH_HOLE = 0x02


class Outbox:
    """Slots of 8-byte words in a memfd the parent creates (`create`), its size sealed (pages cost memory
    only once written), and passes to the child at start. The child writes a slot; the parent reads it
    once the reply that filled it has arrived."""

    def __init__(self, fd: int, slot_values: int, slots: int):
        self.fd = fd
        self.slot_values, self.slots = max(1, slot_values), max(1, slots)
        self.size = self.slot_values * self.slots * 8
        if self.size > os.fstat(fd).st_size:
            raise ValueError(f"an outbox of {self.size} bytes does not fit its memfd of {os.fstat(fd).st_size}")
        self.map = mmap.mmap(fd, self.size)
        self._pinned = None  # the buffer export that keeps a page-locked map alive (pin)
        self._base: int | None = None  # the map's address, for the child's copies (write_tensors)

    @staticmethod
    def create(capacity: int) -> int:
        """Parent side: a sealed memfd of `capacity` bytes, for one child."""
        fd = os.memfd_create("kgen-outbox", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, max(8, capacity))
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        return fd

    def write_at(self, slot: int, address: int, nbytes: int) -> bool:
        """Child side: `nbytes` from `address` (a contiguous cpu tensor's) into `slot` by memmove;
        False when they do not fit (copy_quick)."""
        if slot >= self.slots or nbytes > self.slot_values * 8:
            return False
        if nbytes:
            _memmove((self._base or self._address()) + slot * self.slot_values * 8, address, nbytes)
        return True

    def _address(self) -> int:
        self._base = _address(self.map)
        return self._base

    def write_parts(self, slot: int, parts: tuple[Any, ...]) -> bool:
        """Child side: contiguous cpu tensors' bytes one after another into `slot`, by memmove (the
        least work between the cpu's Bound calls: copy_quick); False when they do not fit."""
        sizes = [p.numel() * p.element_size() for p in parts]
        if slot >= self.slots or sum(sizes) > self.slot_values * 8:
            return False
        if self._base is None:
            self._base = _address(self.map)
        at = self._base + slot * self.slot_values * 8
        for part, n in zip(parts, sizes):
            if n:
                _memmove(at, part.data_ptr(), n)
                at += n
        return True

    def write_tensors(self, slot: int, parts: list[Any]) -> bool:
        """Child side: the tensors' bytes one after another into `slot`, each copied once from where
        it is (a GPU's memory included) into the mapped memfd; False when they do not fit."""
        import torch

        sizes = [p.numel() * p.element_size() for p in parts]
        if slot >= self.slots or sum(sizes) > self.slot_values * 8:
            return False
        if not sum(sizes):
            return True
        at = slot * self.slot_values * 8
        if all(p.device.type == "cpu" for p in parts):
            # A plain memmove to the map's address, taken once: the cheapest copy, which every cpu Bound call
            # and the null's calibration pay (docs/decisions/cpu-timing.md).
            if self._base is None:
                self._base = _address(self.map)
            for part, n in zip(parts, sizes):
                if n:  # a contiguous part's own storage as it is (no torch op between a Bound request's calls)
                    src = part if part.is_contiguous() else part.contiguous()
                    _memmove(self._base + at, src.data_ptr(), n)
                    del src
                at += n
            return True
        view = torch.frombuffer(self.map, dtype=torch.uint8, count=sum(sizes), offset=at)
        at = 0
        for part, n in zip(parts, sizes):
            if n:
                view[at:at + n].copy_(part.detach().reshape(-1).contiguous().view(torch.uint8))
            at += n
        del view
        return True

    def discard(self, first: int = 0, count: int | None = None) -> bool:
        """Parent side, on the cpu: give back the memory of slots `first` to `first + count` (all after
        `first` by default; zeros until written again) once judged, else every slot ever written stays held.
        Not where the child page-locked the outbox (pin): its device would go on writing. False where refused."""
        import ctypes

        count = self.slots - first if count is None else count
        offset, length = first * self.slot_values * 8, count * self.slot_values * 8
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
        return length <= 0 or libc.fallocate(self.fd, _Falloc.PUNCH_HOLE | _Falloc.KEEP_SIZE, offset, length) == 0

    def pin(self) -> bool:
        """Child side, on a GPU: page-lock the slots (cudaHostRegister) so outputs leave the device by DMA
        straight into them, not through the driver's staging buffers (docs/decisions/gpu-timing.md); every
        page is committed now, before any candidate code runs. False (and nothing pinned) if refused."""
        import ctypes

        import torch

        if self._pinned is not None:
            return True
        anchor = ctypes.c_char.from_buffer(self.map)
        try:  # cudart's calls answer a cudaError enum; anything unexpected leaves the copies pageable
            ok = int(torch.cuda.cudart().cudaHostRegister(ctypes.addressof(anchor), self.size, 0)) == 0
        except Exception:  # noqa: BLE001
            ok = False
        if not ok:
            del anchor
            return False
        self._pinned = anchor
        return True

    def close(self) -> None:
        if self._pinned is not None:
            import ctypes

            import torch

            with contextlib.suppress(Exception):  # closing: the process's end unpins it anyway
                torch.cuda.cudart().cudaHostUnregister(ctypes.addressof(self._pinned))
            self._pinned = None
        with contextlib.suppress(BufferError):
            self.map.close()


# ---- the inbox ---------------------------------------------------------------------------------

INBOX_ALIGN = 64


def packed(nbytes: list[int]) -> tuple[list[int], int]:
    """Offsets of a set's tensors packed in order (each aligned to INBOX_ALIGN), and the set's bytes."""
    offsets, at = [], 0
    for n in nbytes:
        offsets.append(at)
        at += -(-n // INBOX_ALIGN) * INBOX_ALIGN
    return offsets, max(at, INBOX_ALIGN)


def inbox_offset(outbox_bytes: int) -> int:
    """Where the inbox starts in the child's memfd: after the outbox's slots, on a page boundary."""
    page = mmap.ALLOCATIONGRANULARITY
    return -(-outbox_bytes // page) * page


class Inbox:
    """Input sets in the same memfd as the outbox, after its slots: the parent writes a Bound
    request's values there once its clock is running, and the child's calls take them in place (cpu).
    Nothing the child writes here is read back; it would only change the inputs of its own calls."""

    def __init__(self, fd: int, offset: int, set_bytes: int, sets: int):
        self.set_bytes, self.sets = set_bytes, sets
        size = set_bytes * sets
        if offset + size > os.fstat(fd).st_size:
            raise ValueError(f"an inbox of {size} bytes at {offset} does not fit its memfd of {os.fstat(fd).st_size}")
        # Every page mapped now: a page first touched inside the parent's clock costs a fault the null
        # model's calibration, which reads no inputs, never paid.
        self.map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), offset=offset)

    def write(self, index: int, data) -> None:
        """Parent side: one packed set (bytes-like of exactly `set_bytes`) into place `index`."""
        if len(data) != self.set_bytes or not 0 <= index < self.sets:
            raise ValueError(f"inbox set {index} of {len(data)} bytes; the inbox holds {self.sets} of {self.set_bytes}")
        self.map[index * self.set_bytes:(index + 1) * self.set_bytes] = data

    def reveal(self, sets: list, cores: set[int] | None) -> None:
        """Parent side: `sets` into places 0, 1, ... from a thread held to `cores` (the stopped child's), so
        the caches there hold the inputs just written, as a timed block's refills leave them, not warmer
        ones (docs/decisions/cpu-timing.md). Where the cores cannot be taken, written from here."""
        before = os.sched_getaffinity(0)
        moved = False
        if cores and cores != before:
            try:
                os.sched_setaffinity(0, cores)  # 0: this thread only
                moved = True
            except OSError:
                pass
        try:
            for i, data in enumerate(sets):
                self.write(i, data)
        finally:
            if moved:
                # Off those cores first, then back to all of ours: a thread merely let go stays where it
                # is, and its wake-ups queue behind the child.
                if before - cores:
                    os.sched_setaffinity(0, before - cores)
                os.sched_setaffinity(0, before)

    def inputs(self, index: int, like: list[Any]) -> list[Any]:
        """Child side: set `index` as the call's inputs, each tensor a view of the inbox with the dtype
        and shape of its place in `like` (the child's own set; other arguments come from there). No
        copy: a copy in the parent's clock is work a candidate could skip by reading the inbox itself."""
        import torch

        tensors = [x for x in like if isinstance(x, torch.Tensor)]
        offsets, total = packed([t.numel() * t.element_size() for t in tensors])
        if total != self.set_bytes:
            raise ValueError(f"an input set packs to {total} bytes, the inbox's sets hold {self.set_bytes}: "
                             f"the task's inputs change size with the seed")
        views = iter(torch.frombuffer(self.map, dtype=torch.uint8, count=t.numel() * t.element_size(),
                                      offset=index * self.set_bytes + at).view(t.dtype).view(t.shape)
                     if t.numel() else torch.empty_like(t) for t, at in zip(tensors, offsets))
        return [next(views) if isinstance(x, torch.Tensor) else x for x in like]

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self.map.close()


def pack_set(inputs: list[Any]) -> bytes:
    """Reference side: an input set's tensors as the inbox holds them (`packed`, C order)."""
    import torch

    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    offsets, total = packed([t.numel() * t.element_size() for t in tensors])
    out = bytearray(total)
    for t, at in zip(tensors, offsets):
        raw = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        out[at:at + raw.size] = raw.tobytes()
    return bytes(out)


def copy_quick(outbox: Outbox, slot: int, obj: Any) -> tuple | dict[str, Any]:
    """copy_out's copy for what the cpu's calls return, in the least time between a Bound request's calls:
    a plain contiguous tensor, or a Grads of them, byte for byte, keeping each part's shape, dtype and count
    (fields_of makes the header after the calls). Anything else goes through copy_out."""
    tensor, grads, strided = _kinds_found or _kinds()
    kind = type(obj)
    if kind is tensor:  # the common case, in the fewest steps
        if obj.is_cpu and obj.layout is strided and obj.is_contiguous():
            n = obj.numel()
            if outbox.write_at(slot, obj.data_ptr(), n * obj.element_size()):
                return False, ((obj.shape, obj.dtype, n),)
        return copy_out(outbox, slot, obj)
    if kind is not grads:
        return copy_out(outbox, slot, obj)
    parts = (obj.output, *obj.grads)
    if not all(type(p) is tensor and p.is_cpu and p.layout is strided and p.is_contiguous() for p in parts):
        return copy_out(outbox, slot, obj)
    kept = tuple((p.shape, p.dtype, p.numel()) for p in parts)
    if not outbox.write_parts(slot, parts):
        return copy_out(outbox, slot, obj)
    return True, kept


_kinds_found: tuple | None = None  # (torch.Tensor, Grads, torch.strided), looked up once (copy_quick)


def _kinds() -> tuple:
    global _kinds_found
    import torch

    from .grad import Grads

    _kinds_found = (torch.Tensor, Grads, torch.strided)
    return _kinds_found


def fields_of(kept: tuple | dict[str, Any]) -> dict[str, Any]:
    """A header's fields from what copy_quick kept: copy_out's for the same output."""
    if isinstance(kept, dict):
        return kept
    grads, parts = kept
    (shape, _, numel), names = parts[0], [str(d).removeprefix("torch.") for _, d, _ in parts]
    fields = {"type": "torch.Tensor", "exact_tensor": True, "shape": list(shape), "numel": numel, "dtype": names[0],
              "device": "cpu", "written": True, "packed": names}
    if grads:
        fields.update(grads=[list(s) for s, _, _ in parts[1:]], numel=sum(n for _, _, n in parts))
    return fields


def copy_out(outbox: Outbox, slot: int, obj: Any) -> dict[str, Any]:
    """put's copy, now, and its header's fields as a plain dict (protocol.OutputHeader(**fields) later)."""
    import torch

    from .grad import Grads

    target = obj.output if isinstance(obj, Grads) else obj
    fields: dict[str, Any] = {"type": f"{type(target).__module__}.{type(target).__qualname__}", "exact_tensor": False}
    if not isinstance(target, torch.Tensor):
        return fields
    fields.update(exact_tensor=type(target) is torch.Tensor, shape=list(target.shape), numel=target.numel(),
                  dtype=str(target.dtype).removeprefix("torch."), device=str(target.device))
    parts = [target]
    if isinstance(obj, Grads):  # the output, then each gradient, one after another
        parts = [obj.output, *obj.grads]
        fields.update(exact_tensor=fields["exact_tensor"] and all(type(g) is torch.Tensor for g in obj.grads),
                      grads=[list(g.shape) for g in obj.grads], numel=sum(p.numel() for p in parts))
        if not fields["exact_tensor"]:
            return fields
    # Each part's own bytes, copied off the device straight into the outbox (one copy, no host buffer:
    # docs/decisions/gpu-timing.md); the parent decodes them (PACKED_DTYPES).
    if outbox.write_tensors(slot, parts):
        fields.update(written=True, packed=[str(p.dtype).removeprefix("torch.") for p in parts])
    return fields


# The dtypes a part may be written in (protocol.put) and the parent decodes: anything else is refused.
PACKED_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
