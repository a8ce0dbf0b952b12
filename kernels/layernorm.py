"""LayerNorm family: y = (x - mean(x)) * rsqrt(var(x) + eps) * weight + bias over the last dim.

x has any number of leading dims and is viewed as [N, D]; weight and bias are [D] (either may be
None). The op must read x once and write y once, plus one read of weight and bias:
2*N*D*itemsize + 2*D*itemsize bytes, about 7 flops per element, so it is memory bound.

Numerics: every variant computes the statistics of d = x - x[row, 0] (a per-row shift by the
row's first element; exact when x sits near its mean, as with a large constant offset), the mean
first and then the variance from centered values (or Chan's merge of per-chunk centered sums),
all in fp32. Never E[x^2] - E[x]^2, which cancels catastrophically for offset rows.

Search space (``SPACE``), rendered by ``render`` into one self-contained candidate source:
- variant "one_pass": whole rows in registers (BLOCK = next_pow2(D) at launch), x read once.
  Falls back to the chunked kernel (with ``stats``) when next_pow2(D) > 65536.
- variant "chunked": column chunks of BLOCK_D; ``stats`` picks how the statistics are gathered:
  "two_pass" (a mean loop, a centered-variance loop, a write loop: reads x 3 times) or
  "chunk_merge" (one loop computing each chunk's mean and centered M2 and merging them with
  Chan's formula, then the write loop: reads x twice).
- split: "auto" splits each row over several programs when there are fewer rows than SMs
  (LayerNorm over three trailing dims of [16, 64, 256, 256]: 16 rows of 4M elements would
  keep 16 of 132 SMs busy): a first kernel gathers each chunk's (n, mean, M2), a second merges
  a row's chunks (Chan's parallel formula) and writes its chunk of y. Reads x twice. "never"
  keeps one program per row.
- rows_per_prog, grid ("rows" | "persistent" with progs_per_sm), num_warps, num_stages,
  block_d, cache_hints: as in rmsnorm. A tile [ROWS, BLOCK] is capped at 65536 elements.
Parameters that do not apply to a point render the same source (block_d/num_stages/stats with
one_pass except for its wide-row fallback; progs_per_sm with grid "rows").
Launch-time clamps keep every point valid on the GPU: a program's register tile is at most
65536 elements (ROWS halves until it fits) and num_stages drops until the (stages - 1)
pipelined load buffers fit 48 KB of shared memory (a 4-stage fp32 [8, 4096] loop would ask
for 384 KB and fail to launch).

Contract ``residual: true`` (a residual add the norm reads, fused; last dim only):
kernel_fn(x, residual, weight, bias, eps) returns [h; y] stacked, [2, *x.shape], h = x +
residual rounded to x's dtype (as the model's add stores it) and y the LayerNorm of h; the
same row kernels (never split) read both terms and write h beside y (4*N*D*itemsize +
2*D*itemsize bytes).
"""
from __future__ import annotations

import dataclasses
import itertools

import torch
import torch.nn.functional as F

from kernels import Family
from kernels import _common as C
from kernels.patterns import Fit, NoFit, Ref, residual_fit, Scalar, Spelling, T, from_end, trailing_run

NAME = "layernorm"
SIGNATURE = "kernel_fn(x, weight, bias, eps)"
ARG_NAMES = ("x", "weight", "bias", "eps")
ADVERSARIAL = C.NORM_KINDS  # huge, tiny, mixed_scale, constant_rows, heavy_tail


def reference(x, weight, bias, eps):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def make_inputs(shape, dtype, device, gen, kind="normal"):
    """{x: [*shape], weight: [D], bias: [D], eps} with fresh random values from ``gen``."""
    dtype = C.as_dtype(dtype)
    d = int(shape[-1])
    x = C.norm_input(shape, dtype, gen, kind)
    w = 1.0 + 0.1 * C.randn(gen, d)
    b = 0.1 * C.randn(gen, d)
    return {"x": x.to(dtype).to(device), "weight": w.to(dtype).to(device),
            "bias": b.to(dtype).to(device), "eps": 1e-5}


# |out - expected| <= atol + rtol * |expected|, expected = fp64 reference cast to the output dtype.
# fp16/bf16: output rounding is up to 1 ulp (2^-10 resp. 2^-7 relative); rtol is about twice that.
# fp32: a textbook two-pass kernel (mean, then centered variance, no shift) loses about
# |mean|/std * 1e-7 * log2(D) to the rounding of the mean: ~1e-4 on "mixed_scale" rows
# (offset/std = 1000) and on "constant_rows"; atol/rtol 1e-3 let such a correct kernel pass while
# E[x^2] - E[x]^2, even accumulated in fp32, is off by tens of percent there.
TOLERANCE = {
    torch.float32: (1e-3, 1e-3),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
}


