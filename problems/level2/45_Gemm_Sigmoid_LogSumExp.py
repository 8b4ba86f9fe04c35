"""Linear, sigmoid, Linear, then logsumexp over the features of each row."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super().__init__()
        self.linear1 = nn.Linear(input_size, hidden_size)
        self.linear2 = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        x = self.linear1(x)
        x = torch.sigmoid(x)
        x = self.linear2(x)
        x = torch.logsumexp(x, dim=1)
        return x


batch_size = 16384
input_size = 2048
hidden_size = 4096
output_size = 1024
# `kbeval run --smoke`: sizes small enough for a CPU (read statically, never executed)
KBEVAL_SMOKE_DIMS = {"batch_size": 2, "input_size": 256, "hidden_size": 512}


def get_inputs():
    return [torch.rand(batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, output_size]
