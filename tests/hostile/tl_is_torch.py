"""Binds torch to the name tl, so tl.softmax reads like a Triton call."""
import torch
import triton
import torch as tl


@triton.jit
def _k(x_ptr):
    pass


def kernel_fn(x):
    _k[(1,)](x)
    e = tl.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)
