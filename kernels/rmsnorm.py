"""RMSNorm family: y = x * rsqrt(mean(x^2, last dim) + eps) * weight.

x has any number of leading dims and is viewed as [N, D] (N = product of the leading dims);
weight is [D]. The op must read x once and write y once, plus one read of weight:
2*N*D*itemsize + D*itemsize bytes. It is memory bound at every LLM shape (4 flops per element),
so the search is about how rows map onto programs and how well loads stream.

Search space (``SPACE``), rendered by ``render`` into one self-contained candidate source:
- variant "one_pass": a program holds whole rows in registers (BLOCK = next_pow2(D), chosen at
  launch); reads x exactly once. Falls back to the chunked kernel when next_pow2(D) > 65536
  (a bigger register tile would not compile well), so it is correct for any D.
- variant "chunked": loop over column chunks of BLOCK_D; pass 1 accumulates the sum of squares,
  pass 2 re-reads x (mostly from L2), normalizes and writes. Bounded registers for wide rows.
- rows_per_prog: a program handles a [ROWS, BLOCK] tile (narrow rows: more work per program).
  The tile is capped at 65536 elements; ROWS is halved at launch until it fits.
- grid "rows" (one tile per program) or "persistent" (programs = SMs * progs_per_sm, each walks
  tiles pid, pid+P, ...; the weight is loaded once per program in one_pass).
- num_warps, num_stages (software pipelining of the chunk loop), block_d (chunk width),
  cache_hints (evict_last on data read again, evict_first on data read for the last time).
Parameters that do not apply to a point render the same source (block_d/num_stages with
one_pass except for its wide-row fallback; progs_per_sm with grid "rows").
Launch-time clamps keep every point valid on the GPU: a program's register tile is at most
65536 elements (ROWS halves until it fits) and num_stages drops until the (stages - 1)
pipelined load buffers fit 48 KB of shared memory (a 4-stage fp32 [8, 4096] loop would ask
for 384 KB and fail to launch).
"""
from __future__ import annotations

import torch

from kernels import Family
from kernels import _common as C

NAME = "rmsnorm"
SIGNATURE = "kernel_fn(x, weight, eps)"
ARG_NAMES = ("x", "weight", "eps")
ADVERSARIAL = ("huge", "tiny", "mixed_scale", "constant_rows", "heavy_tail")


