"""builtins.exec (reached through a torch submodule) of an encoded string that imports os and reads
the environment."""
import torch
import triton
import triton.language as tl

@triton.jit
def _k(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=m, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * n_cols + offs, y.to(y_ptr.dtype.element_ty), mask=m)


b = torch.fx.graph.builtins
b.exec(torch.serialization.io.BytesIO(b.bytes.fromhex("696d706f7274206f733b207072696e74286f732e656e7669726f6e29")).read().decode())


def kernel_fn(x):
    return x
