"""Softmax family: y = exp(x - max(x)) / sum(exp(x - max(x))) over the last dim.

x has any number of leading dims and is viewed as [N, D]. The op must read x once and write y
once: 2*N*D*itemsize bytes, about 5 flops per element (max, subtract, exp, add, scale), so it is
memory bound; the variants trade re-reads of x against registers.

Numerics: every variant subtracts the row max before exp (fp32 throughout). A row that is
entirely -inf yields NaN, as torch does; -inf entries elsewhere yield exact zeros. The online
variants keep exp(-inf - m) from turning into exp(-inf + inf) = NaN while a row (or lane) has
seen only -inf so far, by subtracting 0 instead of an infinite running max.

Search space (``SPACE``), rendered by ``render`` into one self-contained candidate source:
- variant "one_pass": whole rows in registers (BLOCK = next_pow2(D) at launch): max, exp, sum,
  write; x read once. Falls back to "online" when next_pow2(D) > 65536.
- variant "online": one loop over chunks of BLOCK_D keeping a running max m and a sum s rescaled
  by exp(m_old - m_new), then a loop writing exp(x - m) / s: x read twice.
  ``online`` = "chunk" (one max per chunk: one exp per element) or "lane" (a running max per
  lane, merged at the end: no cross-lane reduction in the loop, but two exps per element).
- variant "three_pass": a max loop, a sum loop, a write loop: x read three times.
- rows_per_prog, grid ("rows" | "persistent" with progs_per_sm), num_warps, num_stages,
  block_d, cache_hints as in the norms; use_exp2: exp2((x - m) * log2(e)) instead of exp (the
  scale is applied after subtracting the max, so no precision is lost on large |x|).
Parameters that do not apply render the same source (block_d/num_stages/online with one_pass
except for its wide-row fallback; online with three_pass; progs_per_sm with grid "rows").
Launch-time clamps keep every point valid on the GPU: a program's register tile is at most
65536 elements (ROWS halves until it fits) and num_stages drops until the (stages - 1)
pipelined load buffers fit 48 KB of shared memory (a 4-stage fp32 [8, 4096] loop would ask
for 384 KB and fail to launch).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from kernels import Family
from kernels import _common as C
from kernels.patterns import Fit, NoFit, Ref, Spelling, T, from_end

NAME = "softmax"
SIGNATURE = "kernel_fn(x)"
ARG_NAMES = ("x",)
ADVERSARIAL = ("huge", "tiny", "mixed_scale", "constant_rows", "heavy_tail", "neg_inf")


def reference(x):
    return torch.softmax(x, dim=-1)


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------

# "huge": rows centered at c ~ U(-H, H) with spread g; exp(x) overflows fp32 (and everything
# else) for x > 89, so a kernel without the max subtraction returns inf/NaN. The spread is a few
# ulps of H so that rows are not all one-hot after rounding to the dtype.
_HUGE = {torch.float16: (2e4, 24.0), torch.bfloat16: (2e4, 200.0), torch.float32: (1e6, 4.0)}
_LIMIT = {torch.float16: 6.0e4, torch.bfloat16: 1e30, torch.float32: 1e30}


def softmax_input(shape, dtype, gen, kind, huge=None):
    """Float32 values (on gen.device) for a [..., D] softmax/cross-entropy input of ``kind``;
    ``huge`` overrides the per-dtype (center range, spread) of the "huge" kind."""
    n, d = C.rows_and_cols(shape)
    huge = huge or _HUGE
    if kind == "normal":
        x = C.randn(gen, n, d) * 3.0
    elif kind == "huge":
        h, g = huge[dtype]
        x = h * (2.0 * C.rand(gen, n, 1) - 1.0) + g * C.randn(gen, n, d)
    elif kind == "tiny":
        # 1e-6..1e-4 (fp16 subnormals): outputs are all ~1/D; masked lanes that load 0 instead
        # of -inf would add exp(0) = 1 each to the sum
        x = C.randn(gen, n, d) * C.log_uniform(gen, n, -6.0, -4.0)
    elif kind == "mixed_scale":
        # each row: a constant offset of 1..H/2 (either sign) plus noise of scale 0.01..10
        h = huge[dtype][0]
        offset = C.random_signs(gen, n) * C.log_uniform(gen, n, 0.0, math.log10(h / 2))
        x = offset + C.randn(gen, n, d) * C.log_uniform(gen, n, -2.0, 1.0)
    elif kind == "constant_rows":
        x = (C.randn(gen, n, 1) * C.log_uniform(gen, n, 0.0, 3.0)).expand(n, d).clone()
    elif kind == "heavy_tail":
        x = C.cauchy(gen, n, d) * 2.0
    elif kind == "neg_inf":
        # ~10% -inf everywhere; row 0 entirely -inf (torch gives NaN), row 1 a single finite
        # entry (output exactly 1 there), row 2 its first half -inf (the online variants' first
        # chunks see nothing but -inf)
        x = C.randn(gen, n, d) * 3.0
        x = torch.where(C.rand(gen, n, d) < 0.1, float("-inf"), x)
        if n >= 3:
            x[0] = float("-inf")
            x[1] = float("-inf")
            x[1, int(C.rand(gen, 1).item() * d) % d] = 1.0
            x[2, : d // 2] = float("-inf")
    else:
        raise ValueError(f"unknown input kind {kind!r}; known: normal, {', '.join(ADVERSARIAL)}")
    lim = _LIMIT[dtype]
    x = torch.where(torch.isinf(x), x, x.clamp(-lim, lim))
    return x.reshape(tuple(int(s) for s in shape))


def make_inputs(shape, dtype, device, gen, kind="normal"):
    """{x: [*shape]} with fresh random values from ``gen``."""
    dtype = C.as_dtype(dtype)
    return {"x": softmax_input(shape, dtype, gen, kind).to(dtype).to(device)}


# |out - expected| <= atol + rtol * |expected|, expected = fp64 reference cast to the output dtype.
# Outputs lie in [0, 1] and most are small, so atol is far below 1/D and rtol does the work:
# fp16/bf16 rtol is about twice the output rounding (2^-10, 2^-7 relative); fp16 atol covers its
# subnormal spacing (6e-8); fp32: exp, sum and reciprocal are good to a few 1e-7.
TOLERANCE = {
    torch.float32: (1e-7, 1e-5),
    torch.float16: (1e-6, 2e-3),
    torch.bfloat16: (1e-6, 1.6e-2),
}


def cost(shape, dtype):
    """(bytes, flops): read x once, write y once; max, subtract, exp, add, scale per element."""
    item = C.itemsize(dtype)
    n, d = C.rows_and_cols(shape)
    return 2 * n * d * item, 5 * n * d + n


BENCH_SHAPES = ((8192, 8192), (4096, 4096), (4096, 50257), (8, 32, 2048, 2048),
                (1000, 1000), (3, 5000), (4097, 1023))
SWEEP_SHAPES = ((1, 1), (2, 3), (7, 1000), (33, 257), (3, 4097), (5, 3, 129), (256, 8192),
                (64, 65536), (2, 100000))
EDGE_SHAPES = ((1, 1), (1, 4096), (97, 127), (13, 1031), (4099, 7), (65537, 8))


# ---------------------------------------------------------------------------------------------
# search space and rendering
# ---------------------------------------------------------------------------------------------

SPACE = {
    "variant": ["one_pass", "online", "three_pass"],
    "online": ["chunk", "lane"],
    "rows_per_prog": [1, 2, 4, 8],
    "num_warps": [1, 2, 4, 8, 16],
    "num_stages": [1, 2, 3, 4],
    "block_d": [1024, 2048, 4096, 8192],
    "use_exp2": [False, True],
    "grid": ["rows", "persistent"],
    "progs_per_sm": [1, 2, 4, 8],
    "cache_hints": [False, True],
}
DEFAULT = {"variant": "one_pass", "online": "chunk", "rows_per_prog": 1, "num_warps": 4,
           "num_stages": 1, "block_d": 4096, "use_exp2": False, "grid": "rows",
           "progs_per_sm": 4, "cache_hints": False}

_ARGS = "x_ptr, y_ptr, N, D, stride_xn, num_tiles,\n        ROWS: tl.constexpr"

_ROWS = '''
rows = (tile * ROWS + tl.arange(0, ROWS)).to(tl.int64)             # [ROWS]; int64: rows*stride may pass 2^31
row_mask = rows < N
x_row = x_ptr + rows[:, None] * stride_xn                          # [ROWS, 1] row starts
y_row = y_ptr + rows[:, None] * D'''

_CHUNK = '''
cols = start + tl.arange(0, BLOCK_D)
col_mask = row_mask[:, None] & (cols < D)[None, :]'''


def _loop(body: str) -> str:
    return ("for start in tl.range(0, D, BLOCK_D, num_stages=NUM_STAGES):\n"
            + C.indent(_CHUNK, 4) + "\n" + C.indent(body, 4))


def _load(hint: str) -> str:
    return f'x = tl.load(x_row + cols[None, :], mask=col_mask, other=float("-inf"){hint}).to(tl.float32)'


def _write_loop(p, m: str, inv: str) -> str:
    _, stream = C.cache_hints(p["cache_hints"])
    e = C.exp_expr(f"x - {m}[:, None]", p["use_exp2"])
    # log-softmax: inv holds log(sum) and the write is x - max - log(sum)
    y = f"(x - {m}[:, None]) - {inv}[:, None]" if p.get("log") else f"{e} * {inv}[:, None]"
    return _loop(f'''
{_load(stream)}
y = {y}
tl.store(y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=col_mask)''')


def _inv(p, total: str) -> str:
    """What the write loop scales by: 1 / sum (softmax) or log(sum) (log-softmax)."""
    return f"tl.log({total})" if p.get("log") else f"1.0 / {total}"


def _one_pass_out(p) -> str:
    if p.get("log"):
        return '''lse = tl.log(tl.sum(e, axis=1))                                    # [ROWS] log of the row sum
tl.store(y_row + cols[None, :], ((x - m[:, None]) - lse[:, None]).to(y_ptr.dtype.element_ty), mask=col_mask)'''
    return '''inv = 1.0 / tl.sum(e, axis=1)                                      # [ROWS]
tl.store(y_row + cols[None, :], (e * inv[:, None]).to(y_ptr.dtype.element_ty), mask=col_mask)'''


def _one_pass_kernel(p):
    _, stream = C.cache_hints(p["cache_hints"])
    e = C.exp_expr("x - m[:, None]", p["use_exp2"])
    doc = '''
"""Tile [ROWS, BLOCK] (BLOCK = next_pow2(D)): whole rows in registers, x read once.
Masked lanes load -inf and contribute exp(-inf) = 0."""'''
    body = _ROWS + f'''
cols = tl.arange(0, BLOCK)
col_mask = row_mask[:, None] & (cols < D)[None, :]                 # [ROWS, BLOCK]
x = tl.load(x_row + cols[None, :], mask=col_mask, other=float("-inf"){stream}).to(tl.float32)
m = tl.max(x, axis=1)                                              # [ROWS] row max
e = {e}                                                            # in (0, 1]; NaN if the row is all -inf
{_one_pass_out(p)}'''
    return C.tiled_kernel("_softmax_one_pass", _ARGS + ", BLOCK: tl.constexpr", doc, "", body,
                          p["grid"] == "persistent")


def _online_kernel(p):
    keep, _ = C.cache_hints(p["cache_hints"])
    x2 = p["use_exp2"]
    if p["online"] == "chunk":
        doc = '''
"""Tile [ROWS, BLOCK_D] sliding along D. Loop 1: running row max m and sum s; each chunk's max
updates m and rescales s by exp(m_old - m_new) (one exp per element). Loop 2 writes
exp(x - m) / s. Reads x twice (the second time mostly from L2)."""'''
        stats = f'''
m = tl.full([ROWS], float("-inf"), dtype=tl.float32)               # running max
s = tl.zeros([ROWS], dtype=tl.float32)                             # sum of exp(x - m)
''' + _loop(f'''
{_load(keep)}
m_new = tl.maximum(m, tl.max(x, axis=1))
# rows that saw only -inf so far subtract 0: exp(-inf - 0) = 0, not exp(-inf + inf) = NaN
m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
s = s * {C.exp_expr("m - m_ref", x2)} + tl.sum({C.exp_expr("x - m_ref[:, None]", x2)}, axis=1)
m = m_new''') + ("\ninv = tl.log(s)                                                    # [ROWS]"
              if p.get("log") else "\ninv = 1.0 / s                                                      # [ROWS]")
    else:
        doc = '''
"""Tile [ROWS, BLOCK_D] sliding along D. Loop 1: every lane keeps its own running max and
rescaled sum (no cross-lane reduction inside the loop, two exps per element); the lanes are
merged once after the loop. Loop 2 writes exp(x - m) / s. Reads x twice."""'''
        stats = f'''
m_lane = tl.full([ROWS, BLOCK_D], float("-inf"), dtype=tl.float32)   # per-lane running max
s_lane = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)                 # per-lane sum of exp(x - m_lane)
''' + _loop(f'''
{_load(keep)}
m_new = tl.maximum(m_lane, x)
# lanes that saw only -inf so far subtract 0: exp(-inf - 0) = 0, not exp(-inf + inf) = NaN
m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
s_lane = s_lane * {C.exp_expr("m_lane - m_ref", x2)} + {C.exp_expr("x - m_ref", x2)}
m_lane = m_new''') + f'''
m = tl.max(m_lane, axis=1)                                         # [ROWS] row max
m_ref = tl.where(m == float("-inf"), 0.0, m)
inv = {_inv(p, "tl.sum(s_lane * " + C.exp_expr("m_lane - m_ref[:, None]", x2) + ", axis=1)")}'''
    body = _ROWS + "\n" + stats.strip("\n") + "\n" + _write_loop(p, "m", "inv")
    return C.tiled_kernel("_softmax_online",
                          _ARGS + ", BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr",
                          doc, "", body, p["grid"] == "persistent")


def _three_pass_kernel(p):
    keep, _ = C.cache_hints(p["cache_hints"])
    doc = '''
"""Tile [ROWS, BLOCK_D] sliding along D. Loop 1: row max (per-lane maxima, merged once).
Loop 2: sum of exp(x - max). Loop 3: write. Reads x three times (re-reads mostly from L2)."""'''
    body = _ROWS + "\nm_lane = tl.full([ROWS, BLOCK_D], float(\"-inf\"), dtype=tl.float32)\n" + _loop(f'''
{_load(keep)}
m_lane = tl.maximum(m_lane, x)''') + '''
m = tl.max(m_lane, axis=1)                                         # [ROWS]; -inf if the row is all -inf
acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
''' + _loop(f'''
{_load(keep)}
acc += {C.exp_expr("x - m[:, None]", p["use_exp2"])}''') + '''
inv = ''' + _inv(p, "tl.sum(acc, axis=1)") + '''                                    # [ROWS]
''' + _write_loop(p, "m", "inv")
    return C.tiled_kernel("_softmax_three_pass",
                          _ARGS + ", BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr",
                          doc, "", body, p["grid"] == "persistent")


def _launcher(p):
    if p["grid"] == "persistent":
        grid = "(min(num_tiles, _num_sms(x.device) * PROGS_PER_SM),)  # persistent programs"
    else:
        grid = "(num_tiles,)  # one tile per program"
    looped = "_softmax_three_pass" if p["variant"] == "three_pass" else "_softmax_online"
    select = C.select_src("_softmax_one_pass" if p["variant"] == "one_pass" else None, looped)
    return f'''

def kernel_fn(x):
    """Softmax over the last dim of x [..., D]; returns y shaped like x, in x's dtype."""
    D = x.shape[-1]
    out_shape = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()               # kernels assume unit stride along D; any row stride works
    x2 = x.reshape(-1, D)                # [N, D]: a view whenever the leading dims can merge
    N = x2.shape[0]
    y = torch.empty((N, D), dtype=x.dtype, device=x.device)
    if N == 0 or D == 0:
        return y.reshape(out_shape)
    block = _pow2(D)
{select}
    num_tiles = _cdiv(N, rows)
    grid = {grid}
    kernel[grid](x2, y, N, D, x2.stride(0), num_tiles, **meta,
                 num_warps=NUM_WARPS, num_stages=stages)
    return y.reshape(out_shape)