def reference(x, weight, eps):
    """The formula models write (Llama, Mistral, ...), eager PyTorch."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------

def make_inputs(shape, dtype, device, gen, kind="normal"):
    """{x: [*shape], weight: [D], eps} with fresh random values from ``gen``."""
    dtype = C.as_dtype(dtype)
    d = int(shape[-1])
    x = C.norm_input(shape, dtype, gen, kind)
    w = 1.0 + 0.1 * C.randn(gen, d)
    return {"x": x.to(dtype).to(device), "weight": w.to(dtype).to(device), "eps": 1e-6}


# |out - expected| <= atol + rtol * |expected|, expected = fp64 reference cast to the output dtype.
# fp16/bf16: the output rounding alone is up to 1 ulp (2^-10 resp. 2^-7 relative), so rtol is
# about twice that; fp32: the fp32 sum of squares and rsqrt are good to a few 1e-7.
TOLERANCE = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-4, 2e-3),
    torch.bfloat16: (1e-3, 1.6e-2),
}


def cost(shape, dtype):
    """(bytes, flops): read x and weight once, write y once; x*x, +, *rstd, *w per element."""
    item = C.itemsize(dtype)
    n, d = C.rows_and_cols(shape)
    return 2 * n * d * item + d * item, 4 * n * d + 2 * n


BENCH_SHAPES = ((16384, 4096), (4096, 4096), (2048, 768), (8, 2048, 4096),
                (1000, 1000), (3, 5000), (4097, 1023))
SWEEP_SHAPES = ((1, 1), (2, 3), (7, 1000), (33, 257), (3, 4097), (5, 3, 129), (256, 8192),
                (64, 65536), (2, 100000))
EDGE_SHAPES = ((1, 1), (1, 4096), (97, 127), (13, 1031), (4099, 7), (65537, 8))


# ---------------------------------------------------------------------------------------------
# search space and rendering
# ---------------------------------------------------------------------------------------------

SPACE = {
    "variant": ["one_pass", "chunked"],
    "rows_per_prog": [1, 2, 4, 8],
    "num_warps": [1, 2, 4, 8, 16],
    "num_stages": [1, 2, 3, 4],
    "block_d": [1024, 2048, 4096, 8192],
    "grid": ["rows", "persistent"],
    "progs_per_sm": [1, 2, 4, 8],
    "cache_hints": [False, True],
}
DEFAULT = {"variant": "one_pass", "rows_per_prog": 1, "num_warps": 4, "num_stages": 1,
           "block_d": 4096, "grid": "rows", "progs_per_sm": 4, "cache_hints": False}


_ARGS = ("x_ptr, w_ptr, y_ptr, N, D, stride_xn, eps, num_tiles,\n"
         "        ROWS: tl.constexpr")


def _one_pass_kernel(p):
    keep, stream = C.cache_hints(p["cache_hints"])
    doc = '''
"""Tile [ROWS, BLOCK] (BLOCK = next_pow2(D)): ROWS whole rows live in registers, so x is read
exactly once. Masked lanes load 0 and add nothing to the sum of squares."""'''
    prologue = f'''
cols = tl.arange(0, BLOCK)                                          # [BLOCK]
col_mask = cols < D
# weight [D] is the same for every row: one load per program, kept in fp32 registers
w = tl.load(w_ptr + cols, mask=col_mask, other=0.0{keep}).to(tl.float32)'''
    body = f'''
rows = (tile * ROWS + tl.arange(0, ROWS)).to(tl.int64)             # [ROWS]; int64: rows*stride may pass 2^31
mask = (rows < N)[:, None] & col_mask[None, :]                     # [ROWS, BLOCK]
x = tl.load(x_ptr + rows[:, None] * stride_xn + cols[None, :], mask=mask, other=0.0{stream}).to(tl.float32)
# fp32 accumulation: an fp16 value above 256 has a square beyond fp16's 65504
ms = tl.sum(x * x, axis=1) / D                                     # [ROWS] mean of squares
rstd = tl.math.rsqrt(ms + eps)                                     # [ROWS]
y = x * rstd[:, None] * w[None, :]                                 # same order as the reference
tl.store(y_ptr + rows[:, None] * D + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)'''
    return C.tiled_kernel("_rmsnorm_one_pass", _ARGS + ", BLOCK: tl.constexpr", doc, prologue,
                          body, p["grid"] == "persistent")


def _chunked_kernel(p):
    keep, stream = C.cache_hints(p["cache_hints"])
    doc = '''
"""Tile [ROWS, BLOCK_D] sliding along D: pass 1 sums squares chunk by chunk (a per-lane fp32
accumulator, reduced once at the end), pass 2 re-reads x, normalizes and writes.
Reads x twice (the second time mostly from L2) and weight once per tile."""'''
    body = f'''
rows = (tile * ROWS + tl.arange(0, ROWS)).to(tl.int64)             # [ROWS]
row_mask = rows < N
x_row = x_ptr + rows[:, None] * stride_xn                          # [ROWS, 1] row starts
y_row = y_ptr + rows[:, None] * D
acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
for start in tl.range(0, D, BLOCK_D, num_stages=NUM_STAGES):
    cols = start + tl.arange(0, BLOCK_D)
    mask = row_mask[:, None] & (cols < D)[None, :]
    x = tl.load(x_row + cols[None, :], mask=mask, other=0.0{keep}).to(tl.float32)
    acc += x * x
rstd = tl.math.rsqrt(tl.sum(acc, axis=1) / D + eps)                # [ROWS]
for start in tl.range(0, D, BLOCK_D, num_stages=NUM_STAGES):
    cols = start + tl.arange(0, BLOCK_D)
    col_mask = cols < D
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(x_row + cols[None, :], mask=mask, other=0.0{stream}).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0{keep}).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)'''
    return C.tiled_kernel("_rmsnorm_chunked",
                          _ARGS + ", BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr",
                          doc, "", body, p["grid"] == "persistent")


def _launcher(p):
    one_pass = p["variant"] == "one_pass"
    if p["grid"] == "persistent":
        grid = "(min(num_tiles, _num_sms(x.device) * PROGS_PER_SM),)  # persistent programs"
    else:
        grid = "(num_tiles,)  # one tile per program"
    lines = ['''

def kernel_fn(x, weight, eps):
    """RMSNorm over the last dim of x [..., D] with weight [D]; returns y shaped like x."""
    D = x.shape[-1]
    out_shape = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()               # kernels assume unit stride along D; any row stride works
    x2 = x.reshape(-1, D)                # [N, D]: a view whenever the leading dims can merge
    N = x2.shape[0]
    w = weight.contiguous()              # [D]
    out_dtype = x.dtype if weight.dtype == x.dtype else torch.float32  # mixed inputs promote
    y = torch.empty((N, D), dtype=out_dtype, device=x.device)
    if N == 0 or D == 0:
        return y.reshape(out_shape)
    block = triton.next_power_of_2(D)''']
    lines.append(C.select_src("_rmsnorm_one_pass" if one_pass else None, "_rmsnorm_chunked"))
    lines.append(f'''    num_tiles = triton.cdiv(N, rows)
    grid = {grid}
    kernel[grid](x2, w, y, N, D, x2.stride(0), float(eps), num_tiles, **meta,
                 num_warps=NUM_WARPS, num_stages=stages)
    return y.reshape(out_shape)
''')
    return "\n".join(lines)


def render(params) -> str:
    """Complete candidate source for one point of SPACE (missing params take DEFAULT values)."""
    p = C.resolve(NAME, SPACE, DEFAULT, params)
    one_pass = p["variant"] == "one_pass"
    persistent = p["grid"] == "persistent"
    if one_pass:
        traffic = ("reads x once and writes y once (2*N*D*itemsize) when next_pow2(D) <= 65536;\n"
                   "               wider rows use the chunked kernel, which reads x twice")
    else:
        traffic = ("reads x twice (pass 2 mostly hits L2: a row is D*itemsize bytes) and writes y\n"
                   "               once: up to 3*N*D*itemsize from L2/HBM, 2*N*D*itemsize ideally")
    doc = f'''"""RMSNorm candidate ({p["variant"]}, {p["grid"]} grid): y = x * rsqrt(mean(x^2) + eps) * weight.

