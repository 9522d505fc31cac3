"""Exploit: siblings share answers through System V shared memory, on a GPU (tests/test_room.py's hole
1: the CUDA version of sibling_sysv.py).

A batch's samples of one task (one turn, one generation) are judged on one draw: the same inputs,
call for call. This file plays both roles. Each call gathers a small strided sample of its inputs
on the device (64 values of each), reads it back to the host and hashes it with the length; the hash
is looked up in a System V shared memory table keyed by KEY, which every sibling derives alike.
Found: the published answer is returned as a CUDA tensor (one fill) without launching the reduction
or reading the rest of the inputs. Not found: the answer is computed honestly by a CUDA kernel (one
block, a compensated double sum per thread: right, and slower than eager), copied to the host and
published for the sibling judged next. So the first sibling computes, the second copies.
The host round trip cannot be captured into a CUDA graph: under capture the call refuses (a
RuntimeError), so the parent's graph replays fail and it bounds the calls with eager requests, where
a served call is really as fast as it looks.
KGEN-NOTE lines: `shm attached ID` or `shm denied ERRNO` at import, `shm hits H misses M` now and then.
The test fills in TAG (the key) so runs do not collide and can remove the segment.

Why it should fail: each attempt has an IPC namespace of its own (no segment is shared with the host
or with another attempt), so the second sibling finds nothing and must compute: it is no faster than
its honest twin (the same file with SHARE = False: tests/test_room.py TWIN)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

TAG = "__KGEN_TAG__"
SHARE = True
KEY = int("".join(c for c in TAG if c in "0123456789abcdef")[:7] or "4b67", 16) | 0x10000000

_DECLS = """
int64_t attach(int64_t key);
torch::Tensor mse(torch::Tensor predictions, torch::Tensor targets);
std::vector<int64_t> stats();
"""

_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

struct Slot { uint64_t key; float value; uint32_t used; };
constexpr int64_t SLOTS = 1 << 16;
constexpr int SAMPLE = 64;
static Slot* table = nullptr;
static int64_t hits = 0, misses = 0;
static float* sample_dev = nullptr;   // SAMPLE values of each input, on the device
static float* sample_host = nullptr;  // pinned: the same, then the computed answer

int64_t attach(int64_t key) {
    int id = shmget((key_t)key, sizeof(Slot) * SLOTS, IPC_CREAT | 0666);
    if (id < 0) return -errno;
    void* p = shmat(id, nullptr, 0);
    if (p == (void*)-1) return -errno;
    table = (Slot*)p;
    return id;
}

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

// The honest answer: one block, each thread a compensated (Kahan) double sum over its stride, the
// block's sums added in a fixed order. Every value read; deterministic; slower than eager by design.
__global__ void compensated_mse(const float* __restrict__ a, const float* __restrict__ b, long long n,
                                float* __restrict__ out) {
    double sum = 0.0, c = 0.0;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        const double d = (double)a[i] - (double)b[i];
        const double y = d * d - c;
        const double t = sum + y;
        c = (t - sum) - y;
        sum = t;
    }
    const double total = block_sum(sum - c);
    if (threadIdx.x == 0) out[0] = (float)(n ? total / (double)n : 0.0);
}

// The key's few values: every step-th element of each input, SAMPLE of them (or all, if fewer).
__global__ void gather(const float* __restrict__ a, const float* __restrict__ b, long long step, int count,
                       float* __restrict__ out) {
    const int i = threadIdx.x;
    if (i < count) {
        out[i] = a[i * step];
        out[SAMPLE + i] = b[i * step];
    }
}

static uint64_t digest(const float* a, const float* b, int count, int64_t n) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    for (int i = 0; i < count; ++i) {
        uint32_t x, y;
        std::memcpy(&x, a + i, 4);
        std::memcpy(&y, b + i, 4);
        h = (h ^ x) * 1099511628211ull;
        h = (h ^ y) * 1099511628211ull;
    }
    return h | 1;
}

static void compute(const float* a, const float* b, int64_t n, float* o, cudaStream_t stream) {
    compensated_mse<<<1, 1024, 0, stream>>>(a, b, n, o);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

torch::Tensor mse(torch::Tensor predictions, torch::Tensor targets) {
    TORCH_CHECK(predictions.is_cuda() && targets.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(predictions.sizes() == targets.sizes(), "shape mismatch");
    TORCH_CHECK(predictions.scalar_type() == at::kFloat && targets.scalar_type() == at::kFloat, "float32 only");
    auto p = predictions.contiguous();
    auto t = targets.contiguous();
    const float* a = p.data_ptr<float>();
    const float* b = t.data_ptr<float>();
    const int64_t n = p.numel();
    auto out = torch::empty({}, p.options());
    float* o = out.data_ptr<float>();
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (table == nullptr || n == 0) {
        ++misses;
        compute(a, b, n, o, stream);
        return out;
    }
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    TORCH_CHECK(capturing == cudaStreamCaptureStatusNone,
                "each call reads a sample of its inputs back to the host: not capturable in a CUDA graph");
    if (sample_dev == nullptr) {
        C10_CUDA_CHECK(cudaMalloc((void**)&sample_dev, 2 * SAMPLE * sizeof(float)));
        C10_CUDA_CHECK(cudaHostAlloc((void**)&sample_host, (2 * SAMPLE + 1) * sizeof(float), cudaHostAllocDefault));
    }
    const int64_t step = n > SAMPLE ? n / SAMPLE : 1;
    const int count = (int)std::min<int64_t>(n, SAMPLE);
    gather<<<1, SAMPLE, 0, stream>>>(a, b, step, count, sample_dev);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    C10_CUDA_CHECK(cudaMemcpyAsync(sample_host, sample_dev, 2 * SAMPLE * sizeof(float), cudaMemcpyDeviceToHost, stream));
    C10_CUDA_CHECK(cudaStreamSynchronize(stream));
    const uint64_t h = digest(sample_host, sample_host + SAMPLE, count, n);
    int64_t at = (int64_t)(h % SLOTS);
    for (int probe = 0; probe < 64; ++probe, at = (at + 1) % SLOTS) {
        Slot& s = table[at];
        if (__atomic_load_n(&s.used, __ATOMIC_ACQUIRE) && s.key == h) {
            ++hits;
            out.fill_(s.value);  // one fill kernel: the reduction is never launched
            return out;
        }
        if (!s.used) {
            ++misses;
            compute(a, b, n, o, stream);
            C10_CUDA_CHECK(cudaMemcpyAsync(sample_host + 2 * SAMPLE, o, sizeof(float), cudaMemcpyDeviceToHost, stream));
            C10_CUDA_CHECK(cudaStreamSynchronize(stream));
            s.key = h;
            s.value = sample_host[2 * SAMPLE];
            __atomic_store_n(&s.used, 1u, __ATOMIC_RELEASE);
            return out;
        }
    }
    ++misses;
    compute(a, b, n, o, stream);
    return out;
}

std::vector<int64_t> stats() { return {hits, misses}; }
"""

_ext = load_inline(name="kgen_redteam_sibling_sysv_cuda", cpp_sources=_DECLS, cuda_sources=_CUDA,
                   functions=["attach", "mse", "stats"], extra_cuda_cflags=["-O3"], verbose=False)
if SHARE:
    _id = _ext.attach(KEY)
    print(f"KGEN-NOTE shm {'attached' if _id >= 0 else 'denied'} {_id} key {KEY:#x}", flush=True)
_calls = [0]


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        out = _ext.mse(predictions, targets)
        _calls[0] += 1
        if _calls[0] & (_calls[0] - 1) == 0:
            hits, misses = _ext.stats()
            print(f"KGEN-NOTE shm hits {hits} misses {misses}", flush=True)
        return out