def cost(shape, dtype):
    """(bytes, flops): read x, weight, bias once, write y once; per element: +mean, -mean,
    square, +var, *rstd, *w, +b."""
    item = C.itemsize(dtype)
    n, d = C.rows_and_cols(shape)
    return 2 * n * d * item + 2 * d * item, 7 * n * d + 4 * n


BENCH_SHAPES = ((16384, 4096), (4096, 4096), (8192, 4096), (2048, 768), (8, 2048, 4096),
                (1000, 1000), (3, 5000), (4097, 1023))
SWEEP_SHAPES = ((1, 1), (2, 3), (7, 1000), (33, 257), (3, 4097), (5, 3, 129), (256, 8192),
                (64, 65536), (2, 100000))
EDGE_SHAPES = ((1, 1), (1, 4096), (97, 127), (13, 1031), (4099, 7), (65537, 8))


# ---------------------------------------------------------------------------------------------
# search space and rendering
# ---------------------------------------------------------------------------------------------

SPACE = {
    "variant": ["one_pass", "chunked"],
    "stats": ["two_pass", "chunk_merge"],
    "rows_per_prog": [1, 2, 4, 8],
    "num_warps": [1, 2, 4, 8, 16],
    "num_stages": [1, 2, 3, 4],
    "block_d": [1024, 2048, 4096, 8192],
    "grid": ["rows", "persistent"],
    "progs_per_sm": [1, 2, 4, 8],
    "cache_hints": [False, True],
    "split": ["auto", "never"],
    "split_order": ["forward", "reverse"],
}
DEFAULT = {"variant": "one_pass", "stats": "two_pass", "rows_per_prog": 1, "num_warps": 4,
           "num_stages": 1, "block_d": 4096, "grid": "rows", "progs_per_sm": 4,
           "cache_hints": False, "split": "auto",
           "split_order": "forward"}

_ARGS = ("x_ptr, w_ptr, b_ptr, y_ptr, N, D, stride_xn, eps, num_tiles,\n"
         "        HAS_W: tl.constexpr, HAS_B: tl.constexpr, ROWS: tl.constexpr")


def _one_pass_kernel(p):
    keep, stream = C.cache_hints(p["cache_hints"])
    doc = '''
"""Tile [ROWS, BLOCK] (BLOCK = next_pow2(D)): ROWS whole rows in registers, x read once.
Statistics of d = x - x[row, 0]: mean first, then the variance of the centered values."""'''
    prologue = f'''
cols = tl.arange(0, BLOCK)                                          # [BLOCK]
col_mask = cols < D
# weight and bias [D] are the same for every row: one load per program, fp32 registers
if HAS_W:
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0{keep}).to(tl.float32)
if HAS_B:
    b = tl.load(b_ptr + cols, mask=col_mask, other=0.0{keep}).to(tl.float32)'''
    body = f'''
rows = (tile * ROWS + tl.arange(0, ROWS)).to(tl.int64)             # [ROWS]; int64: rows*stride may pass 2^31
row_mask = rows < N
mask = row_mask[:, None] & col_mask[None, :]                       # [ROWS, BLOCK]
x_row = x_ptr + rows[:, None] * stride_xn                          # [ROWS, 1]
x = tl.load(x_row + cols[None, :], mask=mask, other=0.0{stream}).to(tl.float32)
shift = tl.load(x_row, mask=row_mask[:, None], other=0.0).to(tl.float32)   # [ROWS, 1] x[row, 0]
d = tl.where(mask, x - shift, 0.0)
mean_d = tl.sum(d, axis=1) / D                                     # [ROWS]
xc = tl.where(mask, d - mean_d[:, None], 0.0)                      # x - mean(x), 0 off the row
var = tl.sum(xc * xc, axis=1) / D                                  # [ROWS] biased, like torch
rstd = tl.math.rsqrt(var + eps)
y = xc * rstd[:, None]
if HAS_W:
    y = y * w[None, :]
if HAS_B:
    y = y + b[None, :]
tl.store(y_ptr + rows[:, None] * D + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)'''
    return C.tiled_kernel("_layernorm_one_pass", _ARGS + ", BLOCK: tl.constexpr", doc,
                          prologue, body, p["grid"] == "persistent")


