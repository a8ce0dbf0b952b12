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

Contract ``residual: true`` (a residual add the norm reads, fused): kernel_fn(x, residual,
weight, eps) returns [h; y] stacked, [2, *x.shape], h = x + residual rounded to x's dtype (as
the model's add stores it) and y the norm of h; the same row kernels read both terms and write
h beside y (4*N*D*itemsize + D*itemsize bytes).
"""
from __future__ import annotations

import dataclasses
import itertools
import textwrap

import torch

from kernels import Family
from kernels import _common as C
from kernels.patterns import Fit, NoFit, Ref, residual_fit, Scalar, Spelling, T, from_end, odi, trailing_run

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
# the fused residual add's kernels also read r (row stride stride_rn) and write the sum h [N, D]
_RES_ARGS = ("x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, N, D, stride_xn, stride_rn, eps, num_tiles,\n"
             "        ROWS: tl.constexpr")


def _one_pass_kernel(p, residual=False):
    keep, stream = C.cache_hints(p["cache_hints"])
    doc = '''
"""Tile [ROWS, BLOCK] (BLOCK = next_pow2(D)): ROWS whole rows live in registers, so x is read
exactly once. Masked lanes load 0 and add nothing to the sum of squares."""'''
    if residual:
        doc = '''
"""Tile [ROWS, BLOCK] (BLOCK = next_pow2(D)): ROWS whole rows of x and r are read once, their
sum h is written once and normalized from registers. Masked lanes add nothing."""'''
    prologue = f'''
cols = tl.arange(0, BLOCK)                                          # [BLOCK]
col_mask = cols < D
# weight [D] is the same for every row: one load per program, kept in fp32 registers
w = tl.load(w_ptr + cols, mask=col_mask, other=0.0{keep}).to(tl.float32)'''
    if residual:
        load_x = C.residual_sum_src("mask", "x_ptr + rows[:, None] * stride_xn",
                          "r_ptr + rows[:, None] * stride_rn", "h_ptr + rows[:, None] * D",
                          "cols[None, :]", stream).strip("\n")
    else:
        load_x = (f"x = tl.load(x_ptr + rows[:, None] * stride_xn + cols[None, :], mask=mask, "
                  f"other=0.0{stream}).to(tl.float32)")
    body = f'''
rows = (tile * ROWS + tl.arange(0, ROWS)).to(tl.int64)             # [ROWS]; int64: rows*stride may pass 2^31
mask = (rows < N)[:, None] & col_mask[None, :]                     # [ROWS, BLOCK]
{load_x}
# fp32 accumulation: an fp16 value above 256 has a square beyond fp16's 65504
ms = tl.sum(x * x, axis=1) / D                                     # [ROWS] mean of squares
rstd = tl.math.rsqrt(ms + eps)                                     # [ROWS]
y = x * rstd[:, None] * w[None, :]                                 # same order as the reference
tl.store(y_ptr + rows[:, None] * D + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)'''
    return C.tiled_kernel("_rmsnorm_one_pass", (_RES_ARGS if residual else _ARGS)
                          + ", BLOCK: tl.constexpr", doc, prologue, body,
                          p["grid"] == "persistent")


def _chunked_kernel(p, residual=False):
    keep, stream = C.cache_hints(p["cache_hints"])
    if residual:
        return _chunked_residual_kernel(p, keep)
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


def _chunked_residual_kernel(p, keep):
    doc = '''
"""Tile [ROWS, BLOCK_D] sliding along D: pass 1 reads x and r chunk by chunk, writes their sum
h and sums its squares; pass 2 re-reads h (written by this program, mostly from L2: a barrier
between the passes makes its stores visible to every thread of the program), normalizes and
writes y. Reads x and r once, h twice; writes h and y once."""'''
    add = C.residual_sum_src("mask", "x_row", "r_row", "h_row", "cols[None, :]", "")
    body = f'''
rows = (tile * ROWS + tl.arange(0, ROWS)).to(tl.int64)             # [ROWS]
row_mask = rows < N
x_row = x_ptr + rows[:, None] * stride_xn                          # [ROWS, 1] row starts
r_row = r_ptr + rows[:, None] * stride_rn
h_row = h_ptr + rows[:, None] * D
y_row = y_ptr + rows[:, None] * D
acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
for start in tl.range(0, D, BLOCK_D, num_stages=NUM_STAGES):
    cols = start + tl.arange(0, BLOCK_D)
    mask = row_mask[:, None] & (cols < D)[None, :]{textwrap.indent(add, "    ")}
    acc += x * x
rstd = tl.math.rsqrt(tl.sum(acc, axis=1) / D + eps)                # [ROWS]
tl.debug_barrier()                                                 # h's stores before pass 2 reads them
for start in tl.range(0, D, BLOCK_D, num_stages=NUM_STAGES):
    cols = start + tl.arange(0, BLOCK_D)
    col_mask = cols < D
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(h_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0{keep}).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)'''
    return C.tiled_kernel("_rmsnorm_chunked",
                          _RES_ARGS + ", BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr",
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
    block = _pow2(D)''']
    lines.append(C.select_src("_rmsnorm_one_pass" if one_pass else None, "_rmsnorm_chunked"))
    lines.append(f'''    num_tiles = _cdiv(N, rows)
    grid = {grid}
    kernel[grid](x2, w, y, N, D, x2.stride(0), float(eps), num_tiles, **meta,
                 num_warps=NUM_WARPS, num_stages=stages)
    return y.reshape(out_shape)
''')
    return "\n".join(lines)


def _residual_launcher(p):
    return "\n" + C.ONES_SRC + C.residual_launcher_src(
        p, "_rmsnorm_one_pass" if p["variant"] == "one_pass" else None, "_rmsnorm_chunked",
        "weight, eps",
        "h = x + residual (same shape and dtype), then RMSNorm of h over the last dim with weight\n"
        "    [D] in x's dtype (None: none); returns out [2, *x.shape] in x's dtype: out[0] = h,\n"
        "    out[1] = the normed h.",
        "w = weight.contiguous() if weight is not None else _ones(D, x.dtype, x.device)", "w")


def render_residual(params) -> str:
    """Complete candidate source of the fused residual add + RMSNorm (the contract of spec
    {"residual": true}) for one point of SPACE: the row kernels, reading x and r, writing
    the sum beside the norm."""
    p = C.resolve(NAME, SPACE, DEFAULT, params)
    doc = f'''"""Fused residual add + RMSNorm candidate ({p["variant"]}, {p["grid"]} grid):
