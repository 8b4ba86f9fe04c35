# Seed 003_85427ec2b4df6295.txt, solution 1 (FusedDivLeakyReLU autograd Function, CUDA forward and
# backward kernels).
# Seed verdict: Evaluation True, Runtime 4.49 ms.
# Expected: ok. PyTorch's conv, then one kernel computing leaky_relu(x / divisor, 0.01). The backward
# kernel (grad * (x > 0 ? 1 : slope) / divisor) is only used when gradients are needed; the harness
# runs forward under no_grad, so it never affects the verdict or the time.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void fused_forward_kernel(const float* x, float* y, int64_t n, float divisor, float slope) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i] / divisor;
        y[i] = v > 0.0f ? v : v * slope;
    }
}

__global__ void fused_backward_kernel(const float* grad_out, const float* x, float* grad_in, int64_t n,
                                      float divisor, float slope) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float d = x[i] > 0.0f ? 1.0f : slope;
        grad_in[i] = grad_out[i] * d / divisor;
    }
}

static int64_t blocks_for(int64_t n) { return std::min<int64_t>((n + 255) / 256, 65535); }

torch::Tensor fused_forward_cuda(torch::Tensor x, double divisor, double slope) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x: float32 on CUDA");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    fused_forward_kernel<<<blocks_for(n), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n, (float)divisor,
                                                (float)slope);
    return y;
}

torch::Tensor fused_backward_cuda(torch::Tensor grad_out, torch::Tensor x, double divisor, double slope) {
    TORCH_CHECK(grad_out.is_cuda() && x.is_cuda(), "tensors must be on CUDA");
    grad_out = grad_out.contiguous();
    x = x.contiguous();
    auto grad_in = torch::empty_like(x);
    int64_t n = x.numel();
    fused_backward_kernel<<<blocks_for(n), 256>>>(grad_out.data_ptr<float>(), x.data_ptr<float>(),
                                                 grad_in.data_ptr<float>(), n, (float)divisor, (float)slope);
    return grad_in;
}
"""

cpp_source = """
torch::Tensor fused_forward_cuda(torch::Tensor x, double divisor, double slope);
torch::Tensor fused_backward_cuda(torch::Tensor grad_out, torch::Tensor x, double divisor, double slope);
"""

fused_div_leakyrelu = load_inline(
    name="fused_div_leakyrelu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_forward_cuda", "fused_backward_cuda"],
)


class FusedDivLeakyReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, divisor, negative_slope):
        ctx.save_for_backward(x)
        ctx.divisor, ctx.negative_slope = divisor, negative_slope
        return fused_div_leakyrelu.fused_forward_cuda(x, divisor, negative_slope)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        grad = fused_div_leakyrelu.fused_backward_cuda(grad_output, x, ctx.divisor, ctx.negative_slope)
        return grad, None, None


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, divisor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.divisor = divisor

    def forward(self, x):
        x = self.conv(x)
        return FusedDivLeakyReLU.apply(x, float(self.divisor), 0.01)