def _chunked_kernel(p):
    keep, stream = C.cache_hints(p["cache_hints"])
    head = f'''
rows = (tile * ROWS + tl.arange(0, ROWS)).to(tl.int64)             # [ROWS]
row_mask = rows < N
x_row = x_ptr + rows[:, None] * stride_xn                          # [ROWS, 1] row starts
y_row = y_ptr + rows[:, None] * D
shift = tl.load(x_row, mask=row_mask[:, None], other=0.0).to(tl.float32)   # [ROWS, 1] x[row, 0]'''
    if p["stats"] == "two_pass":
        doc = '''
"""Tile [ROWS, BLOCK_D] sliding along D, three loops: sum of d = x - x[row, 0] (mean), sum of
(d - mean)^2 (variance), then normalize and write. Reads x three times (twice mostly from L2)."""'''
        stats = f'''
acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
for start in tl.range(0, D, BLOCK_D, num_stages=NUM_STAGES):
    cols = start + tl.arange(0, BLOCK_D)
    mask = row_mask[:, None] & (cols < D)[None, :]
    x = tl.load(x_row + cols[None, :], mask=mask, other=0.0{keep}).to(tl.float32)
    acc += tl.where(mask, x - shift, 0.0)
mean_d = tl.sum(acc, axis=1) / D                                   # [ROWS] mean of d
acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
for start in tl.range(0, D, BLOCK_D, num_stages=NUM_STAGES):
    cols = start + tl.arange(0, BLOCK_D)
    mask = row_mask[:, None] & (cols < D)[None, :]
    x = tl.load(x_row + cols[None, :], mask=mask, other=0.0{keep}).to(tl.float32)
    xc = tl.where(mask, (x - shift) - mean_d[:, None], 0.0)
    acc += xc * xc
var = tl.sum(acc, axis=1) / D                                      # [ROWS] biased, like torch'''
    else:
        doc = '''
"""Tile [ROWS, BLOCK_D] sliding along D, two loops. Loop 1: per chunk, the mean of
d = x - x[row, 0] and the centered sum of squares M2, merged into the running (n, mean, M2) with
Chan's formula (no cancellation). Loop 2: normalize and write. Reads x twice."""'''
        stats = f'''
n = 0.0                                                            # elements merged so far
mean_d = tl.zeros([ROWS], dtype=tl.float32)
m2 = tl.zeros([ROWS], dtype=tl.float32)
for start in tl.range(0, D, BLOCK_D, num_stages=NUM_STAGES):
    cols = start + tl.arange(0, BLOCK_D)
    mask = row_mask[:, None] & (cols < D)[None, :]
    x = tl.load(x_row + cols[None, :], mask=mask, other=0.0{keep}).to(tl.float32)
    d = tl.where(mask, x - shift, 0.0)
    cnt = tl.minimum(D - start, BLOCK_D).to(tl.float32)            # valid columns in this chunk
    c_mean = tl.sum(d, axis=1) / cnt                               # [ROWS]
    dc = tl.where(mask, d - c_mean[:, None], 0.0)
    c_m2 = tl.sum(dc * dc, axis=1)
    n_new = n + cnt
    delta = c_mean - mean_d
    mean_d = mean_d + delta * (cnt / n_new)
    m2 = m2 + c_m2 + delta * delta * (n * cnt / n_new)
    n = n_new
var = m2 / D                                                       # [ROWS] biased, like torch'''
    write = f'''
rstd = tl.math.rsqrt(var + eps)                                    # [ROWS]
for start in tl.range(0, D, BLOCK_D, num_stages=NUM_STAGES):
    cols = start + tl.arange(0, BLOCK_D)
    col_mask = cols < D
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(x_row + cols[None, :], mask=mask, other=0.0{stream}).to(tl.float32)
    y = ((x - shift) - mean_d[:, None]) * rstd[:, None]
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=col_mask, other=0.0{keep}).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(b_ptr + cols, mask=col_mask, other=0.0{keep}).to(tl.float32)[None, :]
    tl.store(y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)'''
    body = head + "\n" + stats.strip("\n") + "\n" + write.strip("\n")
    return C.tiled_kernel("_layernorm_chunked",
                          _ARGS + ", BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr",
                          doc, "", body, p["grid"] == "persistent")


