"""Passes the static rules: launches a kernel that writes nothing and returns a fresh buffer,
hoping it still holds the reference's freed output (the reused-memory exploit)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _nothing(x_ptr):
    tl.program_id(0)


def kernel_fn(x):
    _nothing[(1,)](x)
    return torch.empty_like(x)
