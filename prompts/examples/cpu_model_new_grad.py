import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

fma_cpp_source = """
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <vector>

static void check_inputs(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
    TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu() && c.device().is_cpu(),
                "fma: inputs must be CPU tensors");
    TORCH_CHECK(a.scalar_type() == b.scalar_type() && a.scalar_type() == c.scalar_type(),
                "fma: dtypes must match");
    TORCH_CHECK(a.sizes() == b.sizes() && a.sizes() == c.sizes(), "fma: shapes must match");
}

torch::Tensor fma_forward(torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    check_inputs(a, b, c);
    auto a_c = a.contiguous();
    auto b_c = b.contiguous();
    auto c_c = c.contiguous();
    auto out = torch::empty_like(a_c);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a_c.scalar_type(), "fma_forward", [&] {
        using opmath_t = at::opmath_type<scalar_t>;  // float for float32, bfloat16 and float16
        const scalar_t* pa = a_c.data_ptr<scalar_t>();
        const scalar_t* pb = b_c.data_ptr<scalar_t>();
        const scalar_t* pc = c_c.data_ptr<scalar_t>();
        scalar_t* po = out.data_ptr<scalar_t>();
        at::parallel_for(0, a_c.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                po[i] = static_cast<scalar_t>(static_cast<opmath_t>(pa[i]) * static_cast<opmath_t>(pb[i]) +
                                              static_cast<opmath_t>(pc[i]));
            }
        });
    });
    return out;
}

// out = a * b + c, so for the upstream gradient g: grad_a = g * b, grad_b = g * a, grad_c = g, in one pass.
std::vector<torch::Tensor> fma_backward(torch::Tensor grad_out, torch::Tensor a, torch::Tensor b) {
    check_inputs(a, b, grad_out);
    auto g_c = grad_out.contiguous();
    auto a_c = a.contiguous();
    auto b_c = b.contiguous();
    auto grad_a = torch::empty_like(a_c);
    auto grad_b = torch::empty_like(b_c);
    auto grad_c = torch::empty_like(a_c);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a_c.scalar_type(), "fma_backward", [&] {
        using opmath_t = at::opmath_type<scalar_t>;
        const scalar_t* pg = g_c.data_ptr<scalar_t>();
        const scalar_t* pa = a_c.data_ptr<scalar_t>();
        const scalar_t* pb = b_c.data_ptr<scalar_t>();
        scalar_t* ga = grad_a.data_ptr<scalar_t>();
        scalar_t* gb = grad_b.data_ptr<scalar_t>();
        scalar_t* gc = grad_c.data_ptr<scalar_t>();
        at::parallel_for(0, a_c.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                const opmath_t g = static_cast<opmath_t>(pg[i]);
                ga[i] = static_cast<scalar_t>(g * static_cast<opmath_t>(pb[i]));
                gb[i] = static_cast<scalar_t>(g * static_cast<opmath_t>(pa[i]));
                gc[i] = pg[i];
            }
        });
    });
    return {grad_a, grad_b, grad_c};
}
"""

fused_fma = load_inline(
    name="fused_fma_grad_cpu_example",
    cpp_sources=fma_cpp_source,
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