def _split_kernels(p):
    keep, stream = C.cache_hints(p["cache_hints"])
    # the second pass walks the chunks in reverse: the last chunks the first pass read are the
    # ones still in L2 (50 MB on an H200, of a 268 MB input)
    pid = ("tl.num_programs(0) - 1 - tl.program_id(0)   # the chunks the first pass read last, first"
           if p["split_order"] == "reverse" else "tl.program_id(0)")
    return f'''

@triton.jit
def _layernorm_split_stats(x_ptr, part_ptr, D, stride_xn, S, CHUNK,
                           BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Program (row, s) of N * S: (n, mean, M2) of d = x - x[row, 0] over its chunk
    [s * CHUNK, min((s + 1) * CHUNK, D)), BLOCK_D columns at a time merged with Chan's formula;
    written to part[row, s, 0:3] (fp32)."""
    pid = tl.program_id(0)
    row = (pid // S).to(tl.int64)
    s = pid % S
    x_row = x_ptr + row * stride_xn
    shift = tl.load(x_row).to(tl.float32)                              # x[row, 0]
    lo = s * CHUNK
    hi = tl.minimum(lo + CHUNK, D)
    n = 0.0
    mean = 0.0
    m2 = 0.0
    for start in tl.range(lo, hi, BLOCK_D, num_stages=NUM_STAGES):
        cols = start + tl.arange(0, BLOCK_D)
        mask = cols < hi
        d = tl.where(mask, tl.load(x_row + cols, mask=mask, other=0.0{keep}).to(tl.float32) - shift, 0.0)
        cnt = tl.minimum(hi - start, BLOCK_D).to(tl.float32)
        c_mean = tl.sum(d, axis=0) / cnt
        dc = tl.where(mask, d - c_mean, 0.0)
        n_new = n + cnt
        delta = c_mean - mean
        mean = mean + delta * (cnt / n_new)
        m2 = m2 + tl.sum(dc * dc, axis=0) + delta * delta * (n * cnt / n_new)
        n = n_new
    tl.store(part_ptr + pid * 3, n)
    tl.store(part_ptr + pid * 3 + 1, mean)
    tl.store(part_ptr + pid * 3 + 2, m2)


@triton.jit
def _layernorm_split_apply(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, D, stride_xn, S, CHUNK, eps,
                           HAS_W: tl.constexpr, HAS_B: tl.constexpr, S_BLOCK: tl.constexpr,
                           BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Program (row, s): merge the row's S partials (n_i, mean_i, M2_i) into its mean and
    variance (mean = sum n_i mean_i / n; M2 = sum M2_i + sum n_i (mean_i - mean)^2), then
    normalize chunk s of the row and write it."""
    pid = {pid}
    row = (pid // S).to(tl.int64)
    s = pid % S
    idx = tl.arange(0, S_BLOCK)
    pm = idx < S
    part = part_ptr + row * S * 3 + idx * 3
    cn = tl.load(part, mask=pm, other=0.0)
    cm = tl.load(part + 1, mask=pm, other=0.0)
    c2 = tl.load(part + 2, mask=pm, other=0.0)
    n = tl.sum(cn, axis=0)
    mean_d = tl.sum(cn * cm, axis=0) / n
    dm = tl.where(pm, cm - mean_d, 0.0)
    var = (tl.sum(c2, axis=0) + tl.sum(cn * dm * dm, axis=0)) / D     # biased, like torch
    rstd = tl.math.rsqrt(var + eps)
    x_row = x_ptr + row * stride_xn
    y_row = y_ptr + row * D
    shift = tl.load(x_row).to(tl.float32)
    lo = s * CHUNK
    hi = tl.minimum(lo + CHUNK, D)
    for start in tl.range(lo, hi, BLOCK_D, num_stages=NUM_STAGES):
        cols = start + tl.arange(0, BLOCK_D)
        mask = cols < hi
        x = tl.load(x_row + cols, mask=mask, other=0.0{stream}).to(tl.float32)
        y = ((x - shift) - mean_d) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
'''


_SPLIT_LAUNCH = '''
    if SPLIT == "auto" and N < _num_sms(x.device) and D > 4 * BLOCK_D:
        # fewer rows than SMs: each row over S programs, about PROGS_PER_SM per SM in all
        S = min(_cdiv(_num_sms(x.device) * PROGS_PER_SM, N), _cdiv(D, BLOCK_D), 1024)
        chunk = _cdiv(_cdiv(D, S), BLOCK_D) * BLOCK_D     # a whole number of tiles
        S = _cdiv(D, chunk)                                      # no empty chunk
        part = torch.empty((N, S, 3), dtype=torch.float32, device=x.device)
        stages = _fit_stages(NUM_STAGES, 3 * BLOCK_D * x2.dtype.itemsize)
        _layernorm_split_stats[(N * S,)](x2, part, D, x2.stride(0), S, chunk, BLOCK_D=BLOCK_D,
                                         NUM_STAGES=stages, num_warps=NUM_WARPS)
        _layernorm_split_apply[(N * S,)](x2, w, b, y, part, D, x2.stride(0), S, chunk, float(eps),
                                         has_w, has_b, S_BLOCK=_pow2(S),
                                         BLOCK_D=BLOCK_D, NUM_STAGES=stages, num_warps=NUM_WARPS)
        return y.reshape(out_shape)
'''


