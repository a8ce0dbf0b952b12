import torch
import torch.nn as nn


class Model(nn.Module):
    """RMSNorm written as the formula in the model's own forward (no op or class says so)."""

    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(features))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


batch_size = 16
features = 48


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