x [..., D] is viewed as [N, D] (leading dims merged; any row stride, unit column stride);
weight [D]; y [N, D] is written contiguous in x's dtype. Sums of squares accumulate in fp32.
Bytes the op must move: 2*N*D*itemsize + D*itemsize (read x, write y, read weight).
This variant {traffic}.
Point: {C.point_line(SPACE, p)}
"""
{C.IMPORTS_SRC}
ROWS_PER_PROG = {p["rows_per_prog"]}   # rows per program tile (halved at launch to fit MAX_TILE)
BLOCK_D = {p["block_d"]}        # chunk width of the chunked loop
NUM_WARPS = {p["num_warps"]}
NUM_STAGES = {p["num_stages"]}       # software-pipelining depth of the chunk loops
PROGS_PER_SM = {p["progs_per_sm"]}     # persistent grid only
'''
    parts = [doc, C.FIT_ROWS_SRC]
    if persistent:
        parts.append(C.NUM_SMS_SRC)
    parts.append("\n")
    if one_pass:
        parts.append(_one_pass_kernel(p) + "\n")
    parts.append(_chunked_kernel(p))
    parts.append(_launcher(p))
    return C.tidy("\n".join(parts))


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
    description="RMSNorm over the last dim: x * rsqrt(mean(x^2) + eps) * weight (Llama-style).",
    notes={"one_pass_max_block": 65536, "max_tile_elems": 65536},
)