h = x + r; y = h * rsqrt(mean(h^2) + eps) * weight; returns [h; y] stacked ([2, *x.shape]).

x, r [..., D] are viewed as [N, D] (leading dims merged; any row stride, unit column stride);
h is rounded to x's dtype before the norm reads it, as the model's own add stores it. Sums of
squares accumulate in fp32.
Bytes the op must move: 4*N*D*itemsize + D*itemsize (read x and r, write h and y, read
weight); the unfused add and norm move 5*N*D*itemsize (the norm reads h back).
Point: {C.point_line(SPACE, p)}
"""
{C.IMPORTS_SRC}
{C.row_constants_src(p)}'''
    parts = [doc, C.FIT_ROWS_SRC]
    if p["grid"] == "persistent":
        parts.append(C.NUM_SMS_SRC)
    parts.append("\n")
    if p["variant"] == "one_pass":
        parts.append(_one_pass_kernel(p, residual=True) + "\n")
    parts.append(_chunked_kernel(p, residual=True))
    parts.append(_residual_launcher(p))
    return C.tidy("\n".join(parts))


def render_rows(params) -> str:
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
{C.row_constants_src(p)}'''
    parts = [doc, C.FIT_ROWS_SRC]
    if persistent:
        parts.append(C.NUM_SMS_SRC)
    parts.append("\n")
    if one_pass:
        parts.append(_one_pass_kernel(p) + "\n")
    parts.append(_chunked_kernel(p))
    parts.append(_launcher(p))
    return C.tidy("\n".join(parts))


# ---------------------------------------------------------------------------------------------
# spellings: how model code writes it (kernels/patterns.py)
# ---------------------------------------------------------------------------------------------

# the inverse root: rsqrt(v), 1 / sqrt(v) (HF's older norms, KernelBench), or a division by sqrt
_INV = {
    "rsqrt": lambda x, v: x * torch.rsqrt(v),
    "recip": lambda x, v: x * (1 / torch.sqrt(v)),
    "div": lambda x, v: x / torch.sqrt(v),
}
# the square: x.pow(2) (and x ** 2), x * x, x.square()
_SQ = {"pow": lambda x: x.pow(2), "mul": lambda x: x * x, "square": lambda x: x.square()}
# the mean: .mean(dims) or .sum(dims) / n (n captured and checked against the dims' size)
_AVG = {"mean": lambda q: q.mean(-1, keepdim=True), "sum": None}


def _spelling(inv, sq, avg, weight):
    def fn(x, w, eps, n):
        q = _SQ[sq](x)
        ms = q.mean(-1, keepdim=True) if avg == "mean" else q.sum(-1, keepdim=True) / n
        y = _INV[inv](x, ms + eps)
        return y * w if weight else y
    args = (("x", T((4, 16))), ("w", T((16,)) if weight else None), ("eps", Scalar("eps")),
            ("n", Scalar("n", "int") if avg == "sum" else None))
    return Spelling(f"{inv}_{sq}_{avg}{'_w' if weight else ''}", fn, args, free_dims=True)


SPELLINGS = tuple(_spelling(*c) for c in itertools.product(_INV, _SQ, _AVG, (True, False))) + (
    Spelling("rms_norm", lambda x, w, eps: torch.nn.functional.rms_norm(x, (16,), w, eps),
             (("x", T((4, 16))), ("w", T((16,))), ("eps", Scalar("eps")))),
)


def _weight_ref(m, x_shape, dims):
    """The weight as the contract takes it ([D], the normalized dims flattened), or None when the
    matched multiplier is not a per-feature weight of those dims."""
    w = m.meta("w")
    if w is None or not w["dtype"].is_floating_point:
        return None
    r = len(x_shape)
    lo, hi = r + dims[0], r + dims[-1] + 1
    want = x_shape[lo:hi]
    ws = (1,) * (r - len(w["shape"])) + tuple(w["shape"])
    if len(ws) != r or ws[lo:hi] != tuple(want) or any(s != 1 for s in ws[:lo] + ws[hi:]):
        return None
    return Ref("w", (("reshape", [-1]),))


def from_match(m):
    """RMSNorm over the matched dims (adjacent, any position), with or without weight."""
    x = m.meta("x")
    if x is None or not x["dtype"].is_floating_point:
        return None
    shape = x["shape"]
    if m.pattern.endswith("/rms_norm"):
        dims = tuple(range(-len(m.op_args("rms_norm")["normalized_shape"]), 0))
    else:
        dims = from_end(m.captures.get("dims", (-1,)), len(shape))
    if not dims or not trailing_run(dims) or any(d < -len(shape) for d in dims):
        raise NoFit(f"RMS over dims {list(dims)}: not adjacent dims")
    _, d, _ = odi(shape, dims)
    n = m.scalar("n")
    if "n" in m.captures and n != d:
        return None                         # divides the sum of squares by something else
    eps = m.scalar("eps")
    if eps is None and m.captures.get("eps", 0) is None:
        eps = torch.finfo(x["dtype"]).eps       # F.rms_norm's default (nn.RMSNorm(eps=None))
    if eps is None:
        raise NoFit("eps is not a number known when the graph is captured")
    has_w = "w" in m.inputs
    args = {"x": Ref("x"), "weight": Ref.lit(None), "eps": Ref.lit(float(eps))}
    if has_w:
        ref = _weight_ref(m, shape, dims)
        if ref is None:
            return None                     # scaled by something that is not a weight
        args["weight"] = ref
    spec = {}
    if dims != (-1,):
        spec["dims"] = list(dims)
    if not has_w:
        spec["weight"] = False
    pair = m.sum_of("x") if dims == (-1,) else None
    if pair is not None and (not has_w or m.meta("w")["dtype"] == x["dtype"]):
        # x is a residual add the model reads again later (x + attn(...), then the MLP's add):
        # one kernel reads both terms and writes the sum beside the norm, out [2, *shape]
        return residual_fit(m, pair, spec, shape, args)
    return Fit(spec, tuple(shape), args)


# ---------------------------------------------------------------------------------------------
# contracts a match can fix: any adjacent dims, with or without weight
# ---------------------------------------------------------------------------------------------

def _norm_dims(x, dims):
    r = x.dim()
    return tuple(range(r + dims[0], r + dims[-1] + 1))


def _reference_for(dims):
    def reference(x, weight, eps):
        dd = _norm_dims(x, dims)
        y = x * torch.rsqrt(x.pow(2).mean(dd, keepdim=True) + eps)
        if weight is not None:
            lo, hi = dd[0], dd[-1] + 1
            y = y * weight.reshape(tuple(x.shape[lo:hi]) + (1,) * (x.dim() - hi))
        return y
    return reference


def _inputs_for(dims, weight):
    def make(shape, dtype, device, gen, kind="normal"):
        dtype = C.as_dtype(dtype)
        shape = tuple(int(s) for s in shape)
        o, d, i = odi(shape, dims)
        # the adversarial kinds act on normalization groups: generate [O*I, D], lay out [O, D, I]
        # contiguous, as a model passes it (left a transposed view, every timed call of the
        # column kernel copied it first: KernelBench's RMSNorm over dim 1 of 112 x 64 x 512 x
        # 512 ran 21 ms on the H200, torch.compile of it 3.6 ms)
        x = C.norm_input((o * i, d), dtype, gen, kind).reshape(o, i, d).transpose(1, 2).contiguous()
        x = x.reshape(shape)
        out = {"x": x.to(dtype).to(device), "weight": None, "eps": 1e-6}
        if weight:
            out["weight"] = (1.0 + 0.1 * C.randn(gen, d)).to(dtype).to(device)
        return out
    return make


def _cost_for(dims, weight):
    def cost(shape, dtype):
        item = C.itemsize(dtype)
        o, d, i = odi(shape, dims)
        n = o * d * i
        return 2 * n * item + (d * item if weight else 0), 4 * n + 2 * o * i
    return cost


def _layout(dims, odis):
    """Shapes of rank len(dims) + 2 laying out each (O, D, I) triple for ``dims``."""
    inner = -dims[-1] - 1
    out = []
    for o, d, i in odis:
        out.append((o, d) + (1,) * (len(dims) - 1) + ((i,) + (1,) * (inner - 1) if inner else ()))
    return tuple(out)


_INNER_SWEEP = ((1, 1, 1), (2, 3, 5), (3, 7, 33), (2, 64, 130), (1, 130, 17), (5, 33, 64),
                (2, 1000, 3), (4, 64, 4096), (1, 4096, 300))
_INNER_EDGE = ((1, 1, 7), (1, 64, 1), (3, 97, 13), (13, 5, 127), (1, 3, 65537))
_INNER_BENCH = ((112, 64, 262144), (16, 64, 65536), (8, 4096, 2048), (64, 1024, 1024))

# the column kernel's own axes (names apart from SPACE's: a point of a widened contract holds both)
INNER_SPACE = {"block_i": [32, 64, 128, 256, 512], "block_di": [8, 16, 32, 64],
               "inner_warps": [1, 2, 4, 8], "inner_tile": [4096, 8192, 16384]}
INNER_DEFAULT = {"block_i": 128, "block_di": 16, "inner_warps": 4, "inner_tile": 8192}


def _render_for(dims, weight, inner: bool):
    """Candidates for the widened contract: the row kernels of SPACE on x flattened to
    [N, D] (D the normalized dims) when nothing follows them, and, when dims sit before other
    dims ([O, D, I], I > 1), a column kernel: a program normalizes BLOCK_I positions of one o,
    walking D (stride I) in chunks of BLOCK_D. A missing weight is a cached vector of ones
    (multiplying by 1.0 is exact): the row kernels stay as they are."""
    def render(params):
        rows_p = {k: v for k, v in dict(params).items() if k in SPACE}
        inner_p = C.resolve(NAME, INNER_SPACE, INNER_DEFAULT,
                            {k: v for k, v in dict(params).items() if k in INNER_SPACE})
        src = render_rows(rows_p).replace("def kernel_fn(x, weight, eps):", "def _rows(x, weight, eps):")
        head = f'''"""RMSNorm candidate for a widened contract: normalized over dims {list(dims)} (adjacent,
counted from the end){"" if weight else ", no weight"}. x viewed as [O, D, I]: O the dims before,
D the normalized ones, I the ones after. Bytes the op must move: 2*O*D*I*itemsize{" + D*itemsize" if weight else ""}.
Inner point: {C.point_line(INNER_SPACE, inner_p)}
"""
'''
        tail = f'''

DIMS = {tuple(dims)!r}
BLOCK_I = {inner_p["block_i"]}       # positions along I per program (coalesced: I has stride 1)
BLOCK_DI = {inner_p["block_di"]}       # normalized elements per step of the column kernel's loops
INNER_WARPS = {inner_p["inner_warps"]}
INNER_TILE = {inner_p["inner_tile"]}     # a [next_pow2(D), BLOCK_I] tile up to this many elements: one pass
{C.ONES_SRC}

@triton.jit
def _rmsnorm_cols(x_ptr, w_ptr, y_ptr, D, I, n_iblk, eps,
                  BLOCK_D: tl.constexpr, BLOCK_I: tl.constexpr, ONE_PASS: tl.constexpr):
    """x, y contiguous [O, D, I]; program (o, i block) normalizes BLOCK_I columns over D.
    ONE_PASS: BLOCK_D covers D, the tile is loaded once; else pass 1 sums squares chunk by chunk
    and pass 2 re-reads, normalizes and writes."""
    pid = tl.program_id(0)
    o = (pid // n_iblk).to(tl.int64)
    cols = (pid % n_iblk) * BLOCK_I + tl.arange(0, BLOCK_I)            # [BLOCK_I] along I
    cmask = cols < I
    base = o * D * I
    if ONE_PASS:
        ds = tl.arange(0, BLOCK_D)
        mask = (ds < D)[:, None] & cmask[None, :]
        offs = base + ds[:, None].to(tl.int64) * I + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / D + eps)          # [BLOCK_I]
        w = tl.load(w_ptr + ds, mask=ds < D, other=0.0).to(tl.float32)
        y = x * rstd[None, :] * w[:, None]
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK_D, BLOCK_I], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            mask = (ds < D)[:, None] & cmask[None, :]
            x = tl.load(x_ptr + base + ds[:, None].to(tl.int64) * I + cols[None, :], mask=mask,
                        other=0.0).to(tl.float32)
            acc += x * x
        rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / D + eps)            # [BLOCK_I]
        for d0 in range(0, D, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            mask = (ds < D)[:, None] & cmask[None, :]
            offs = base + ds[:, None].to(tl.int64) * I + cols[None, :]
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + ds, mask=ds < D, other=0.0).to(tl.float32)
            y = x * rstd[None, :] * w[:, None]
            tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x, weight, eps):
    """RMSNorm of x over DIMS; weight [D] (the normalized dims flattened) or None."""
    r = x.dim()
    lo, hi = r + DIMS[0], r + DIMS[-1] + 1
    o, d, i = 1, 1, 1
    for s in x.shape[:lo]:
        o *= s
    for s in x.shape[lo:hi]:
        d *= s
    for s in x.shape[hi:]:
        i *= s
    w = weight.reshape(-1) if weight is not None else _ones(d, x.dtype, x.device)
    if i == 1:                           # nothing after the normalized dims: the row kernels
        return _rows(x.reshape(o, d), w, eps).reshape(x.shape)
    xc = x.contiguous()                  # the column kernel reads [O, D, I] contiguous
    out_dtype = x.dtype if w.dtype == x.dtype else torch.float32
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if o * d * i == 0:
        return y
    block_d = _pow2(d)
    one_pass = block_d * BLOCK_I <= INNER_TILE
    n_iblk = _cdiv(i, BLOCK_I)
    _rmsnorm_cols[(o * n_iblk,)](xc, w.contiguous(), y, d, i, n_iblk, float(eps),
                                 BLOCK_D=block_d if one_pass else BLOCK_DI, BLOCK_I=BLOCK_I,
                                 ONE_PASS=one_pass, num_warps=INNER_WARPS)
    return y
'''
        return C.tidy(head + src + tail)
    return render


# ---------------------------------------------------------------------------------------------
# the fused residual add (spec {"residual": true}): h = x + r, y = RMSNorm(h); out = [h; y]
# ---------------------------------------------------------------------------------------------
# A pre-norm decoder computes h = x + attn(...), normalizes h for the MLP and adds the MLP's
# output to h: h is read twice. Apart, the add reads x and r and writes h, the norm reads h and
# writes y (5 N*D passes); fused, x and r are read and h and y written once (4), one launch
# instead of two, and under torch.compile of the optimized model the add does not stand alone
# beside an opaque norm kernel. One output tensor, [2, *shape] (h, y stacked), so the judge
# compares one result; the placement hands out[0] to the add's other readers.

def _residual_baseline(x, residual, weight, eps):
    """What the model runs: the add, then the norm of the sum; both results, unstacked."""
    h = x + residual
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h, (y * weight if weight is not None else y)


def _residual_reference(x, residual, weight, eps):
    """The contract: h = x + residual and y = RMSNorm(h) (_residual_baseline), stacked [h; y]."""
    return torch.stack(_residual_baseline(x, residual, weight, eps))


def _residual_cost(weight: bool):
    def cost(shape, dtype):
        item = C.itemsize(dtype)
        n, d = C.rows_and_cols(shape)
        return 4 * n * d * item + (d * item if weight else 0), 5 * n * d + 2 * n
    return cost


def _configure_residual(spec: dict, weight: bool) -> Family:
    what = "with the residual add fused" + ("" if weight else ", no weight")
    return dataclasses.replace(
        FAMILY, arg_names=("x", "residual", "weight", "eps"),
        reference=_residual_reference, baseline=_residual_baseline,
        make_inputs=C.residual_inputs(_inputs_for((-1,), weight)), cost=_residual_cost(weight),
        render=render_residual, signature=f"kernel_fn(x, residual, weight, eps) {what}",
        description=(f"RMSNorm {what}: h = x + residual, y = h * rsqrt(mean(h^2) + eps)"
                     f"{' * weight' if weight else ''}; returns [h; y] stacked."),
        op_schema="(Tensor x, Tensor residual, Tensor? weight, float eps) -> Tensor",
        spec=dict(spec))


def configure(spec: dict) -> Family:
    """RMSNorm over ``spec["dims"]`` (adjacent dims counted from the end; default [-1]), with
    ``spec["weight"]`` (default True: weight [D] over the normalized dims, flattened);
    ``spec["residual"]`` (last dim only): the residual add before it fused, [h; y] out."""
    dims = tuple(int(d) for d in spec.get("dims", (-1,)))
    weight = bool(spec.get("weight", True))
    unknown = set(spec) - {"dims", "weight", "residual"}
    if (unknown or not dims or not trailing_run(dims) or dims[-1] >= 0
            or (spec.get("residual") and dims != (-1,))):
        raise ValueError(f"rmsnorm takes a spec {{dims: adjacent negative dims, weight: bool, "
                         f"residual: bool (dims [-1] only)}}; got {spec!r}")
    if spec.get("residual"):
        return _configure_residual(spec, weight)
    if dims == (-1,) and weight:
        return FAMILY
    inner = dims[-1] != -1
    if inner:
        bench, sweep, edge = (_layout(dims, _INNER_BENCH), _layout(dims, _INNER_SWEEP),
                              _layout(dims, _INNER_EDGE))
    else:
        k = len(dims)
        lay = lambda ss: tuple(tuple(s[:-1]) + (s[-1],) + (1,) * (k - 1) for s in ss)  # noqa: E731
        bench, sweep, edge = lay(BENCH_SHAPES), lay(SWEEP_SHAPES), lay(EDGE_SHAPES)
    space = dict(SPACE, **INNER_SPACE) if inner else dict(SPACE)
    default = dict(DEFAULT, **INNER_DEFAULT) if inner else dict(DEFAULT)
    what = f"over dims {list(dims)}" + ("" if weight else ", no weight")
    return dataclasses.replace(
        FAMILY, reference=_reference_for(dims), make_inputs=_inputs_for(dims, weight),
        cost=_cost_for(dims, weight), bench_shapes=bench, sweep_shapes=sweep, edge_shapes=edge,
        space=space, default=default, render=_render_for(dims, weight, inner),
        signature=f"kernel_fn(x, weight, eps) {what}",
        description=f"RMSNorm {what}: x * rsqrt(mean(x^2, dims) + eps){' * weight' if weight else ''}.",
        spec=dict(spec))


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
    description="RMSNorm over the last dim: x * rsqrt(mean(x^2) + eps) * weight (Llama-style).",
    notes={"one_pass_max_block": 65536, "max_tile_elems": 65536},
    spellings=SPELLINGS,
    from_match=from_match,
    op_schema="(Tensor x, Tensor? weight, float eps) -> Tensor",
    profile_ops=("aten::rms_norm", "aten::_fused_rms_norm"),
)
