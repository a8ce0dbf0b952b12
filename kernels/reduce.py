"""Reduce family: y = x.sum(-1), the sum over the last dim, accumulated in fp32.

x has any number of leading dims and is viewed as [N, D]; y has x's leading dims (a 0-d tensor
for a 1-D x) and x's dtype: what ``x.sum(-1)`` returns in a model (torch accumulates fp16/bf16
sums in fp32 internally and rounds the result once; so do the candidates). The profiler files
aten::sum and aten::mean outside other families under "reduce"; a mean is this sum and one
scaling, the same memory traffic. The op must read x once and write y: N*D*itemsize + N*itemsize
bytes, one add per element: memory bound.

Numerics: fp32 per-lane accumulators (each lane adds D / BLOCK values in order), then one tree
reduction; +inf and -inf in one row give NaN, as torch does.

Search space (``SPACE``), rendered by ``render`` into one self-contained candidate source:
- variant "one_pass": a program holds whole rows (BLOCK = next_pow2(D) at launch, ROWS rows);
  falls back to "chunked" when next_pow2(D) > 65536.
- variant "chunked": loop over column chunks of BLOCK_D with a [ROWS, BLOCK_D] fp32 accumulator.
- variant "split": each row is cut into ``splits`` slices; program (row block, slice) writes
  fp32 partial sums to a workspace [N, SPLITS]; a second kernel adds each row's partials in a
  fixed order (deterministic, no atomics). For few, very long rows.
  Every point takes this path for few long rows (fewer than FEW_ROWS = 64, longer than
  LONG_ROW = 2^16: a loss's mean over everything is one row), with splits chosen to give about
  1,024 programs: one program a row would leave the GPU idle and each lane adding D / BLOCK_D
  values in order.
- rows_per_prog, grid ("rows" | "persistent" with progs_per_sm; one_pass and chunked), num_warps,
  num_stages (software pipelining of the chunk loop), block_d (chunk width), cache_hints
  (evict_first: x is read once).
Launch-time clamps as in rmsnorm: a [ROWS, BLOCK] tile is at most 65536 elements and num_stages
drops until the (stages - 1) pipelined load buffers fit 48 KB of shared memory.
"""
from __future__ import annotations

import dataclasses

import torch

from kernels import Family
from kernels import _common as C
from kernels.patterns import Fit, NoFit, Ref, Spelling, T, from_end, odi, trailing_run

NAME = "reduce"
SIGNATURE = "kernel_fn(x)"
ARG_NAMES = ("x",)
ADVERSARIAL = ("huge", "tiny", "mixed_scale", "constant_rows", "heavy_tail", "cancel", "inf")


def reference(x):
    return x.sum(dim=-1)


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------

# Row sums of the "huge" kind (positive entries): near fp16's top, far beyond it for bf16/fp32.
_HUGE = {torch.float16: 3e4, torch.bfloat16: 1e30, torch.float32: 1e30}
# "mixed_scale": row scales 10^-3 .. 10^E (fp16 sums of 10^1.5-scaled rows stay finite)
_MIXED_E = {torch.float16: 1.5, torch.bfloat16: 3.0, torch.float32: 3.0}


