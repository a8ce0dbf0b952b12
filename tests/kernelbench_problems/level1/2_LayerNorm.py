import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over the last dim of a [batch, seq, features] input."""

    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


batch_size = 2
seq = 4
features = 80


def get_inputs():
    return [torch.randn(batch_size, seq, features)]


def get_init_inputs():
    return [features]