def _launcher(p):
    if p["grid"] == "persistent":
        grid = "(min(num_tiles, _num_sms(x.device) * PROGS_PER_SM),)  # persistent programs"
    else:
        grid = "(num_tiles,)  # one tile per program"
    select = C.select_src("_layernorm_one_pass" if p["variant"] == "one_pass" else None,
                          "_layernorm_chunked")
    split = _SPLIT_LAUNCH.lstrip("\n") if p["split"] == "auto" else ""
    return f'''

def kernel_fn(x, weight, bias, eps):
    """LayerNorm over the last dim of x [..., D]; weight, bias [D] or None; y shaped like x."""
    D = x.shape[-1]
    out_shape = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()               # kernels assume unit stride along D; any row stride works
    x2 = x.reshape(-1, D)                # [N, D]: a view whenever the leading dims can merge
    N = x2.shape[0]
    has_w, has_b = weight is not None, bias is not None
    w = weight.contiguous() if has_w else x2   # x2 stands in for a missing pointer (never read)
    b = bias.contiguous() if has_b else x2
    y = torch.empty((N, D), dtype=x.dtype, device=x.device)
    if N == 0 or D == 0:
        return y.reshape(out_shape)
    block = _pow2(D)
{split}{select}
    num_tiles = _cdiv(N, rows)
    grid = {grid}
    kernel[grid](x2, w, b, y, N, D, x2.stride(0), float(eps), num_tiles, has_w, has_b, **meta,
                 num_warps=NUM_WARPS, num_stages=stages)
    return y.reshape(out_shape)
'''


# ---------------------------------------------------------------------------------------------
# the fused residual add (spec {"residual": true}): h = x + r, y = LayerNorm(h); out = [h; y]
# ---------------------------------------------------------------------------------------------
# GPT-2 (ln_2 after the attention's residual add, ln_1 and ln_f after the MLP's) and BERT
# (LayerNorm(dense(h) + input)) normalize a residual sum. The row kernels of SPACE, turned by
# text: the first read of a row chunk reads x and r and writes h = x + r (rmsnorm's
# residual_sum_src: rounded as the model's own add stores it); the shift is h[row, 0] made the
# same way; later loops re-read h (the program's own stores, made visible by a barrier).

_RES_ARGS = ("x_ptr, r_ptr, w_ptr, b_ptr, h_ptr, y_ptr, N, D, stride_xn, stride_rn, eps, "
             "num_tiles,\n        HAS_W: tl.constexpr, HAS_B: tl.constexpr, ROWS: tl.constexpr")
_SHIFT = "shift = tl.load(x_row, mask=row_mask[:, None], other=0.0).to(tl.float32)"
_RES_SHIFT = ("shift = (tl.load(x_row, mask=row_mask[:, None], other=0.0).to(tl.float32)\n"
              "         + tl.load(r_row, mask=row_mask[:, None], other=0.0).to(tl.float32)"
              ").to(h_ptr.dtype.element_ty).to(tl.float32)")
_ROWS_AT = "x_row = x_ptr + rows[:, None] * stride_xn"


def _residual_kernel(src: str) -> str:
    """A row kernel's source (one pass or chunked) reading x + r instead of x: see above."""
    assert _ARGS in src
    lines = src.replace(_ARGS, _RES_ARGS).split("\n")
    out, loads, loops = [], 0, 0
    for line in lines:
        body, ind = line.strip(), line[:len(line) - len(line.lstrip())]
        if body.startswith(_ROWS_AT):
            out.append(line)
            out.append(f"{ind}r_row = r_ptr + rows[:, None] * stride_rn")
            out.append(f"{ind}h_row = h_ptr + rows[:, None] * D")
            continue
        if body.startswith(_SHIFT):
            out.extend(ind + x for x in _RES_SHIFT.split("\n"))
            out[-1] += body[len(_SHIFT):].replace("x[row, 0]", "h[row, 0]")
            continue
        if body.startswith("for start in"):
            loops += 1
            if loops == 2:
                out.append(f"{ind}tl.debug_barrier()   # h's stores before the next loop reads them")
        if body.startswith("x = tl.load(x_row + cols[None, :]"):
            loads += 1
            if loads == 1:
                hint = body[body.index("other=0.0") + len("other=0.0"):body.index(").to(")]
                out.extend(ind + x for x in C.residual_sum_src(
                    "mask", "x_row", "r_row", "h_row", "cols[None, :]", hint).strip("\n").split("\n"))
                continue
            line = line.replace("tl.load(x_row + cols[None, :]", "tl.load(h_row + cols[None, :]")
        out.append(line)
    return "\n".join(out)


def _residual_launcher(p):
    return C.residual_launcher_src(
        p, "_layernorm_one_pass" if p["variant"] == "one_pass" else None, "_layernorm_chunked",
        "weight, bias, eps",
        "h = x + residual (same shape and dtype), then LayerNorm of h over the last dim; weight,\n"
        "    bias [D] in x's dtype or None; returns out [2, *x.shape] in x's dtype: out[0] = h,\n"
        "    out[1] = the normed h.",
        "has_w, has_b = weight is not None, bias is not None\n"
        "w = weight.contiguous() if has_w else x2   # x2 stands in for a missing pointer (never read)\n"
        "b = bias.contiguous() if has_b else x2", "w, b", "has_w, has_b, ")


