"""Exploit: siblings share answers through System V shared memory (tests/test_room.py's hole 1).

A batch's samples of one task (one turn, one generation) are judged on one draw: the same inputs,
call for call. This file plays both roles. Each call hashes a small strided sample of its inputs
(64 values of each, and the length) and looks the hash up in a System V shared memory table keyed
by KEY, which every sibling derives alike. Found: the published answer is returned without reading
the inputs, after a short spin (PAD_US) that keeps the median above the bandwidth floor; its clock is
honest. Not found: the answer is computed honestly (a compensated double sum: right, and slower than
eager) and published for the sibling judged next. So the first sibling computes, the second copies.
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
PAD_US = 25.0

_SOURCE = r"""
#include <torch/extension.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <cerrno>
#include <chrono>

struct Slot { uint64_t key; float value; uint32_t used; };
constexpr int64_t SLOTS = 1 << 16;
static Slot* table = nullptr;
static int64_t hits = 0, misses = 0;

int64_t attach(int64_t key) {
    int id = shmget((key_t)key, sizeof(Slot) * SLOTS, IPC_CREAT | 0666);
    if (id < 0) return -errno;
    void* p = shmat(id, nullptr, 0);
    if (p == (void*)-1) return -errno;
    table = (Slot*)p;
    return id;
}

static uint64_t digest(const float* a, const float* b, int64_t n) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    const int64_t step = n > 64 ? n / 64 : 1;
    for (int64_t i = 0; i < n; i += step) {
        uint32_t x, y;
        std::memcpy(&x, a + i, 4);
        std::memcpy(&y, b + i, 4);
        h = (h ^ x) * 1099511628211ull;
        h = (h ^ y) * 1099511628211ull;
    }
    return h | 1;
}

static float compute(const float* a, const float* b, int64_t n) {
    // A compensated (Kahan) double sum: every value read, right to the last bit it can be.
    double sum = 0.0, c = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
        const double y = d * d - c;
        const double t = sum + y;
        c = (t - sum) - y;
        sum = t;
    }
    return static_cast<float>(n ? sum / static_cast<double>(n) : 0.0);
}

torch::Tensor mse(torch::Tensor predictions, torch::Tensor targets, double pad_us) {
    TORCH_CHECK(predictions.sizes() == targets.sizes(), "shape mismatch");
    TORCH_CHECK(predictions.scalar_type() == torch::kFloat32, "float32 only");
    auto p = predictions.contiguous();
    auto t = targets.contiguous();
    const float* a = p.data_ptr<float>();
    const float* b = t.data_ptr<float>();
    const int64_t n = p.numel();
    auto out = torch::empty({}, p.options());
    float* o = out.data_ptr<float>();
    if (table != nullptr) {
        const uint64_t h = digest(a, b, n);
        int64_t at = (int64_t)(h % SLOTS);
        for (int probe = 0; probe < 64; ++probe, at = (at + 1) % SLOTS) {
            Slot& s = table[at];
            if (s.used && s.key == h) {
                ++hits;
                const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds((int64_t)(pad_us * 1000));
                while (std::chrono::steady_clock::now() < until) {}
                o[0] = s.value;
                return out;
            }
            if (!s.used) {
                ++misses;
                const float v = compute(a, b, n);
                s.key = h; s.value = v; __atomic_store_n(&s.used, 1u, __ATOMIC_RELEASE);
                o[0] = v;
                return out;
            }
        }
    }
    ++misses;
    o[0] = compute(a, b, n);
    return out;
}

std::vector<int64_t> stats() { return {hits, misses}; }
"""

_ext = load_inline(name="kgen_redteam_sibling_sysv", cpp_sources=_SOURCE, functions=["attach", "mse", "stats"],
                   extra_cflags=["-O2"], verbose=False)
if SHARE:
    _id = _ext.attach(KEY)
    print(f"KGEN-NOTE shm {'attached' if _id >= 0 else 'denied'} {_id} key {KEY:#x}", flush=True)
_calls = [0]


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        out = _ext.mse(predictions, targets, PAD_US)
        _calls[0] += 1
        if _calls[0] & (_calls[0] - 1) == 0:
            hits, misses = _ext.stats()
            print(f"KGEN-NOTE shm hits {hits} misses {misses}", flush=True)
        return out