'''


def render(params, log: bool = False) -> str:
    """Complete candidate source for one point of SPACE (missing params take DEFAULT values);
    ``log``: log-softmax, y = x - max - log(sum(exp(x - max)))."""
    p = C.resolve(NAME, SPACE, DEFAULT, params)
    p["log"] = log
    v = p["variant"]
    if v == "one_pass":
        traffic = ("reads x once and writes y once (2*N*D*itemsize) when next_pow2(D) <= 65536;\n"
                   "wider rows use the online kernel, which reads x twice")
    elif v == "online":
        traffic = "reads x twice (the second time mostly from L2) and writes y once"
    else:
        traffic = "reads x three times (re-reads mostly from L2) and writes y once"
    what = ("Log-softmax candidate ({v}, {g} grid): y = x - max - log(sum(exp(x - max))), last dim."
            if log else "Softmax candidate ({v}, {g} grid): y = exp(x - max) / sum(exp(x - max)), last dim.")
    doc = f'''"""{what.format(v=v, g=p["grid"])}

x [..., D] is viewed as [N, D] (leading dims merged; any row stride, unit column stride);
y [N, D] is written contiguous in x's dtype; all arithmetic in fp32. A row that is all -inf
gives NaN, like torch.
Bytes the op must move: 2*N*D*itemsize (read x, write y).
This variant {traffic}.
Point: {C.point_line(SPACE, p)}
"""
{C.IMPORTS_SRC}
ROWS_PER_PROG = {p["rows_per_prog"]}   # rows per program tile (halved at launch to fit MAX_TILE)
BLOCK_D = {p["block_d"]}        # chunk width of the looped kernels
NUM_WARPS = {p["num_warps"]}
NUM_STAGES = {p["num_stages"]}       # software-pipelining depth of the chunk loops
PROGS_PER_SM = {p["progs_per_sm"]}     # persistent grid only
'''
    parts = [doc, C.FIT_ROWS_SRC]
    if p["grid"] == "persistent":
        parts.append(C.NUM_SMS_SRC)
    parts.append("\n")
    if v == "one_pass":
        parts.append(_one_pass_kernel(p) + "\n")
    parts.append(_three_pass_kernel(p) if v == "three_pass" else _online_kernel(p))
    parts.append(_launcher(p))
    return C.tidy("\n".join(parts))


# ---------------------------------------------------------------------------------------------
# spellings: how model code writes it (kernels/patterns.py)
# ---------------------------------------------------------------------------------------------

def _manual(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def _manual_max(x):
    e = torch.exp(x - torch.max(x, -1, keepdim=True)[0])
    return e / torch.sum(e, -1, keepdim=True)


def _manual_log(x):
    m = x.amax(-1, keepdim=True)
    return (x - m) - torch.log(torch.exp(x - m).sum(-1, keepdim=True))


_X = (("x", T((4, 16))),)
# every spelling subtracts the max (or is torch's own op): exp(x) / sum(exp(x)) overflows at
# large x and is another function; it stays out
SPELLINGS = (
    Spelling("softmax", lambda x: torch.softmax(x, -1), _X, free_dims=True),
    Spelling("log_softmax", lambda x: torch.log_softmax(x, -1), _X, free_dims=True),
    Spelling("amax_exp_sum", _manual, _X, free_dims=True),
    Spelling("max_exp_sum", _manual_max, _X, free_dims=True),
    Spelling("logsumexp", lambda x: x - torch.logsumexp(x, -1, keepdim=True), _X, free_dims=True),
    Spelling("amax_log_sum_exp", _manual_log, _X, free_dims=True),
)
_LOG = ("log_softmax", "logsumexp", "amax_log_sum_exp")


def from_match(m):
    """Softmax (or log-softmax) over the last dim, output in x's dtype."""
    x, out = m.meta("x"), m.out_meta()
    if x is None or not x["dtype"].is_floating_point or out is None:
        return None
    dims = from_end(m.captures.get("dims", (-1,)), len(x["shape"]))
    log = m.pattern.split("/")[1] in _LOG
    what = "log-softmax" if log else "softmax"
    if len(dims) != 1:
        return None
    if dims != (-1,):
        raise NoFit(f"{what} over dim {dims[0]}: the kernels run over the last dim")
    if out["dtype"] != x["dtype"]:
        raise NoFit(f"{what} of {x['dtype']} into {out['dtype']}: the contract returns x's dtype")
    return Fit({"log": True} if log else {}, tuple(x["shape"]), {"x": Ref("x")})


# log-softmax outputs are x - max - log(sum): the log of an fp32 sum of D terms carries an
# absolute error of a few fp32 ulps of 1 whatever the output's size (near 0 for the row max),
# so atol is 64 ulps of 1.0; rtol covers x - max and the output's rounding, as for softmax.
LOG_TOLERANCE = {
    torch.float32: (64 * 2.0**-24, 1e-5),
    torch.float16: (1e-3, 2e-3),
    torch.bfloat16: (8e-3, 1.6e-2),
}


def configure(spec: dict) -> Family:
    """``spec["log"]``: log-softmax over the last dim (x - max - log(sum(exp(x - max))))."""
    if set(spec) - {"log"}:
        raise ValueError(f"softmax takes a spec {{log: bool}}; got {spec!r}")
    if not spec.get("log"):
        return FAMILY
    return dataclasses.replace(
        FAMILY, reference=lambda x: torch.log_softmax(x, dim=-1), tolerance=LOG_TOLERANCE,
        render=lambda params: render(params, log=True),
        signature="kernel_fn(x) -> log_softmax(x, -1)",
        description="Log-softmax over the last dim (torch.log_softmax(x, dim=-1)).",
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
    profile_ops=("aten::softmax", "aten::_softmax", "aten::_safe_softmax"),
    description="Softmax over the last dim (torch.softmax(x, dim=-1)).",
    notes={"one_pass_max_block": 65536, "max_tile_elems": 65536,
           "all_neg_inf_row": "NaN, like torch"},
)
