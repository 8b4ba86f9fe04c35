# Seed 002_44f8821cba4ebc79.txt, solution 3 of 7 (fused linear+sigmoid with a CUDA backward kernel).
# Seed verdict: Evaluation False, Runtime -1.0.
# Expected: compile_error. The backward kernel's input-gradient loop runs over `k` but indexes the
# weight with `i`, which is declared nowhere, so nvcc stops with 'identifier "i" is undefined' and
# load_inline raises at import. (The seed also notes the atomicAdd-heavy backward and that logsumexp is a
# plain-PyTorch autograd Function; both are kept.)

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void fused_linear_sigmoid_forward_kernel(const float* input, const float* weight,
                                                    const float* bias, float* output, int batch,
                                                    int in_features, int out_features) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * out_features) return;
    int b = idx / out_features, out_feat = idx % out_features;
    float sum = bias[out_feat];
    for (int k = 0; k < in_features; ++k)
        sum += input[b * in_features + k] * weight[out_feat * in_features + k];
    output[idx] = 1.0f / (1.0f + expf(-sum));
}

__global__ void fused_linear_sigmoid_backward_kernel(const float* grad_output, const float* input,
                                                     const float* weight, const float* output,
                                                     float* grad_input, float* grad_weight, float* grad_bias,
                                                     int batch, int in_features, int out_features) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * out_features) return;
    int b = idx / out_features, out_feat = idx % out_features;
    float s = output[idx];
    float g = grad_output[idx] * s * (1.0f - s);
    atomicAdd(&grad_bias[out_feat], g);
    for (int k = 0; k < in_features; ++k) {
        atomicAdd(&grad_input[b * in_features + k], g * weight[out_feat * in_features + i]);
        atomicAdd(&grad_weight[out_feat * in_features + k], g * input[b * in_features + k]);
    }
}

torch::Tensor fused_linear_sigmoid_forward(torch::Tensor input, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(input.is_cuda(), "input must be a CUDA tensor");
    input = input.contiguous();
    weight = weight.contiguous();
    int batch = input.size(0), in_features = input.size(1), out_features = weight.size(0);
    auto output = torch::empty({batch, out_features}, input.options());
    int threads = 256, blocks = (batch * out_features + threads - 1) / threads;
    fused_linear_sigmoid_forward_kernel<<<blocks, threads>>>(
        input.data_ptr<float>(), weight.data_ptr<float>(), bias.contiguous().data_ptr<float>(),
        output.data_ptr<float>(), batch, in_features, out_features);
    return output;
}

std::vector<torch::Tensor> fused_linear_sigmoid_backward(torch::Tensor grad_output, torch::Tensor input,
                                                         torch::Tensor weight, torch::Tensor output) {
    grad_output = grad_output.contiguous();
    int batch = input.size(0), in_features = input.size(1), out_features = weight.size(0);
    auto grad_input = torch::zeros_like(input);
    auto grad_weight = torch::zeros_like(weight);
    auto grad_bias = torch::zeros({out_features}, weight.options());
    int threads = 256, blocks = (batch * out_features + threads - 1) / threads;
    fused_linear_sigmoid_backward_kernel<<<blocks, threads>>>(
        grad_output.data_ptr<float>(), input.data_ptr<float>(), weight.data_ptr<float>(),
        output.data_ptr<float>(), grad_input.data_ptr<float>(), grad_weight.data_ptr<float>(),
        grad_bias.data_ptr<float>(), batch, in_features, out_features);
    return {grad_input, grad_weight, grad_bias};
}
"""

cpp_source = """
torch::Tensor fused_linear_sigmoid_forward(torch::Tensor input, torch::Tensor weight, torch::Tensor bias);
std::vector<torch::Tensor> fused_linear_sigmoid_backward(torch::Tensor grad_output, torch::Tensor input,
                                                         torch::Tensor weight, torch::Tensor output);
"""

fused_linear_sigmoid = load_inline(
    name="fused_linear_sigmoid",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_linear_sigmoid_forward", "fused_linear_sigmoid_backward"],
)


class FusedLinearSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias):
        output = fused_linear_sigmoid.fused_linear_sigmoid_forward(input, weight, bias)
        ctx.save_for_backward(input, weight, output)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, output = ctx.saved_tensors
        return tuple(fused_linear_sigmoid.fused_linear_sigmoid_backward(grad_output, input, weight, output))


class FusedLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        m = x.max(dim=1, keepdim=True).values
        out = m.squeeze(1) + torch.log(torch.exp(x - m).sum(dim=1))
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        x, out = ctx.saved_tensors
        return grad_output.unsqueeze(1) * torch.exp(x - out.unsqueeze(1))


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super().__init__()
        self.linear1 = nn.Linear(input_size, hidden_size)
        self.linear2 = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        x = FusedLinearSigmoid.apply(x, self.linear1.weight, self.linear1.bias)
        x = self.linear2(x)
        return FusedLogSumExp.apply(x)
