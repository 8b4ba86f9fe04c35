"""Conv2d, then add a per-channel bias, multiply by a per-channel scale, sigmoid, and GroupNorm."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, num_groups, bias_shape, scale_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.scale = nn.Parameter(torch.randn(scale_shape))
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        x = self.conv(x)
        x = x + self.bias
        x = x * self.scale
        x = torch.sigmoid(x)
        x = self.group_norm(x)
        return x


batch_size = 128
in_channels = 8
out_channels = 32
height = 256
width = 256
kernel_size = 3
num_groups = 8
bias_shape = (out_channels, 1, 1)
scale_shape = (out_channels, 1, 1)
# `kbeval run --smoke`: sizes small enough for a CPU (read statically, never executed)
KBEVAL_SMOKE_DIMS = {"batch_size": 2, "height": 32, "width": 32, "num_groups": 32}


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    # The shapes follow out_channels when only out_channels is overridden (they must broadcast over it).
    b_shape = bias_shape if bias_shape[0] == out_channels else (out_channels, 1, 1)
    s_shape = scale_shape if scale_shape[0] == out_channels else (out_channels, 1, 1)
    return [in_channels, out_channels, kernel_size, num_groups, b_shape, s_shape]