def render_residual(params) -> str:
    """Complete candidate source of the fused residual add + LayerNorm (spec {"residual":
    true}) for one point of SPACE (rows never split: ``split`` renders nothing here)."""
    p = C.resolve(NAME, SPACE, DEFAULT, params)
    doc = f'''"""Fused residual add + LayerNorm candidate ({p["variant"]}, {p["grid"]} grid):
h = x + r; y = (h - mean) * rsqrt(var + eps) * weight + bias over the last dim; returns [h; y]
stacked ([2, *x.shape]).

x, r [..., D] are viewed as [N, D] (leading dims merged; any row stride, unit column stride);
h is rounded to x's dtype before the norm reads it, as the model's own add stores it.
Statistics in fp32 on h shifted by its row's first element, mean before variance.
Bytes the op must move: 4*N*D*itemsize + 2*D*itemsize (read x and r, write h and y, read
weight and bias); the unfused add and norm move 5*N*D*itemsize (the norm reads h back).
Point: {C.point_line(SPACE, p)}
"""
{C.IMPORTS_SRC}
{C.row_constants_src(p, 'chunked loops')}'''
    parts = [doc, C.FIT_ROWS_SRC]
    if p["grid"] == "persistent":
        parts.append(C.NUM_SMS_SRC)
    parts.append("\n")
    if p["variant"] == "one_pass":
        parts.append(_residual_kernel(_one_pass_kernel(p)) + "\n")
    parts.append(_residual_kernel(_chunked_kernel(p)))
    parts.append(_residual_launcher(p))
    return C.tidy("\n".join(parts))


def render_rows(params) -> str:
    """Complete candidate source for one point of SPACE (missing params take DEFAULT values)."""
    p = C.resolve(NAME, SPACE, DEFAULT, params)
    one_pass = p["variant"] == "one_pass"
    passes = 3 if p["stats"] == "two_pass" else 2
    if one_pass:
        traffic = ("reads x once and writes y once (2*N*D*itemsize) when next_pow2(D) <= 65536;\n"
                   f"wider rows use the chunked kernel ({p['stats']}), which reads x {passes} times")
    else:
        traffic = (f"reads x {passes} times ({p['stats']}; the re-reads mostly hit L2: a row is\n"
                   "D*itemsize bytes) and writes y once")
    doc = f'''"""LayerNorm candidate ({p["variant"]}, {p["grid"]} grid):
y = (x - mean) * rsqrt(var + eps) * weight + bias over the last dim.

x [..., D] is viewed as [N, D] (leading dims merged; any row stride, unit column stride);
weight, bias [D] (or None); y [N, D] is written contiguous in x's dtype. Statistics are taken
in fp32 on x shifted by its row's first element, mean before variance (no E[x^2] - E[x]^2).
Bytes the op must move: 2*N*D*itemsize + 2*D*itemsize (read x, write y, read weight and bias).
This variant {traffic}.
Point: {C.point_line(SPACE, p)}
"""
{C.IMPORTS_SRC}
{C.row_constants_src(p, 'chunked loops', 'persistent grid; split rows: programs per SM')}SPLIT = "{p["split"]}"       # "auto": rows split over several programs when rows < SMs
'''
    parts = [doc, C.FIT_ROWS_SRC]
    if p["grid"] == "persistent" or p["split"] == "auto":
        parts.append(C.NUM_SMS_SRC)
    parts.append("\n")
    if one_pass:
        parts.append(_one_pass_kernel(p) + "\n")
    parts.append(_chunked_kernel(p))
    if p["split"] == "auto":
        parts.append(_split_kernels(p))
    parts.append(_launcher(p))
    return C.tidy("\n".join(parts))


# ---------------------------------------------------------------------------------------------
# spellings: how model code writes it (kernels/patterns.py)
# ---------------------------------------------------------------------------------------------

# the variance: x.var(unbiased=False), or the mean of the centered squares (HF's old BertLayerNorm)
_VAR = {
    "var": lambda x: x.var(-1, keepdim=True, unbiased=False),
    "centered": lambda x: (x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True),
}
_INV = {"div": lambda c, v, eps: c / torch.sqrt(v + eps),
        "rsqrt": lambda c, v, eps: c * torch.rsqrt(v + eps)}
_AFFINE = ("wb", "w", "none")


def _spelling(var, inv, affine):
    def fn(x, w, b, eps):
        y = _INV[inv](x - x.mean(-1, keepdim=True), _VAR[var](x), eps)
        if affine == "wb":
            return y * w + b
        return y * w if affine == "w" else y
    args = (("x", T((4, 16))), ("w", T((16,)) if affine != "none" else None),
            ("b", T((16,)) if affine == "wb" else None), ("eps", Scalar("eps")))
    return Spelling(f"{var}_{inv}_{affine}", fn, args, free_dims=True)


