"""Wrong on purpose: right within tolerance every time, but each call scales by a different tiny
factor, so repeated calls on the same input differ bitwise (the determinism stage's case)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, y_ptr, n_cols, jitter, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=m, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0) * (1.0 + jitter)       # a relative 1e-6 or 2e-6: within rtol
    tl.store(y_ptr + row * n_cols + offs, y.to(y_ptr.dtype.element_ty), mask=m)


_calls = [0]


def kernel_fn(x):
    _calls[0] += 1
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)
    _k[(x2.shape[0],)](x2, y, x2.shape[1], 1e-6 * (_calls[0] % 3), BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
