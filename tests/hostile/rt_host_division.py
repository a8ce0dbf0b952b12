"""Passes the static rules: kernels compute exp and the row sums, the host divides (a PyTorch
fallback spelled as an operator)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _exp_rows(x_ptr, e_ptr, s_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=m, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(e_ptr + row * n_cols + offs, e.to(e_ptr.dtype.element_ty), mask=m)
    tl.store(s_ptr + row, tl.sum(e, axis=0).to(s_ptr.dtype.element_ty))


def kernel_fn(x):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    e = torch.empty_like(x2)
    s = torch.empty(x2.shape[0], 1, dtype=x.dtype, device=x.device)
    _exp_rows[(x2.shape[0],)](x2, e, s, x2.shape[1], BLOCK=triton.next_power_of_2(x2.shape[1]))
    return (e / s).reshape(x.shape)