def make_inputs(shape, dtype, device, gen, kind="normal"):
    """{x: [*shape]} with fresh random values from ``gen``."""
    dtype = C.as_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    n, d = C.rows_and_cols(shape)
    if kind == "normal":
        x = C.randn(gen, n, d)
    elif kind == "huge":
        x = (0.5 + C.rand(gen, n, d)) * (_HUGE[dtype] / max(d, 1))
    elif kind == "tiny":
        x = C.randn(gen, n, d) * C.log_uniform(gen, n, -6.0, -4.0)    # fp16 subnormals
    elif kind == "mixed_scale":
        x = C.randn(gen, n, d) * C.log_uniform(gen, n, -3.0, _MIXED_E[dtype])
    elif kind == "constant_rows":
        x = (C.randn(gen, n, 1) * 2.0).expand(n, d).clone()
    elif kind == "heavy_tail":
        lim = _HUGE[dtype] / max(d, 1)                             # sums stay finite in fp16
        x = C.cauchy(gen, n, d).clamp(-lim, lim)
    elif kind == "cancel":
        # large values cancelling in pairs plus unit noise: the sum is small, sum |x| is not
        big = C.randn(gen, n, (d + 1) // 2) * 100.0
        pairs = torch.cat((big, -big), dim=1)[:, :d]
        perm = torch.argsort(C.rand(gen, n, d), dim=1)
        x = torch.gather(pairs, 1, perm) + C.randn(gen, n, d)
    elif kind == "inf":
        # ~1% +inf; row 0 holds +inf and -inf (sum NaN), row 1 is all -inf (sum -inf)
        x = C.randn(gen, n, d)
        x = torch.where(C.rand(gen, n, d) < 0.01, float("inf"), x)
        if n >= 2:
            x[0, 0] = float("inf")
            if d > 1:
                x[0, d - 1] = float("-inf")
            x[1] = float("-inf")
    else:
        raise ValueError(f"unknown input kind {kind!r}; known: normal, {', '.join(ADVERSARIAL)}")
    return {"x": x.reshape(shape).to(dtype).to(device)}


def error_bound(x):
    """sum |x|: the rounding error of a sum scales with its terms' magnitude, not its value."""
    return x.abs().sum(dim=-1)


# |out - expected| <= atol + rtol*|expected| + stol*sum|x|, expected = fp64 sum cast to x's
# dtype. stol: 64 fp32 ulps (per-lane fp32 accumulators adding up to D / 256 values each stay
# well inside; an fp16 accumulator is off by 2^-11 of its partial sums); rtol: the result's
# rounding to fp16/bf16 (2 ulps); atol: fp16's subnormal spacing.
# (TOLERANCE[dtype] = (atol, rtol), BOUND_TOL[dtype] = stol)
_STOL = 64 * 2.0**-24
TOLERANCE = {
    torch.float32: (0.0, 1e-6),
    torch.float16: (1.2e-7, 2e-3),
    torch.bfloat16: (0.0, 1.6e-2),
}
BOUND_TOL = {
    torch.float32: _STOL,
    torch.float16: _STOL,
    torch.bfloat16: _STOL,
}


def cost(shape, dtype):
    """(bytes, flops): read x once, write one value per row; one add per element."""
    item = C.itemsize(dtype)
    n, d = C.rows_and_cols(shape)
    return n * d * item + n * item, n * d


BENCH_SHAPES = ((16384, 8192), (4096, 4096), (16384, 4096), (8, 2048, 4096), (4096, 32000),
                (1, 16777216), (64, 1000000), (1000, 1000), (3, 5000), (4097, 1023))
SWEEP_SHAPES = ((1, 1), (2, 3), (7, 1000), (33, 257), (3, 4097), (5, 3, 129), (1, 30000),
                (256, 8192), (64, 65536), (2, 100000))
EDGE_SHAPES = ((1, 1), (1, 4096), (97, 127), (13, 1031), (4099, 7), (65537, 8), (37,),
               (2, 1, 5))


# ---------------------------------------------------------------------------------------------
# search space and rendering
# ---------------------------------------------------------------------------------------------

SPACE = {
    "variant": ["one_pass", "chunked", "split"],
    "rows_per_prog": [1, 2, 4, 8, 16],
    "num_warps": [1, 2, 4, 8, 16],
    "num_stages": [1, 2, 3, 4],
    "block_d": [256, 512, 1024, 2048, 4096],
    "splits": [2, 4, 8, 16, 32],
    "grid": ["rows", "persistent"],
    "progs_per_sm": [1, 2, 4, 8],
    "cache_hints": [False, True],
}
DEFAULT = {"variant": "one_pass", "rows_per_prog": 1, "num_warps": 4, "num_stages": 1,
           "block_d": 4096, "splits": 8, "grid": "rows", "progs_per_sm": 4, "cache_hints": False}

_ARGS = "x_ptr, y_ptr, N, D, stride_xn, num_tiles,\n        ROWS: tl.constexpr"


def _one_pass_kernel(p):
    _, stream = C.cache_hints(p["cache_hints"])
    doc = '''
"""Tile [ROWS, BLOCK] (BLOCK = next_pow2(D)): ROWS whole rows in registers, x read once;
masked lanes load 0."""'''
    body = f'''
rows = (tile * ROWS + tl.arange(0, ROWS)).to(tl.int64)             # [ROWS]; int64: rows*stride may pass 2^31
cols = tl.arange(0, BLOCK)
mask = (rows < N)[:, None] & (cols < D)[None, :]                   # [ROWS, BLOCK]
x = tl.load(x_ptr + rows[:, None] * stride_xn + cols[None, :], mask=mask, other=0.0{stream}).to(tl.float32)
tl.store(y_ptr + rows, tl.sum(x, axis=1).to(y_ptr.dtype.element_ty), mask=rows < N)'''
    return C.tiled_kernel("_sum_one_pass", _ARGS + ", BLOCK: tl.constexpr", doc, "", body,
                          p["grid"] == "persistent")


def _chunked_kernel(p):
    _, stream = C.cache_hints(p["cache_hints"])
    doc = '''
"""Tile [ROWS, BLOCK_D] sliding along D: a per-lane fp32 accumulator, reduced once at the end.
Reads x once."""'''
    body = f'''
rows = (tile * ROWS + tl.arange(0, ROWS)).to(tl.int64)             # [ROWS]
row_mask = rows < N
x_row = x_ptr + rows[:, None] * stride_xn                          # [ROWS, 1] row starts
acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
for start in tl.range(0, D, BLOCK_D, num_stages=NUM_STAGES):
    cols = start + tl.arange(0, BLOCK_D)
    mask = row_mask[:, None] & (cols < D)[None, :]
    acc += tl.load(x_row + cols[None, :], mask=mask, other=0.0{stream}).to(tl.float32)
tl.store(y_ptr + rows, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=row_mask)'''
    return C.tiled_kernel("_sum_chunked",
                          _ARGS + ", BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr",
                          doc, "", body, p["grid"] == "persistent")


def _split_kernels(p):
    _, stream = C.cache_hints(p["cache_hints"])
    return f'''@triton.jit
def _sum_partials(x_ptr, part_ptr, N, D, stride_xn, SLICE, SPLITS: tl.constexpr,
                  ROWS: tl.constexpr, BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Program (row block, k) sums slice [k*SLICE, (k+1)*SLICE) of ROWS rows (SLICE is a multiple
    of BLOCK_D) into the fp32 workspace part [N, SPLITS]."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)   # [ROWS]
    row_mask = rows < N
    k = tl.program_id(1)
    x_row = x_ptr + rows[:, None] * stride_xn + k * SLICE          # [ROWS, 1] slice starts
    lim = D - k * SLICE                                            # columns left in the row
    acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    for start in tl.range(0, SLICE, BLOCK_D, num_stages=NUM_STAGES):
        cols = start + tl.arange(0, BLOCK_D)
        mask = row_mask[:, None] & (cols < lim)[None, :]
        acc += tl.load(x_row + cols[None, :], mask=mask, other=0.0{stream}).to(tl.float32)
    tl.store(part_ptr + rows * SPLITS + k, tl.sum(acc, axis=1), mask=row_mask)


@triton.jit
def _sum_merge(part_ptr, y_ptr, N, SPLITS: tl.constexpr, ROWS: tl.constexpr):
    """Tile [ROWS, SPLITS]: each row's partial sums added in one fixed tree order."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    row_mask = rows < N
    ks = tl.arange(0, SPLITS)
    part = tl.load(part_ptr + rows[:, None] * SPLITS + ks[None, :], mask=row_mask[:, None], other=0.0)
    tl.store(y_ptr + rows, tl.sum(part, axis=1).to(y_ptr.dtype.element_ty), mask=row_mask)
'''


# the split path's host side: the split variant's launch, and any point's for few long rows
_SPLIT_SUM_SRC = '''

def _split_sum(x2, y, N, D, splits):
    """Each row's columns in ``splits`` slices (whole chunks each) on their own programs, fp32
    partials [N, splits], then each row's partials added in one fixed order (no atomics)."""
    per = _cdiv(D, splits)                                 # columns per slice
    width = min(BLOCK_D, _pow2(max(per, 1)))    # chunk: no wider than a slice
    slice_len = max(1, _cdiv(per, width)) * width          # whole chunks per slice
    rows = _fit_rows(ROWS_PER_PROG, width)
    stages = _fit_stages(NUM_STAGES, rows * width * x2.dtype.itemsize)
    part = torch.empty((N, splits), dtype=torch.float32, device=x2.device)
    _sum_partials[(_cdiv(N, rows), splits)](
        x2, part, N, D, x2.stride(0), slice_len, SPLITS=splits, ROWS=rows, BLOCK_D=width,
        NUM_STAGES=stages, num_warps=NUM_WARPS, num_stages=stages)
    merge_rows = max(1, min(MERGE_ROWS, 4096 // splits))  # a [rows, splits] tile of partials
    _sum_merge[(_cdiv(N, merge_rows),)](part, y, N, SPLITS=splits, ROWS=merge_rows, num_warps=4)
    return y
'''


def _launcher(p):
    v = p["variant"]
    head = '''

def kernel_fn(x):
    """Sum over the last dim of x [..., D]; returns y [...] in x's dtype (fp32 accumulation)."""
    D = x.shape[-1] if x.dim() > 0 else 1
    out_shape = x.shape[:-1]
    if x.dim() == 0 or x.stride(-1) != 1:
        x = x.contiguous()               # kernels assume unit stride along D; any row stride works
    x2 = x.reshape(-1, D)                # [N, D]: a view whenever the leading dims can merge
    N = x2.shape[0]
    y = torch.empty((N,), dtype=x.dtype, device=x.device)
    if N == 0:
        return y.reshape(out_shape)
    block = _pow2(max(D, 1))'''
    if v == "split":
        return _SPLIT_SUM_SRC + head + '''
    return _split_sum(x2, y, N, D, SPLITS).reshape(out_shape)
'''
    head += '''
    if N < FEW_ROWS and D >= LONG_ROW:
        # few long rows (a loss's mean over everything): one program a row would leave the
        # GPU idle and each lane adding D / BLOCK_D values in order
        return _split_sum(x2, y, N, D, min(MAX_SPLITS, _pow2(_cdiv(SPLIT_PROGS, N)))).reshape(out_shape)'''
    head = _SPLIT_SUM_SRC + head
    if p["grid"] == "persistent":
        grid = "(min(num_tiles, _num_sms(x.device) * PROGS_PER_SM),)  # persistent programs"
    else:
        grid = "(num_tiles,)  # one tile per program"
    select = C.select_src("_sum_one_pass" if v == "one_pass" else None, "_sum_chunked")
    return head + "\n" + select + f'''
    num_tiles = _cdiv(N, rows)
    grid = {grid}
    kernel[grid](x2, y, N, D, x2.stride(0), num_tiles, **meta,
                 num_warps=NUM_WARPS, num_stages=stages)
    return y.reshape(out_shape)
'''


def render(params) -> str:
    """Complete candidate source for one point of SPACE (missing params take DEFAULT values)."""
    p = C.resolve(NAME, SPACE, DEFAULT, params)
    v = p["variant"]
    if v == "split":
        traffic = (f"reads x once and writes and re-reads an fp32 workspace of {p['splits']}*4 "
                   f"bytes per row")
    else:
        traffic = "reads x once and writes y once"
    doc = f'''"""Reduce candidate ({v}{", " + p["grid"] + " grid" if v != "split" else ""}): y = x.sum(-1), fp32 accumulation.

x [..., D] is viewed as [N, D] (leading dims merged; any row stride, unit column stride);
y [...] in x's dtype, rounded once.
Bytes the op must move: N*D*itemsize + N*itemsize. This variant {traffic}.
Point: {C.point_line(SPACE, p)}
"""
{C.IMPORTS_SRC}
ROWS_PER_PROG = {p["rows_per_prog"]}   # rows per program tile (halved at launch to fit MAX_TILE)
BLOCK_D = {p["block_d"]}        # chunk width of the looped kernels
SPLITS = {p["splits"]}          # slices per row ("split" variant)
NUM_WARPS = {p["num_warps"]}
NUM_STAGES = {p["num_stages"]}       # software-pipelining depth of the chunk loops
PROGS_PER_SM = {p["progs_per_sm"]}     # persistent grid only
MERGE_ROWS = 16        # rows per program of the split merge
FEW_ROWS, LONG_ROW = 64, 1 << 16   # fewer rows than this, longer than that: the split path
SPLIT_PROGS, MAX_SPLITS = 1024, 1024   # ... with about this many programs in all
'''
    parts = [doc, C.FIT_ROWS_SRC]
    if v != "split" and p["grid"] == "persistent":
        parts.append(C.NUM_SMS_SRC)
    parts.append("\n")
    parts.append(_split_kernels(p))          # the split variant's, and few long rows' in any
    if v != "split":
        if v == "one_pass":
            parts.append(_one_pass_kernel(p) + "\n")
        parts.append(_chunked_kernel(p))
    parts.append(_launcher(p))
    return C.tidy("\n".join(parts))


# ---------------------------------------------------------------------------------------------
# spellings: how model code writes it (kernels/patterns.py)
# ---------------------------------------------------------------------------------------------

_X = (("x", T((4, 16))),)
SPELLINGS = (
    # keepdim and dtype are captured as they are: one spelling per op
    Spelling("sum", lambda x: x.sum(-1), _X, free_dims=True, loose=("keepdim", "dtype")),
    Spelling("mean", lambda x: x.mean(-1), _X, free_dims=True, loose=("keepdim", "dtype")),
    Spelling("sum_all", lambda x: x.sum(), _X, loose=("dtype",)),
    Spelling("mean_all", lambda x: x.mean(), _X, loose=("dtype",)),
)


def from_match(m):
    """A sum or mean over adjacent dims, in x's dtype."""
    x, out = m.meta("x"), m.out_meta()
    if x is None or not x["dtype"].is_floating_point or out is None:
        return None
    name = m.pattern.split("/")[1]
    rank = len(x["shape"])
    if name.endswith("_all"):
        dims = tuple(range(-rank, 0)) if rank else (-1,)
        keepdim = False
    else:
        dims = m.captures.get("dims", (-1,))
        dims = tuple(range(-rank, 0)) if dims == ("all",) else from_end(dims, rank)
        keepdim = bool(m.captures.get("keepdim", False))
    op = "mean" if name.startswith("mean") else "sum"
    if rank == 0:
        raise NoFit(f"{op} of a 0-d tensor")
    if not trailing_run(dims):
        raise NoFit(f"{op} over dims {list(dims)}: not adjacent dims")
    if out["dtype"] != x["dtype"]:
        raise NoFit(f"{op} of {x['dtype']} into {out['dtype']}: the contract returns x's dtype")
    spec = {}
    if op == "mean":
        spec["op"] = "mean"
    if dims != (-1,):
        spec["dims"] = list(dims)
    if keepdim:
        spec["keepdim"] = True
    return Fit(spec, tuple(x["shape"]), {"x": Ref("x")})


# ---------------------------------------------------------------------------------------------
# contracts a match can fix: mean, any adjacent dims, keepdim
# ---------------------------------------------------------------------------------------------

def _dd(x, dims):
    r = x.dim()
    return tuple(range(r + dims[0], r + dims[-1] + 1))


def _reference_for(dims, op, keepdim):
    def reference(x):
        f = torch.mean if op == "mean" else torch.sum
        return f(x, dim=_dd(x, dims), keepdim=keepdim)
    return reference


def _bound_for(dims, op, keepdim):
    def bound(x):
        b = x.abs().sum(dim=_dd(x, dims), keepdim=keepdim)
        if op == "mean":
            n = 1
            for d in _dd(x, dims):
                n *= x.shape[d]
            b = b / max(n, 1)
        return b
    return bound


def _inputs_for(dims):
    def make(shape, dtype, device, gen, kind="normal"):
        shape = tuple(int(s) for s in shape)
        o, d, i = odi(shape, dims)
        # the adversarial kinds act on reduced groups: [O*I, D] laid out as [O, D, I]
        x = make_inputs((o * i, d), dtype, device, gen, kind)["x"]
        return {"x": x.reshape(o, i, d).transpose(1, 2).reshape(shape).contiguous()}
    return make


def _cost_for(dims):
    def cost(shape, dtype):
        item = C.itemsize(dtype)
        o, d, i = odi(shape, dims)
        return o * d * i * item + o * i * item, o * d * i
    return cost


def _layout(dims, odis):
    inner = -dims[-1] - 1
    return tuple((o, d) + (1,) * (len(dims) - 1) + ((i,) + (1,) * (inner - 1) if inner else ())
                 for o, d, i in odis)


SPEC_SPACE = {"block_d": [16, 32, 64, 128, 256, 1024, 4096], "block_i": [32, 64, 128, 256],
              "rows_per_prog": [1, 2, 4, 8], "num_warps": [1, 2, 4, 8]}
SPEC_DEFAULT = {"block_d": 64, "block_i": 128, "rows_per_prog": 1, "num_warps": 4}


def _render_for(dims, op, keepdim):
    def render(params):
        p = C.resolve(NAME, SPEC_SPACE, SPEC_DEFAULT, params)
        return C.tidy(f'''"""Reduce candidate for a widened contract: x.{op}(dims={list(dims)}, keepdim={keepdim}), fp32 accumulation.

x viewed as [O, D, I] (D the reduced dims, adjacent; O before, I after); y [O, I] in x's dtype,
rounded once{", the sum times 1/D" if op == "mean" else ""}. Rows kernel when I == 1 (a [ROWS, BLOCK_D] tile
sliding along D), column kernel otherwise (a [BLOCK_D, BLOCK_I] tile sliding along D, coalesced
along I). Bytes the op must move: O*D*I*itemsize + O*I*itemsize; x is read once.
Point: {C.point_line(SPEC_SPACE, p)}
"""
{C.IMPORTS_SRC}
DIMS = {tuple(dims)!r}
KEEPDIM = {keepdim!r}
MEAN = {op == "mean"!r}
BLOCK_D = {p["block_d"]}       # reduced elements per step
BLOCK_I = {p["block_i"]}       # positions along I per program (column kernel)
ROWS_PER_PROG = {p["rows_per_prog"]}    # rows per program (rows kernel)
NUM_WARPS = {p["num_warps"]}


@triton.jit
def _reduce_rows(x_ptr, y_ptr, N, D, scale, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """x contiguous [N, D]: a program adds ROWS rows chunk by chunk (per-lane fp32 sums)."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    row_mask = rows < N
    acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    for start in range(0, D, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        mask = row_mask[:, None] & (cols < D)[None, :]
        acc += tl.load(x_ptr + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, (tl.sum(acc, axis=1) * scale).to(y_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _reduce_cols(x_ptr, y_ptr, D, I, n_iblk, scale, BLOCK_D: tl.constexpr, BLOCK_I: tl.constexpr):
    """x contiguous [O, D, I]: program (o, i block) adds BLOCK_I columns over D."""
    pid = tl.program_id(0)
    o = (pid // n_iblk).to(tl.int64)
    cols = (pid % n_iblk) * BLOCK_I + tl.arange(0, BLOCK_I)
    cmask = cols < I
    base = o * D * I
    acc = tl.zeros([BLOCK_D, BLOCK_I], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        mask = (ds < D)[:, None] & cmask[None, :]
        acc += tl.load(x_ptr + base + ds[:, None].to(tl.int64) * I + cols[None, :], mask=mask,
                       other=0.0).to(tl.float32)
    tl.store(y_ptr + o * I + cols, (tl.sum(acc, axis=0) * scale).to(y_ptr.dtype.element_ty), mask=cmask)


def kernel_fn(x):
    r = x.dim()
    lo, hi = r + DIMS[0], r + DIMS[-1] + 1
    o, d, i = 1, 1, 1
    for s in x.shape[:lo]:
        o *= s
    for s in x.shape[lo:hi]:
        d *= s
    for s in x.shape[hi:]:
        i *= s
    out_shape = tuple(x.shape[:lo]) + ((1,) * (hi - lo) if KEEPDIM else ()) + tuple(x.shape[hi:])
    y = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    if o * i == 0:
        return y
    scale = (1.0 / d if d else float("nan")) if MEAN else 1.0
    xc = x.contiguous()                  # [O, D, I] with unit stride along I
    if i == 1:
        width = min(BLOCK_D * 16, _pow2(max(d, 1)))
        rows = ROWS_PER_PROG
        while rows > 1 and rows * width > 16384:
            rows //= 2
        _reduce_rows[(_cdiv(o, rows),)](xc, y, o, d, scale, ROWS=rows, BLOCK_D=width,
                                              num_warps=NUM_WARPS)
    else:
        n_iblk = _cdiv(i, BLOCK_I)
        _reduce_cols[(o * n_iblk,)](xc, y, d, i, n_iblk, scale, BLOCK_D=BLOCK_D, BLOCK_I=BLOCK_I,
                                    num_warps=NUM_WARPS)
    return y
''')
    return render


_SPEC_SWEEP = ((1, 1, 1), (2, 3, 5), (3, 7, 33), (2, 64, 130), (1, 130, 17), (5, 1000, 3),
               (4, 64, 4096), (1, 4096, 300), (2, 30000, 1))
_SPEC_EDGE = ((1, 1, 7), (1, 64, 1), (3, 97, 13), (13, 5, 127), (1, 3, 65537))
_SPEC_BENCH = ((128, 4096, 4095), (16384, 8192, 1), (8, 2048, 4096), (64, 1024, 1024))


def configure(spec: dict) -> Family:
    """``spec``: {"op": "sum" | "mean", "dims": adjacent negative dims (default [-1]),
    "keepdim": bool}."""
    op = spec.get("op", "sum")
    dims = tuple(int(d) for d in spec.get("dims", (-1,)))
    keepdim = bool(spec.get("keepdim", False))
    if (set(spec) - {"op", "dims", "keepdim"} or op not in ("sum", "mean") or not trailing_run(dims)
            or dims[-1] >= 0):
        raise ValueError(f"reduce takes a spec {{op: sum|mean, dims: adjacent negative dims, "
                         f"keepdim: bool}}; got {spec!r}")
    if op == "sum" and dims == (-1,) and not keepdim:
        return FAMILY
    lay = lambda t: _layout(dims, t)  # noqa: E731
    what = f"x.{op}(dims={list(dims)}{', keepdim=True' if keepdim else ''})"
    return dataclasses.replace(
        FAMILY, reference=_reference_for(dims, op, keepdim), error_bound=_bound_for(dims, op, keepdim),
        make_inputs=_inputs_for(dims), cost=_cost_for(dims), bench_shapes=lay(_SPEC_BENCH),
        sweep_shapes=lay(_SPEC_SWEEP), edge_shapes=lay(_SPEC_EDGE), space=dict(SPEC_SPACE),
        default=dict(SPEC_DEFAULT), render=_render_for(dims, op, keepdim),
        signature=f"kernel_fn(x) -> {what}", description=f"{what}, fp32 accumulation, x's dtype.",
        spec=dict(spec))


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
    op_schema="(Tensor x) -> Tensor",
    profile_ops=("aten::sum", "aten::mean"),
    description="Sum over the last dim (x.sum(-1)), fp32 accumulation, result in x's dtype.",
    notes={"one_pass_max_block": 65536, "max_tile_elems": 65536, "bound": "memory",
           "inf_and_neg_inf": "NaN, like torch"},
    error_bound=error_bound,
    bound_tol=BOUND_TOL,
)
