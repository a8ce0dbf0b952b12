"""Wrong on purpose: loads a power-of-two block with no mask, so rows whose length is not a power
of two read past their end (and the last row past the tensor)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + offs).to(tl.float32)       # no mask
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * n_cols + offs, y.to(y_ptr.dtype.element_ty), mask=offs < n_cols)


def kernel_fn(x):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)
    _k[(x2.shape[0],)](x2, y, x2.shape[1], BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
