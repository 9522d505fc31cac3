import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

fma_cuda_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <algorithm>
#include <vector>

template <typename scalar_t>
__global__ void fma_forward_kernel(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                                   const scalar_t* __restrict__ c, scalar_t* __restrict__ out, int64_t n) {
    using opmath_t = at::opmath_type<scalar_t>;  // float for float32, bfloat16 and float16
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = static_cast<scalar_t>(static_cast<opmath_t>(a[i]) * static_cast<opmath_t>(b[i]) +
                                       static_cast<opmath_t>(c[i]));
    }
}

// out = a * b + c, so for the upstream gradient g: grad_a = g * b, grad_b = g * a, grad_c = g, in one pass.
// (For a loss, a one-element output, g has one element: read g[0] in the kernel, never .item() on the host.)
template <typename scalar_t>
__global__ void fma_backward_kernel(const scalar_t* __restrict__ g, const scalar_t* __restrict__ a,
                                    const scalar_t* __restrict__ b, scalar_t* __restrict__ grad_a,
                                    scalar_t* __restrict__ grad_b, scalar_t* __restrict__ grad_c, int64_t n) {
    using opmath_t = at::opmath_type<scalar_t>;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const opmath_t gi = static_cast<opmath_t>(g[i]);
        grad_a[i] = static_cast<scalar_t>(gi * static_cast<opmath_t>(b[i]));
        grad_b[i] = static_cast<scalar_t>(gi * static_cast<opmath_t>(a[i]));
        grad_c[i] = g[i];
    }
}

static void check_inputs(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda() && c.is_cuda(), "fma: inputs must be CUDA tensors");
    TORCH_CHECK(a.scalar_type() == b.scalar_type() && a.scalar_type() == c.scalar_type(),
                "fma: dtypes must match");
    TORCH_CHECK(a.sizes() == b.sizes() && a.sizes() == c.sizes(), "fma: shapes must match");
}

static int blocks_for(int64_t n, int threads) {
    return (int)std::min<int64_t>((n + threads - 1) / threads, 65535);
}

torch::Tensor fma_forward(torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    check_inputs(a, b, c);
    const at::cuda::OptionalCUDAGuard guard(a.device());
    auto a_c = a.contiguous();
    auto b_c = b.contiguous();
    auto c_c = c.contiguous();
    auto out = torch::empty_like(a_c);
    const int64_t n = a_c.numel();
    if (n == 0) {
        return out;
    }
    const int threads = 256;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a_c.scalar_type(), "fma_forward", [&] {
        fma_forward_kernel<scalar_t><<<blocks_for(n, threads), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            a_c.data_ptr<scalar_t>(), b_c.data_ptr<scalar_t>(), c_c.data_ptr<scalar_t>(),
            out.data_ptr<scalar_t>(), n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return out;
}

std::vector<torch::Tensor> fma_backward(torch::Tensor grad_out, torch::Tensor a, torch::Tensor b) {
    check_inputs(a, b, grad_out);
    const at::cuda::OptionalCUDAGuard guard(a.device());
    auto g_c = grad_out.contiguous();
    auto a_c = a.contiguous();
    auto b_c = b.contiguous();
    auto grad_a = torch::empty_like(a_c);
    auto grad_b = torch::empty_like(b_c);
    auto grad_c = torch::empty_like(a_c);
    const int64_t n = a_c.numel();
    if (n == 0) {
        return {grad_a, grad_b, grad_c};
    }
    const int threads = 256;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a_c.scalar_type(), "fma_backward", [&] {
        fma_backward_kernel<scalar_t><<<blocks_for(n, threads), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            g_c.data_ptr<scalar_t>(), a_c.data_ptr<scalar_t>(), b_c.data_ptr<scalar_t>(),
            grad_a.data_ptr<scalar_t>(), grad_b.data_ptr<scalar_t>(), grad_c.data_ptr<scalar_t>(), n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return {grad_a, grad_b, grad_c};
}
"""

fma_cpp_source = """
#include <vector>
torch::Tensor fma_forward(torch::Tensor a, torch::Tensor b, torch::Tensor c);
std::vector<torch::Tensor> fma_backward(torch::Tensor grad_out, torch::Tensor a, torch::Tensor b);
"""

fused_fma = load_inline(
    name="fused_fma_grad_example",
    cpp_sources=fma_cpp_source,
    cuda_sources=fma_cuda_source,
    functions=["fma_forward", "fma_backward"],
    verbose=False,
)


class FusedFMA(torch.autograd.Function):
    """The forward and the backward are both custom kernels; forward saves what backward needs."""

    @staticmethod
    def forward(ctx, a, b, c):
        ctx.save_for_backward(a, b)
        return fused_fma.fma_forward(a, b, c)

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        grad_a, grad_b, grad_c = fused_fma.fma_backward(grad_out, a, b)
        return grad_a, grad_b, grad_c


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b, c):
        return FusedFMA.apply(a, b, c)