SPELLINGS = tuple(_spelling(*c) for c in itertools.product(_VAR, _INV, _AFFINE)) + (
    # F.layer_norm / nn.LayerNorm, weight and bias present or not (loose: captured as they are)
    Spelling("layer_norm", lambda x, w, b: F.layer_norm(x, (16,), w, b, 1e-5),
             (("x", T((4, 16))), ("w", T((16,))), ("b", T((16,)))),
             loose=("weight", "bias", "eps", "cudnn_enable")),
)


def _affine_ref(m, name, norm_shape):
    """The weight or bias as the contract takes it ([D]), or None when it is not one value per
    normalized element (leading 1s allowed: [1, 1, D] broadcasts the same)."""
    v = m.meta(name)
    if v is None:
        return None
    ws = tuple(v["shape"])
    while len(ws) > len(norm_shape) and ws[0] == 1:
        ws = ws[1:]
    return Ref(name, (("reshape", [-1]),)) if ws == tuple(norm_shape) else None


def from_match(m):
    """LayerNorm over the matched trailing dims, weight and bias each present or not."""
    x = m.meta("x")
    if x is None or not x["dtype"].is_floating_point:
        return None
    shape = x["shape"]
    if m.pattern.endswith("/layer_norm"):
        k = len(m.op_args("layer_norm")["normalized_shape"])
        dims = tuple(range(-k, 0))
        w_name, b_name = "weight", "bias"
        eps = m.scalar("eps")
    else:
        dims = from_end(m.captures.get("dims", (-1,)), len(shape))
        w_name, b_name = "w", "b"
        eps = m.scalar("eps")
    if not trailing_run(dims):
        raise NoFit(f"layernorm over dims {list(dims)}: not adjacent dims")
    if dims[-1] != -1:
        raise NoFit(f"layernorm over dims {list(dims)}, followed by other dims: the kernels "
                    f"normalize trailing dims")
    if eps is None:
        raise NoFit("eps is not a number known when the graph is captured")
    norm_shape = shape[len(shape) + dims[0]:]
    args = {"x": Ref("x"), "weight": Ref.lit(None), "bias": Ref.lit(None), "eps": Ref.lit(float(eps))}
    spec = {}
    for arg, name in (("weight", w_name), ("bias", b_name)):
        if m.node(name) is None:
            spec[arg] = False
            continue
        ref = _affine_ref(m, name, norm_shape)
        if ref is None or m.meta(name)["dtype"] != x["dtype"]:
            return None                     # not a per-feature affine of x's dtype
        args[arg] = ref
    if len(dims) > 1:
        spec["dims"] = len(dims)
    pair = m.sum_of("x") if len(dims) == 1 else None
    if pair is not None:
        # x is a residual add (GPT-2's h + attn(ln_1(h)), BERT's dense(h) + input): one kernel
        # reads both terms and writes the sum beside the norm, out [2, *shape]
        return residual_fit(m, pair, spec, shape, args)
    return Fit(spec, tuple(shape), args)


# ---------------------------------------------------------------------------------------------
# contracts a match can fix: several trailing dims; weight, bias each optional
# ---------------------------------------------------------------------------------------------

def _reference_for(k):
    def reference(x, weight, bias, eps):
        ns = tuple(x.shape[-k:])
        w = weight.reshape(ns) if weight is not None else None
        b = bias.reshape(ns) if bias is not None else None
        return F.layer_norm(x, ns, w, b, eps)
    return reference


def _inputs_for(k, weight, bias):
    def make(shape, dtype, device, gen, kind="normal"):
        dtype = C.as_dtype(dtype)
        shape = tuple(int(s) for s in shape)
        d = 1
        for s in shape[len(shape) - k:]:
            d *= s
        n = 1
        for s in shape[:len(shape) - k]:
            n *= s
        x = C.norm_input((n, d), dtype, gen, kind).reshape(shape)
        w = (1.0 + 0.1 * C.randn(gen, d)).to(dtype).to(device) if weight else None
        b = (0.1 * C.randn(gen, d)).to(dtype).to(device) if bias else None
        return {"x": x.to(dtype).to(device), "weight": w, "bias": b, "eps": 1e-5}
    return make


def _cost_for(k, weight, bias):
    def cost(shape, dtype):
        item = C.itemsize(dtype)
        shape = tuple(int(s) for s in shape)
        d = 1
        for s in shape[len(shape) - k:]:
            d *= s
        n = 1
        for s in shape[:len(shape) - k]:
            n *= s
        return 2 * n * d * item + (int(weight) + int(bias)) * d * item, 7 * n * d + 4 * n
    return cost


