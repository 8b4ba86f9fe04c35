# Seed 001_e045c2a568772a60.txt, last solution (pseudo-code `fused_forward` that only does `pass`),
# copied verbatim below (trailing spaces trimmed).
# Seed verdict: Evaluation False, Runtime -1.0.
# Expected: load_error. There are no imports, so `class Model(nn.Module)` raises NameError on import;
# and it defines `Model`, not ModelNew, whose forward would call a fused_forward that returns None
# (and reads undefined globals num_groups, eps, negative_slope).

# Fused implementation of the forward pass using a custom CUDA kernel
def fused_forward(input, weight, bias, gamma, beta, num_groups, eps=1e-5, negative_slope=0.01):
    # Your CUDA kernel implementation here (pseudo-code)
    # 1. Compute FC layer: output = input @ weight.t() + bias
    # 2. Compute GroupNorm with given parameters (gamma, beta, num_groups, eps)
    # 3. Apply LeakyReLU with slope
    # 4. Add the result with itself (x + x)
    # Output should be as per the original model
    pass

class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_groups, eps, negative_slope):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(input_size, hidden_size))
        self.bias = nn.Parameter(torch.empty(hidden_size))
        self.gamma = nn.Parameter(torch.empty(hidden_size))
        self.beta = nn.Parameter(torch.empty(hidden_size))
        # Initialize parameters
        nn.init.xavier_normal_(self.weight)
        nn.init.constant_(self.bias, 0)
        nn.init.ones_(self.gamma)
        nn.init.zeros_(self.beta)

    def forward(self, x):
        return fused_forward(x, self.weight, self.bias, self.gamma, self.beta, num_groups, eps, negative_slope)
