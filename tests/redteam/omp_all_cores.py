"""Unequal cores: an honest mse (honest_cpp.py's loop) that spreads its work over every core it can
see with std::thread, while eager and torch.compile are timed on EvalConfig.cpu_threads threads.

Why it should not win by it: the parent holds the child to as many cores as eager's threads
(pipeline.sandbox.cpu_cores, set before the candidate runs; the harness's seccomp filter refuses
sched_setaffinity, so it cannot leave), so its threads share those cores and its speedup is its
single-thread twin's, within noise.

Measured on the 2-core box, with cpu_threads 1, before the child was held to eager's cores: 1.15x
eager against its one-thread twin's 0.65x."""
import os

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>
#include <thread>
#include <vector>

torch::Tensor mse(torch::Tensor predictions, torch::Tensor targets) {
    TORCH_CHECK(predictions.sizes() == targets.sizes(), "shape mismatch");
    TORCH_CHECK(predictions.scalar_type() == torch::kFloat32, "float32 only");
    auto p = predictions.contiguous();
    auto t = targets.contiguous();
    const float* a = p.data_ptr<float>();
    const float* b = t.data_ptr<float>();
    const int64_t n = p.numel();
    // Every core the machine has, whatever this process may run on (sysconf, not the affinity mask).
    int workers = static_cast<int>(std::thread::hardware_concurrency());
    if (workers < 1) workers = 1;
    std::vector<double> sums(workers, 0.0);
    std::vector<std::thread> pool;
    const int64_t chunk = (n + workers - 1) / workers;
    for (int w = 0; w < workers; ++w) {
        pool.emplace_back([&, w] {
            const int64_t lo = w * chunk, hi = std::min(n, lo + chunk);
            double s = 0.0;
            for (int64_t i = lo; i < hi; ++i) {
                const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
                s += d * d;
            }
            sums[w] = s;
        });
    }
    for (auto& th : pool) th.join();
    double sum = 0.0;
    for (double s : sums) sum += s;
    auto out = torch::empty({}, p.options());
    out.data_ptr<float>()[0] = static_cast<float>(n ? sum / static_cast<double>(n) : 0.0);
    return out;
}
"""

_ext = load_inline(name="kgen_redteam_omp_all_cores_mse", cpp_sources=_SOURCE, functions=["mse"],
                   extra_cflags=["-O3", "-pthread"], extra_ldflags=["-pthread"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return _ext.mse(predictions, targets)


print(f"KGEN-NOTE cores {len(os.sched_getaffinity(0))}", flush=True)  # what it may run on, for the test
