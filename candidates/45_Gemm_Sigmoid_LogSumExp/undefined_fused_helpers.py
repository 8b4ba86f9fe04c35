# Seed 002_44f8821cba4ebc79.txt, solution 2 of 7.
# Seed verdict: Evaluation False, Runtime -1.0.
# Expected: runtime_error. ModelNew routes forward through fused_linear_sigmoid / fused_linear_lse, which
# call helpers `linear_sigmoid` and `linear_lse` that are never defined (the seed: "References undefined
# functions ... No actual CUDA code provided"). The module imports and the model builds; the first
# forward() raises NameError.

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super().__init__()
        self.linear1 = nn.Linear(input_size, hidden_size)
        self.linear2 = nn.Linear(hidden_size, output_size)

    def fused_linear_sigmoid(self, x):
        return linear_sigmoid(x, self.linear1.weight, self.linear1.bias)  # noqa: F821 (never defined)

    def fused_linear_lse(self, x):
        return linear_lse(x, self.linear2.weight, self.linear2.bias)  # noqa: F821 (never defined)

    def forward(self, x):
        x = self.fused_linear_sigmoid(x)
        return self.fused_linear_lse(x)
