"""A kernel that holds every thread slot of every SM for a set time, queued ahead of a timed call,
so the host launches the call while the GPU is busy and its events see device time only, not the
host's launch path (docs/decisions/gpu-timing.md). It fills every slot, so no other stream's kernel
runs beside it: a candidate can hide no work under it. Loaded from PTX through the driver API (no
compiler) once a process, before the candidate is imported.
"""

from __future__ import annotations

import ctypes
import enum

import torch

# Every block spins to one deadline, set by the first to start (a CAS on a zeroed slot), so all leave
# the SMs together and nothing queued on another stream starts early on an SM that emptied first.
PTX = rb"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry kgen_hold(.param .u64 ns, .param .u64 slot)
{
  .reg .u64 %rd<8>;
  .reg .u32 %r<2>;
  .reg .pred %p, %q;
  ld.param.u64 %rd1, [ns];
  ld.param.u64 %rd5, [slot];
  mov.u32 %r1, %tid.x;
  setp.ne.u32 %q, %r1, 0;
  @%q bra AGREED;
  mov.u64 %rd2, %globaltimer;
  add.u64 %rd3, %rd2, %rd1;
  mov.u64 %rd7, 0;
  atom.global.cas.b64 %rd6, [%rd5], %rd7, %rd3;
AGREED:
  bar.sync 0;
  ld.volatile.global.u64 %rd3, [%rd5];
WAIT:
  mov.u64 %rd4, %globaltimer;
  setp.lt.u64 %p, %rd4, %rd3;
  @%p bra WAIT;
  ret;
}
"""
THREADS = 1024


class _Cu(enum.IntEnum):
    """The CUDA driver's attribute numbers this file asks for (cuda.h)."""
    FUNC_ATTRIBUTE_NUM_REGS = 4
    DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
    DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39


class HoldError(RuntimeError):
    """The hold kernel could not be loaded or would not fill the GPU."""


class Hold:
    """`hold(stream_handle, ms)` queues the hold on that stream and returns at once."""

    def __init__(self, device: str):
        torch.cuda.init()
        index = torch.device(device).index or 0
        with torch.cuda.device(index):
            torch.empty(1, device=device)  # the primary context is current on this thread from here
        try:
            cu = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise HoldError(f"cannot load libcuda: {exc}") from exc
        self._launch = cu.cuLaunchKernel
        self._launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        module, func = ctypes.c_void_p(), ctypes.c_void_p()
        _check(cu.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)), "cuModuleLoadData")
        _check(cu.cuModuleGetFunction(ctypes.byref(func), module, b"kgen_hold"), "cuModuleGetFunction")
        dev, sms, slots, per_sm, regs = (ctypes.c_int() for _ in range(5))
        _check(cu.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        _check(cu.cuDeviceGetAttribute(ctypes.byref(sms), _Cu.DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "cuDeviceGetAttribute")
        _check(cu.cuDeviceGetAttribute(ctypes.byref(slots), _Cu.DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev),
               "cuDeviceGetAttribute")
        _check(cu.cuFuncGetAttribute(ctypes.byref(regs), _Cu.FUNC_ATTRIBUTE_NUM_REGS, func), "cuFuncGetAttribute")
        _check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(per_sm), func, THREADS, ctypes.c_size_t(0)),
               "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        if per_sm.value * THREADS < slots.value:
            raise HoldError(f"the hold fits {per_sm.value} blocks of {THREADS} threads on an SM of {slots.value} "
                            f"thread slots ({regs.value} registers a thread): other kernels could run beside it")
        self.func, self.blocks = func, per_sm.value * sms.value
        self._module = module  # kept alive with the function
        self._slot = torch.zeros(1, dtype=torch.int64, device=device)  # the agreed deadline, zeroed per hold
        self._stream = torch.cuda.ExternalStream
        self(torch.cuda.current_stream().cuda_stream, 0.0)  # the driver compiles the PTX here, not in a timed call
        torch.cuda.synchronize()

    def __call__(self, stream: int, ms: float) -> None:
        with torch.cuda.stream(self._stream(stream)):
            self._slot.zero_()
        ns, slot = ctypes.c_uint64(int(ms * 1e6)), ctypes.c_uint64(self._slot.data_ptr())
        params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.pointer(ns), ctypes.c_void_p),
                                       ctypes.cast(ctypes.pointer(slot), ctypes.c_void_p))
        _check(self._launch(self.func, self.blocks, 1, 1, THREADS, 1, 1, 0, ctypes.c_void_p(stream), params, None),
               "cuLaunchKernel")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise HoldError(f"{what} failed with CUDA driver error {status}")