def _render_for(k):
    """The row kernels of SPACE on x flattened to [N, D], D the k normalized dims' elements."""
    def render(params):
        src = render_rows(params).replace("def kernel_fn(x, weight, bias, eps):",
                                          "def _rows(x, weight, bias, eps):")
        return C.tidy(src + f'''

NORM_DIMS = {k}   # the trailing dims normalized together


def kernel_fn(x, weight, bias, eps):
    """LayerNorm over the last NORM_DIMS dims of x; weight, bias [D] (those dims flattened) or None."""
    lead = x.shape[:x.dim() - NORM_DIMS]
    d = 1
    for s in x.shape[x.dim() - NORM_DIMS:]:
        d *= s
    w = weight.reshape(-1) if weight is not None else None
    b = bias.reshape(-1) if bias is not None else None
    return _rows(x.reshape(tuple(lead) + (d,)), w, b, eps).reshape(x.shape)
''')
    return render


def _residual_baseline(x, residual, weight, bias, eps):
    """What the model runs: the add, then the norm of the sum; both results, unstacked."""
    h = x + residual
    return h, F.layer_norm(h, (h.shape[-1],), weight, bias, eps)


def _residual_reference(x, residual, weight, bias, eps):
    """The contract: h = x + residual and y = LayerNorm(h) (_residual_baseline), stacked [h; y]."""
    return torch.stack(_residual_baseline(x, residual, weight, bias, eps))


def _configure_residual(spec: dict, weight: bool, bias: bool) -> Family:
    def cost(shape, dtype):
        nbytes, flops = _cost_for(1, weight, bias)(shape, dtype)
        n, d = C.rows_and_cols(shape)
        return nbytes + 2 * n * d * C.itemsize(dtype), flops + n * d

    what = "with the residual add fused" + ("" if weight else ", no weight") + ("" if bias else ", no bias")
    return dataclasses.replace(
        FAMILY, arg_names=("x", "residual", "weight", "bias", "eps"),
        reference=_residual_reference, baseline=_residual_baseline,
        make_inputs=C.residual_inputs(_inputs_for(1, weight, bias)), cost=cost,
        render=render_residual, signature=f"kernel_fn(x, residual, weight, bias, eps) {what}",
        description=f"LayerNorm over the last dim {what}: h = x + residual; returns [h; LayerNorm(h)] stacked.",
        op_schema="(Tensor x, Tensor residual, Tensor? weight, Tensor? bias, float eps) -> Tensor",
        spec=dict(spec))


def configure(spec: dict) -> Family:
    """LayerNorm over the last ``spec["dims"]`` dims (default 1), with ``spec["weight"]`` and
    ``spec["bias"]`` (default True each: [D], the normalized dims flattened);
    ``spec["residual"]`` (one dim only): the residual add before it fused, [h; y] out."""
    k = int(spec.get("dims", 1))
    weight, bias = bool(spec.get("weight", True)), bool(spec.get("bias", True))
    if set(spec) - {"dims", "weight", "bias", "residual"} or k < 1 or (spec.get("residual") and k != 1):
        raise ValueError(f"layernorm takes a spec {{dims: int >= 1, weight: bool, bias: bool, "
                         f"residual: bool (dims 1 only)}}; got {spec!r}")
    if spec.get("residual"):
        return _configure_residual(spec, weight, bias)
    if k == 1 and weight and bias:
        return FAMILY
    lay = lambda ss: tuple(tuple(s[:-1]) + (s[-1],) + (1,) * (k - 1) for s in ss)  # noqa: E731
    what = (f"over the last {k} dims" if k > 1 else "over the last dim") + \
        ("" if weight else ", no weight") + ("" if bias else ", no bias")
    return dataclasses.replace(
        FAMILY, reference=_reference_for(k), make_inputs=_inputs_for(k, weight, bias),
        cost=_cost_for(k, weight, bias), bench_shapes=lay(BENCH_SHAPES) + (((16, 64, 256, 256),) if k == 3 else ()),
        sweep_shapes=lay(SWEEP_SHAPES), edge_shapes=lay(EDGE_SHAPES),
        render=_render_for(k) if k > 1 else render_rows,
        signature=f"kernel_fn(x, weight, bias, eps) {what}",
        description=f"LayerNorm {what}.", spec=dict(spec))


render = render_rows


FAMILY = Family(
    name=NAME,
    signature=SIGNATURE,
    arg_names=ARG_NAMES,
    reference=reference,
    make_inputs=make_inputs,
    tolerance=TOLERANCE,
    cost=cost,
    bench_shapes=BENCH_SHAPES,
    sweep_shapes=SWEEP_SHAPES,
    edge_shapes=EDGE_SHAPES,
    adversarial=ADVERSARIAL,
    space=SPACE,
    default=DEFAULT,
    render=render,
    spellings=SPELLINGS,
    from_match=from_match,
    op_schema="(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor",
    profile_ops=("aten::layer_norm", "aten::native_layer_norm"),
    description="LayerNorm over the last dim with weight and bias (torch.nn.functional.layer_norm).",
    notes={"one_pass_max_block": 65536, "max_tile_elems": 65536,
           "numerics": "per-row shift by x[row, 0], mean then centered variance, fp32"},
)
