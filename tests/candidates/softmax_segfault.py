"""Wrong on purpose, the way a careless kernel is: loads from an address far outside its input,
which crashes the process that runs it (a segmentation fault, or an illegal memory access on a
GPU). Nothing in it breaks the static rules."""
import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < n_cols
    far = 1 << 40
    x = tl.load(x_ptr + far + row * n_cols + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + offs, x.to(y_ptr.dtype.element_ty), mask=m)


def kernel_fn(x):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)
    _k[(x2.shape[0],)](x2, y, x2.shape[1], BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.reshape(x.shape)
