"""A model file with its own RMSNorm class (named like T5's, which is an RMSNorm called
LayerNorm), for the model-source and integration tests. Imports torch only."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class T5StyleLayerNorm(nn.Module):
    """RMSNorm: no mean subtraction, no bias, the variance in fp32, as T5 writes it."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, hidden):
        variance = hidden.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden.to(self.weight.dtype)


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = T5StyleLayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(F.silu(self.up(self.norm(x))))


class TinyNet(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 96, layers: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(layers))
        self.final_norm = T5StyleLayerNorm(dim)
        with torch.no_grad():
            self.final_norm.weight.add_(0.1 * torch.randn(dim))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.final_norm(x)


def build():
    """The zero-argument-function route."""
    return TinyNet(dim=64, hidden=96, layers=1)


def get_init_inputs():
    return [64, 96, 2]


def get_inputs():
    return [torch.randn(2, 4, 64)]
