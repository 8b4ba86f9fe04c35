# Seed 001_e045c2a568772a60.txt, solution 4 (templated `fused_forward` kernel).
# Seed verdict: Evaluation False, Runtime -1.0.
# Expected: incorrect. The matmul runs in PyTorch; the kernel adds the FC bias[col], then does GroupNorm,
# LeakyReLU and x + x. One block per row, one thread per group. Each thread means to average its own
# group (channels t*group_size .. t*group_size + group_size - 1) but its loop reads
# local_data[threadIdx.x + i * blockDim.x], the seed's per-thread loop: one element from each of
# group_size different groups. Every read stays inside the row, so it runs; the mean and variance are
# those of the wrong elements and the output is wrong.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

template <typename T>
__global__ void fused_forward(const T* xw, const T* bias, const T* gamma, const T* beta, T* out, int hidden,
                              int group_size, T eps, T slope) {
    extern __shared__ unsigned char smem[];
    T* local_data = reinterpret_cast<T*>(smem);
    const int64_t row = (int64_t)blockIdx.x * hidden;
    for (int col = threadIdx.x; col < hidden; col += blockDim.x) local_data[col] = xw[row + col] + bias[col];
    __syncthreads();

    T mean = 0;
    for (int i = 0; i < group_size; ++i) mean += local_data[threadIdx.x + i * blockDim.x];
    mean /= group_size;
    T var = 0;
    for (int i = 0; i < group_size; ++i) {
        T d = local_data[threadIdx.x + i * blockDim.x] - mean;
        var += d * d;
    }
    var /= group_size;
    T inv_std = rsqrt(var + eps);

    for (int j = 0; j < group_size; ++j) {
        int c = threadIdx.x * group_size + j;
        T y = (local_data[c] - mean) * inv_std * gamma[c] + beta[c];
        y = y > 0 ? y : y * slope;
        out[row + c] = y + y;
    }
}

torch::Tensor fused_forward_cuda(torch::Tensor xw, torch::Tensor bias, torch::Tensor gamma,
                                 torch::Tensor beta, int64_t num_groups, double eps, double slope) {
    TORCH_CHECK(xw.is_cuda() && xw.dim() == 2, "xw: 2-D CUDA tensor");
    TORCH_CHECK(xw.scalar_type() == torch::kFloat32, "float32 only");
    xw = xw.contiguous();
    int hidden = xw.size(1);
    TORCH_CHECK(hidden % num_groups == 0 && num_groups <= 1024, "bad num_groups");
    TORCH_CHECK(hidden * sizeof(float) <= 48 * 1024, "row does not fit in shared memory");
    auto out = torch::empty_like(xw);
    fused_forward<float><<<xw.size(0), num_groups, hidden * sizeof(float)>>>(
        xw.data_ptr<float>(), bias.contiguous().data_ptr<float>(), gamma.contiguous().data_ptr<float>(),
        beta.contiguous().data_ptr<float>(), out.data_ptr<float>(), hidden, hidden / num_groups, (float)eps,
        (float)slope);
    return out;
}
"""

cpp_source = (
    "torch::Tensor fused_forward_cuda(torch::Tensor xw, torch::Tensor bias, torch::Tensor gamma,"
    " torch::Tensor beta, int64_t num_groups, double eps, double slope);"
)

fused = load_inline(
    name="fused_forward",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_forward_cuda"],
)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, num_groups, eps=1e-5, negative_slope=0.01):
        super().__init__()
        self.fc = nn.Linear(input_size, hidden_size)
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=hidden_size, eps=eps)
        self.leaky_relu = nn.LeakyReLU(negative_slope=negative_slope)

    def forward(self, x):
        xw = torch.matmul(x, self.fc.weight.t())  # the FC bias is added inside the kernel
        return fused.fused_forward_cuda(
            xw, self.fc.bias, self.gn.weight, self.gn.bias, self.gn.num_groups, self.gn.eps,
            self.leaky_relu.negative_slope,
        )
