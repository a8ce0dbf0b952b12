"""Correct, with unusual structure: two launches (row max and sum into an fp32 workspace, then
normalize), a 2-D grid over (row, column block), exp2 with log2(e) pre-scaling, and strided rows
handled by passing the row stride rather than copying."""
import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _stats(x_ptr, m_ptr, s_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
        new_m = tl.maximum(m, x)
        # lanes that have seen only -inf keep s = 0 instead of NaN
        scale = tl.where(new_m == -float("inf"), 0.0, tl.exp2((m - new_m) * 1.4426950408889634))
        s = s * scale + tl.where(x == -float("inf"), 0.0, tl.exp2((x - new_m) * 1.4426950408889634))
        m = new_m
    row_m = tl.max(m, axis=0)
    lane_scale = tl.where(m == -float("inf"), 0.0, tl.exp2((m - row_m) * 1.4426950408889634))
    tl.store(m_ptr + row, row_m)
    tl.store(s_ptr + row, tl.sum(s * lane_scale, axis=0))


@triton.jit
def _normalize(x_ptr, y_ptr, m_ptr, s_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    col = tl.program_id(1)
    offs = col * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + row)
    s = tl.load(s_ptr + row)
    y = tl.exp2((x - m) * 1.4426950408889634) / s
    tl.store(y_ptr + row * n_cols + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x):
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    m = torch.empty(rows, dtype=torch.float32, device=x.device)
    s = torch.empty(rows, dtype=torch.float32, device=x.device)
    block = min(1024, triton.next_power_of_2(n))
    _stats[(rows,)](x2, m, s, n, x2.stride(0), BLOCK=block)
    _normalize[(rows, triton.cdiv(n, block))](x2, y, m, s, n, x2.stride(0), BLOCK=block)
    return y.view(x.shape)
