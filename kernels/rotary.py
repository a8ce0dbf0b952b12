"""Rotary family: y = x * cos + rotate_half(x) * sin, the rotate-half RoPE of LLaMA/Mistral.

x [B, H, S, Dh] (q or k after their projection), cos, sin [S, Dh] (the tables of
engine/models.py rotary_tables, rows sliced to the sequence): with x1 = x[..., :Dh/2] and
x2 = x[..., Dh/2:], rotate_half(x) = cat(-x2, x1), so
    y[..., :Dh/2] = x1 * cos[:, :Dh/2] - x2 * sin[:, :Dh/2]
    y[..., Dh/2:] = x2 * cos[:, Dh/2:] + x1 * sin[:, Dh/2:]
(engine/models.py apply_rotary). Dh is even. The shape is x's; x is made as the model passes it:
the [B, S, H, Dh] -> [B, H, S, Dh] transposed view of a projection's output (any strides must
work), cos/sin contiguous in x's dtype (the model's buffers follow its dtype). The output is
contiguous, in x's dtype (float32 when cos/sin have another dtype: torch's promotion).

Bytes the op must move: 2*B*H*S*Dh*itemsize (read x, write y) + 2*S*Dh*itemsize (the tables);
3 flops per element: memory bound at every shape. The search is about reusing the cos/sin rows
across heads and how rows map onto programs.

Search space (``SPACE``), rendered by ``render`` into one self-contained candidate source:
- variant "rows": a program rotates ROWS rows of the flattened [B*H*S, Dh] view, each loading
  its own cos/sin row (from L1/L2 after the first head).
- variant "heads_loop": a program owns ROWS positions of one batch and loops over the H heads,
  loading their cos/sin rows once (registers) for all heads.
- rows_per_prog, num_warps, cache_hints (evict_last on the tables, evict_first on x).
The half-row width BLOCK = next_pow2(Dh / 2) is chosen at launch; a [ROWS, BLOCK] tile is capped
at 16384 elements (ROWS halves until it fits).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch
import torch.nn.functional as F

from kernels import Family
from kernels import _common as C
from kernels import matmul as MM
from kernels.patterns import Fit, NoFit, Ref, Spelling, T

NAME = "rotary"
SIGNATURE = "kernel_fn(x, cos, sin)"
ARG_NAMES = ("x", "cos", "sin")
ADVERSARIAL = ("huge", "tiny", "mixed_scale", "heavy_tail", "random_tables")
THETA = 10000.0


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def reference(x, cos, sin):
    """engine/models.py apply_rotary, without its profiler scope."""
    return x * cos + rotate_half(x) * sin


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------

def tables(s: int, dh: int, theta: float = THETA):
    """cos, sin [S, Dh] float32 for positions 0..S-1 (frequencies repeated twice, as
    engine/models.py rotary_tables)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
    angles = torch.outer(torch.arange(s, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


_HUGE = {torch.float16: 2e4, torch.bfloat16: 1e30, torch.float32: 1e30}
_LIMIT = {torch.float16: 3e4, torch.bfloat16: 1e32, torch.float32: 1e32}   # |y| <= sqrt(2) |x|


def make_inputs(shape, dtype, device, gen, kind="normal"):
    """{x: [B, H, S, Dh] (a transposed view of [B, S, H, Dh]), cos, sin: [S, Dh]} from ``gen``."""
    dtype = C.as_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    if len(shape) != 4 or shape[-1] % 2:
        raise ValueError(f"rotary takes x [B, H, S, Dh] with Dh even, got {shape}")
    b, h, s, dh = shape
    n = b * s * h
    cos, sin = tables(s, dh)
    if kind == "normal":
        x = C.randn(gen, n, dh)
    elif kind == "huge":
        x = C.randn(gen, n, dh) * _HUGE[dtype]
    elif kind == "tiny":
        x = C.randn(gen, n, dh) * C.log_uniform(gen, n, -6.0, -4.0)   # fp16 subnormals
    elif kind == "mixed_scale":
        x = C.randn(gen, n, dh) * C.log_uniform(gen, n, -3.0, 3.0)
    elif kind == "heavy_tail":
        x = C.cauchy(gen, n, dh)
    elif kind == "random_tables":
        # arbitrary tables: real ones repeat their halves (cos[:, :Dh/2] == cos[:, Dh/2:]) and
        # satisfy cos^2 + sin^2 = 1, which would hide a kernel that reads the wrong half
        x = C.randn(gen, n, dh)
        cos, sin = C.randn(gen, s, dh), C.randn(gen, s, dh)
    else:
        raise ValueError(f"unknown input kind {kind!r}; known: normal, {', '.join(ADVERSARIAL)}")
    lim = _LIMIT[dtype]
    x = x.clamp(-lim, lim).reshape(b, s, h, dh).to(dtype).to(device).transpose(1, 2)
    return {"x": x, "cos": cos.to(dtype).to(device), "sin": sin.to(dtype).to(device)}


def error_bound(x, cos, sin):
    """|x| * |cos| + |rotate_half(x)| * |sin|: the two products' magnitude, which bounds the
    rounding error of their sum (it cancels where the rotation lands near 0)."""
    return x.abs() * cos.abs() + rotate_half(x).abs() * sin.abs()


# |out - expected| <= atol + rtol*|expected| + stol*bound, expected = fp64 reference cast to the
# output dtype. rtol: the output's rounding (2 ulps of fp16/bf16); stol: two ulps of the dtype of
# the products' magnitude, so a kernel may compute in fp32 or, as eager PyTorch does, round
# x*cos and rotate_half(x)*sin to the dtype first. Reading the wrong half, the wrong sign or the
# wrong table row is off by O(bound).
# (TOLERANCE[dtype] = (atol, rtol), BOUND_TOL[dtype] = stol)
TOLERANCE = {
    torch.float32: (0.0, 1e-6),
    torch.float16: (1.2e-7, 2e-3),
    torch.bfloat16: (0.0, 1.6e-2),
}
BOUND_TOL = {
    torch.float32: 2.0**-22,
    torch.float16: 2.0**-10,
    torch.bfloat16: 2.0**-7,
}


def cost(shape, dtype):
    """(bytes, flops): read x once, write y once, read cos and sin once; 2 multiplies and an add
    per element."""
    item = C.itemsize(dtype)
    b, h, s, dh = (int(v) for v in shape)
    return (2 * b * h * s * dh + 2 * s * dh) * item, 3 * b * h * s * dh


# q and k of Llama-2-7B (32 heads), Mistral/Llama-3 (8 kv heads) at 2k/4k/8k tokens, GPT-NeoX-ish
# head widths, and odd sizes.
BENCH_SHAPES = ((4, 32, 4096, 128), (1, 32, 2048, 128), (1, 8, 2048, 128), (4, 8, 4096, 128),
                (1, 32, 8192, 128), (8, 12, 1024, 64), (3, 5, 1000, 64), (2, 3, 37, 96))
# Under the interpreter the verifier keeps numel <= 2^15 (one program per row or few: keep the
# row counts small); the last two are for GPUs.
SWEEP_SHAPES = ((1, 1, 1, 2), (2, 3, 5, 8), (2, 4, 32, 16), (1, 2, 33, 64), (3, 2, 17, 128),
                (1, 1, 100, 96), (2, 2, 7, 80), (1, 8, 16, 64), (1, 32, 512, 128),
                (2, 8, 1024, 64))
EDGE_SHAPES = ((1, 1, 1, 2), (1, 1, 1, 256), (5, 3, 7, 2), (1, 1, 1031, 4), (13, 1, 1, 64),
               (1, 64, 3, 128), (1, 32, 4099, 128))


# ---------------------------------------------------------------------------------------------
# search space and rendering
# ---------------------------------------------------------------------------------------------

SPACE = {
    "variant": ["rows", "heads_loop"],
    "rows_per_prog": [4, 8, 16, 32, 64],
    "num_warps": [1, 2, 4, 8],
    "cache_hints": [False, True],
}
DEFAULT = {"variant": "rows", "rows_per_prog": 16, "num_warps": 4, "cache_hints": False}

_ARGS = ("x_ptr, cos_ptr, sin_ptr, y_ptr, B, H, S, HALF,\n"
         "                stride_xb, stride_xh, stride_xs, stride_xd,\n"
         "                stride_cs, stride_cd, stride_ss, stride_sd,\n"
         "                ROWS: tl.constexpr, BLOCK: tl.constexpr")

_ROTATE = '''
x1 = tl.load(x_row + cols[None, :] * stride_xd, mask=mask, other=0.0{stream}).to(tl.float32)
x2 = tl.load(x_row + (cols + HALF)[None, :] * stride_xd, mask=mask, other=0.0{stream}).to(tl.float32)
# the reference's order: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1)
y1 = x1 * c1 + (-x2) * s1
y2 = x2 * c2 + x1 * s2
tl.store(y_row + cols[None, :], y1.to(y_ptr.dtype.element_ty), mask=mask)
tl.store(y_row + (cols + HALF)[None, :], y2.to(y_ptr.dtype.element_ty), mask=mask)'''

_TABLES = '''
c_row = cos_ptr + pos[:, None] * stride_cs                         # [ROWS, 1]
s_row = sin_ptr + pos[:, None] * stride_ss
c1 = tl.load(c_row + cols[None, :] * stride_cd, mask=mask, other=0.0{keep}).to(tl.float32)
c2 = tl.load(c_row + (cols + HALF)[None, :] * stride_cd, mask=mask, other=0.0{keep}).to(tl.float32)
s1 = tl.load(s_row + cols[None, :] * stride_sd, mask=mask, other=0.0{keep}).to(tl.float32)
s2 = tl.load(s_row + (cols + HALF)[None, :] * stride_sd, mask=mask, other=0.0{keep}).to(tl.float32)'''


def _rows_kernel(p):
    keep, stream = C.cache_hints(p["cache_hints"])
    return f'''@triton.jit
def _rope_rows({_ARGS}):
    """Tile [ROWS, BLOCK] of the flattened rows r = (b * H + h) * S + s, both halves of each row;
    every row loads its own cos/sin row."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)   # [ROWS]
    row_ok = rows < B * H * S
    pos = rows % S                                                 # position s: the table row
    bh = rows // S
    x_row = (x_ptr + (bh // H) * stride_xb + (bh % H) * stride_xh + pos * stride_xs)[:, None]
    y_row = y_ptr + rows[:, None] * (2 * HALF)                     # y contiguous [B, H, S, Dh]
    cols = tl.arange(0, BLOCK)                                     # [BLOCK] within a half
    mask = row_ok[:, None] & (cols < HALF)[None, :]
{C.indent(_TABLES.format(keep=keep), 4)}
{C.indent(_ROTATE.format(stream=stream), 4)}
'''


def _heads_kernel(p):
    keep, stream = C.cache_hints(p["cache_hints"])
    return f'''@triton.jit
def _rope_heads({_ARGS}):
    """Program (position block, batch): ROWS positions of one batch; their cos/sin rows are
    loaded once and applied to every one of the H heads in turn."""
    pos = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)    # [ROWS] positions
    b = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = (pos < S)[:, None] & (cols < HALF)[None, :]
{C.indent(_TABLES.format(keep=keep), 4)}
    for h in range(0, H):
        x_row = (x_ptr + b * stride_xb + h * stride_xh + pos * stride_xs)[:, None]
        y_row = y_ptr + ((b * H + h) * S + pos)[:, None] * (2 * HALF)
{C.indent(_ROTATE.format(stream=stream), 8)}
'''


def _launcher(p):
    if p["variant"] == "rows":
        launch = '''rows = _fit_rows(ROWS_PER_PROG, block)
    _rope_rows[(_cdiv(B * H * S, rows),)](
        x, cos2, sin2, y, B, H, S, half, *x.stride(), *cos2.stride(), *sin2.stride(),
        ROWS=rows, BLOCK=block, num_warps=NUM_WARPS)'''
    else:
        launch = '''rows = _fit_rows(ROWS_PER_PROG, block)
    _rope_heads[(_cdiv(S, rows), B)](
        x, cos2, sin2, y, B, H, S, half, *x.stride(), *cos2.stride(), *sin2.stride(),
        ROWS=rows, BLOCK=block, num_warps=NUM_WARPS)'''
    return f'''

def _fit_rows(rows, block):
    """Largest power of two <= rows such that a [rows, block] tile stays within MAX_TILE."""
    while rows > 1 and rows * block > MAX_TILE:
        rows //= 2
    return rows


def kernel_fn(x, cos, sin):
    """Rotate-half RoPE of x [B, H, S, Dh] (any strides) by cos, sin [S, Dh] (or with leading
    dims of 1); returns y [B, H, S, Dh] contiguous."""
    squeeze = x.dim() == 3
    if squeeze:
        x = x.unsqueeze(0)                                         # [H, S, Dh] -> [1, H, S, Dh]
    if x.dim() != 4:
        raise ValueError(f"rotary takes x [B, H, S, Dh], got {{list(x.shape)}}")
    B, H, S, Dh = x.shape
    if Dh % 2:
        raise ValueError(f"rotary needs an even head width, got {{Dh}}")
    cos2 = cos.reshape(cos.shape[-2], cos.shape[-1])               # [S, Dh] (a view: leading 1s)
    sin2 = sin.reshape(sin.shape[-2], sin.shape[-1])
    if cos2.shape != (S, Dh) or sin2.shape != (S, Dh):
        raise ValueError(f"cos/sin must be [S, Dh] = [{{S}}, {{Dh}}], got {{list(cos.shape)}}")
    same = cos.dtype == x.dtype and sin.dtype == x.dtype
    out_dtype = x.dtype if same else torch.float32                 # torch's type promotion
    y = torch.empty((B, H, S, Dh), dtype=out_dtype, device=x.device)
    if y.numel() > 0:
        half = Dh // 2
        block = _pow2(half)
        {launch}
    return y[0] if squeeze else y
'''


def render(params) -> str:
    """Complete candidate source for one point of SPACE (missing params take DEFAULT values)."""
    p = C.resolve(NAME, SPACE, DEFAULT, params)
    if p["variant"] == "rows":
        how = "one program per ROWS flattened rows, each row loading its own cos/sin row"
    else:
        how = "one program per (ROWS positions, batch), looping over the heads: cos/sin loaded once"
    doc = f'''"""Rotary candidate ({p["variant"]}): y = x * cos + rotate_half(x) * sin (rotate-half RoPE).

x [B, H, S, Dh], any strides; cos, sin [S, Dh]; y contiguous. Computed in fp32, rounded once.
Bytes the op must move: 2*B*H*S*Dh*itemsize + 2*S*Dh*itemsize (x, y, the tables): {how}.
Point: {C.point_line(SPACE, p)}
"""
{C.IMPORTS_SRC}
ROWS_PER_PROG = {p["rows_per_prog"]}   # rows (positions) per program
NUM_WARPS = {p["num_warps"]}
MAX_TILE = 16384       # elements of a [ROWS, BLOCK] tile (each of x1, x2, c1, c2, s1, s2)
'''
    kernel = _rows_kernel(p) if p["variant"] == "rows" else _heads_kernel(p)
    return C.tidy("\n".join([doc, "\n", kernel, _launcher(p)]))


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
    description="Rotate-half rotary embedding: x * cos + rotate_half(x) * sin, x [B, H, S, Dh].",
    notes={"convention": "rotate-half (engine/models.py apply_rotary)", "bound": "memory"},
    error_bound=error_bound,
    bound_tol=BOUND_TOL,
)


# ---------------------------------------------------------------------------------------------
# spellings: how model code writes it (kernels/patterns.py)
# ---------------------------------------------------------------------------------------------

def _half_slices(x):                     # HF LLaMA / Mistral / Qwen2 / GPT-NeoX rotate_half
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def _half_chunk(x):                      # the zoo's rotate_half
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x):                 # GPT-J / interleaved pairs (x0, x1), (x2, x3), ...
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


_ROT = {"half": _half_slices, "chunk": _half_chunk, "interleaved": rotate_every_two}


def _spelling(rot):
    def fn(x, cos, sin):
        return x * cos + _ROT[rot](x) * sin
    return Spelling(f"{rot}", fn, (("x", T((2, 4, 8, 16))), ("cos", T((8, 16))), ("sin", T((8, 16)))))


def _complex_spelling(x, f):
    # Meta's LLaMA (and Mistral's, torchtitan's) reference code: pairs (x[2i], x[2i+1]) as
    # complex numbers times freqs_cis = cos + i sin; x [B, S, H, Dh] in its projection's layout,
    # f [1, S, 1, Dh/2] complex. The same rotation as interleaved pairs.
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * f).flatten(3)


def _pairs_spelling(x, f):
    # the complex product written out on real pairs (gpt-fast): f [1, S, 1, Dh/2, 2] holds
    # (cos, sin) of each pair's angle; x [B, S, H, Dh] in its projection's layout
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    y = torch.stack([xs[..., 0] * f[..., 0] - xs[..., 1] * f[..., 1],
                     xs[..., 1] * f[..., 0] + xs[..., 0] * f[..., 1]], -1)
    return y.flatten(3)


# rotate-half written on the two halves, its tables half as wide (cos, sin [.., S, Dh/2]: each
# frequency once, not twice as the contract's); GPT-OSS's _apply_rotary_emb takes them by chunk
_HALVES = {"half_tables": lambda x: x.chunk(2, dim=-1),
           "half_tables_slices": lambda x: (x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:])}


def _half_tables_spelling(halves):
    def fn(x, cos, sin):
        x1, x2 = _HALVES[halves](x)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return Spelling(halves, fn, (("x", T((2, 4, 8, 16))), ("cos", T((8, 8))), ("sin", T((8, 8)))))


SPELLINGS = tuple(_spelling(r) for r in _ROT) + tuple(map(_half_tables_spelling, _HALVES)) + (
    Spelling("complex", _complex_spelling,
             (("x", T((2, 8, 4, 16))), ("f", T((1, 8, 1, 8), "complex64")))),
    Spelling("pairs", _pairs_spelling, (("x", T((2, 8, 4, 16))), ("f", T((1, 8, 1, 8, 2))))),)


def _table_ref(m, name, b, s, dh):
    """cos/sin as the contract takes them ([S, Dh], leading dims of 1 allowed), from a table
    that broadcasts over x [B, H, S, Dh]: per position only, or per batch too when every batch
    row is the same (a constant: position ids from arange). None when it is neither."""
    t = m.meta(name)
    if t is None:
        return None
    shape = (1,) * (4 - len(t["shape"])) + tuple(t["shape"])
    if len(shape) != 4 or shape[1] != 1 or shape[2:] != (s, dh):
        return None
    rank = len(t["shape"])
    if shape[0] == 1:
        return Ref(name)
    if shape[0] != b:
        return None
    _same_every_row(m, name, b)
    return Ref(name, (("select", 0, 0),) if rank == 4 else (("select", 0, 0),))


def _same_every_row(m, name, b):
    """A table with a batch dim is served only when it is a constant the same in every row
    (position ids from arange); NoFit otherwise."""
    c = m.const(name)
    if c is None:
        raise NoFit(f"{name} differs per batch row (position ids among the inputs): the contract "
                    f"takes one table for every row")
    c = c.reshape(b, -1)
    if not bool((c == c[:1]).all()):
        raise NoFit(f"{name} differs per batch row: the contract takes one table for every row")


def _bshd_table_ref(m, name, b, s, dh):
    """A table broadcasting over x [B, S, H, Dh] (the projection's layout, before the heads
    move forward: GPT-J, Meta's LLaMA) as [S, 1, Dh] or [1 | B, S, 1, Dh], viewed as the
    contract's [S, Dh]; None when it is not one."""
    t = m.meta(name)
    if t is None or len(t["shape"]) not in (3, 4):
        return None
    shape = (1,) * (4 - len(t["shape"])) + tuple(t["shape"])
    if shape[1:] != (s, 1, dh) or shape[0] not in (1, b):
        return None
    views = ()
    if shape[0] != 1:                       # per batch row: one table when every row is the same
        _same_every_row(m, name, b)
        views = (("select", 0, 0),)
    return Ref(name, views + (("reshape", [s, dh]),))


def _bshd_post(m) -> tuple:
    """The kernel's result back in the projection's layout: a transposed view of its contiguous
    [B, H, S, Dh], made contiguous where an op after the match is a view (which refuses it)."""
    viewed = any(getattr(u.target, "__name__", "").split(".")[0] == "view" for u in m.output.users)
    return (("transpose", 1, 2),) + ((("contiguous",),) if viewed else ())


def _complex_fit(m, x, style):
    """Meta's LLaMA spelling: x [B, S, H, Dh] as Dh/2 complex pairs times f [1, S, 1, Dh/2]
    (cos + i sin), computed in fp32 and cast back to x's dtype: the interleaved contract on
    the transposed view of x, its tables the real and imaginary parts of f, each twice; with
    the heads before the positions (DeepSeek-V2: x [B, H, S, Dh], f [1, 1, S, Dh/2]) on x as it
    is. The "pairs" spelling: the same product on real pairs, f [.., Dh/2, 2] of (cos, sin)."""
    shape = tuple(x["shape"])
    if len(shape) != 4:
        raise NoFit(f"x of rank {len(shape)}: the contract takes x [B, S, H, Dh] or [B, H, S, Dh] here")
    b, a1, a2, dh = shape
    f = m.meta("f")
    pairs = style == "pairs"
    if f is None or (pairs and (not f["dtype"].is_floating_point or tuple(f["shape"])[-1:] != (2,))):
        return None
    if not pairs and not f["dtype"].is_complex:
        return None
    lead = tuple(f["shape"])[:-1] if pairs else tuple(f["shape"])
    fs = (1,) * (4 - len(lead)) + lead
    if fs == (1, a1, 1, dh // 2):            # Meta's layout: x [B, S, H, Dh]
        s, h, heads_first = a1, a2, False
    elif fs == (1, 1, a2, dh // 2):          # the heads first: x [B, H, S, Dh]
        h, s, heads_first = a1, a2, True
    else:
        raise NoFit(f"freqs_cis {list(f['shape'])} broadcasts neither as [1, S, 1, Dh/2] nor as "
                    f"[1, 1, S, Dh/2] over x {list(shape)}: the contract takes one table for "
                    f"every batch row and head")
    out = m.out_meta()
    if out is None or out["dtype"] != x["dtype"]:
        raise NoFit("the complex product stays in float32 after the match (no cast back to x's "
                    "dtype): the contract's output is in x's dtype")
    dt = str(x["dtype"]).replace("torch.", "")

    def table(part):
        real = (("reshape", [s, dh // 2, 2]),) if pairs else (("reshape", [s, dh // 2]),
                                                              ("view_as_real",))
        return Ref("f", real + (("select", -1, part), ("repeat_interleave", 2, -1), ("to", dt)))
    x_ref = Ref("x") if heads_first else Ref("x", (("transpose", 1, 2),))
    fit = Fit({"style": "interleaved"}, (b, h, s, dh), {"x": x_ref, "cos": table(0), "sin": table(1)},
              post=() if heads_first else _bshd_post(m))
    return _with_projection(m, fit, heads_first)


def _with_projection(m, plain: Fit, heads_first: bool) -> Fit:
    """``plain`` with x's projection fused in where x is one (``Match.projection_of``: the
    heads split out and moved forward, or, ``heads_first`` False, x still [B, S, H, Dh]); else
    ``plain`` as it is."""
    proj = m.projection_of("x", heads_first=heads_first)
    return plain if proj is None else _projection_fit(m, proj, plain)


def from_match(m):
    """RoPE of x [B, H, S, Dh] (or a slice of it, partial rotary) by tables broadcasting as
    [S, Dh]; rotate-half, or interleaved pairs (spec style); x [B, S, H, Dh] with tables
    [.., S, 1, Dh] (the heads still third) through its transposed view; the complex spelling."""
    x = m.meta("x")
    if x is None or not x["dtype"].is_floating_point:
        return None
    style = m.pattern.split("/")[1]
    if style in ("complex", "pairs"):
        return _complex_fit(m, x, style)
    shape = tuple(x["shape"])
    if len(shape) != 4:
        raise NoFit(f"x of rank {len(shape)}: the contract takes x [B, H, S, Dh]")
    b, h, s, dh = shape
    if dh % 2:
        return None
    tw = dh // 2 if style in _HALVES else dh     # the tables' width in the model
    refs = {n: _table_ref(m, n, b, s, tw) for n in ("cos", "sin")}
    post = ()
    if any(r is None for r in refs.values()):
        # the projection's layout: x [B, S, H, Dh] (here b, h, s = B, S, H)
        refs = {n: _bshd_table_ref(m, n, b, h, tw) for n in ("cos", "sin")}
        if any(r is None for r in refs.values()):
            return None
        shape, post = (b, s, h, dh), _bshd_post(m)
        refs["x"] = Ref("x", (("transpose", 1, 2),))
    else:
        refs["x"] = Ref("x")
    if tw != dh:                 # [S, Dh/2] -> the contract's [S, Dh]: each half the same table
        for n in ("cos", "sin"):
            refs[n] = Ref(n, refs[n].views + (("reshape", [shape[2], tw]), ("repeat", [1, 2])))
    if m.meta("cos")["dtype"] != x["dtype"] or m.meta("sin")["dtype"] != x["dtype"]:
        raise NoFit("tables in another dtype than x: the contract takes one")
    spec = {"style": "interleaved"} if style == "interleaved" else {}
    fit = Fit(spec, shape, {"x": refs["x"], "cos": refs["cos"], "sin": refs["sin"]}, post=post)
    return _with_projection(m, fit, heads_first=not post)


def _projection_fit(m, proj, plain: Fit) -> Fit:
    """x is a q or k projection's output with its heads split out, read by the rotation alone
    (``Match.projection_of``): the projection joins the match (spec linear, the rotation's
    style), hidden [B, S, K] and the weight (and a bias) the kernel's arguments, the plain
    fit's post ops after it (x rotated in [B, S, H, Dh]: the result transposed back); the plain
    rotation of x its fallback."""
    hidden, weight, bias, between = proj
    b, h, s, dh = plain.shape
    hv = hidden.meta["val"]
    k = int(hv.shape[-1])
    m.rebind("hidden", hidden, through=between)
    m.rebind("weight", weight)
    hid = (Ref("hidden") if hv.dim() == 3 and tuple(hv.shape[:2]) == (b, s)
           else Ref("hidden", (("reshape", [b, s, k]),)))        # [B*S, K] of an mm
    args = {"hidden": hid, "weight": Ref("weight"), "cos": plain.args["cos"], "sin": plain.args["sin"]}
    spec = {"linear": True, **plain.spec}
    if bias is not None:
        m.rebind("bias", bias)
        spec["bias"] = True
        args["bias"] = Ref("bias")
    return Fit(spec, (b, s, k, h, dh), args, post=plain.post, fallback=plain)


def _interleaved_reference(x, cos, sin):
    return x * cos + rotate_every_two(x) * sin


def _interleaved_bound(x, cos, sin):
    return x.abs() * cos.abs() + rotate_every_two(x).abs() * sin.abs()


def interleaved_tables(s: int, dh: int, theta: float = THETA):
    """cos, sin [S, Dh] float32 in the interleaved layout: each frequency twice in a row."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
    ang = torch.outer(torch.arange(s, dtype=torch.float32), inv_freq).repeat_interleave(2, dim=-1)
    return ang.cos(), ang.sin()


def _interleaved_inputs(shape, dtype, device, gen, kind="normal"):
    """The family's inputs with tables in the interleaved layout."""
    inp = make_inputs(shape, dtype, device, gen, kind)
    if kind != "random_tables":
        cos, sin = interleaved_tables(int(shape[2]), int(shape[3]))
        inp["cos"] = cos.to(C.as_dtype(dtype)).to(device)
        inp["sin"] = sin.to(C.as_dtype(dtype)).to(device)
    return inp


# the rotations by spec style: (reference, error_bound, tables)
_STYLES = {"half": (reference, error_bound, tables),
           "interleaved": (_interleaved_reference, _interleaved_bound, interleaved_tables)}


# ---------------------------------------------------------------------------------------------
# the projection fused in (spec {"linear": true}): RoPE in the q/k projection's epilogue
# ---------------------------------------------------------------------------------------------
# LLaMA, Mistral, Qwen2 and Gemma project q and k, split the heads out and rotate them:
#     q = q_proj(h).view(B, S, H, Dh).transpose(1, 2);  q = q * cos + rotate_half(q) * sin
# Apart, the projection writes q [B, S, H*Dh] and the rotary op reads it back and writes it again
# (2 * B*S*H*Dh*itemsize more traffic: 32 MB for LLaMA-3-8B's q at 1 x 2048 in bf16). Neither
# eager nor torch.compile fuses the two (a rotated element needs its partner half Dh/2 columns
# away: no pointwise epilogue of the GEMM's own tile). Fused, a tile holds whole heads and
# rotates their halves acc1 = h @ w[head, :Dh/2]^T and acc2 = h @ w[head, Dh/2:]^T in registers
# before the one store (the pointer tile accumulates them apart, sharing every loaded tile of h;
# the TMA tile is one [BLOCK_M, HEADS * Dh] accumulator split into them):
#     y1 = acc1 * cos1 - acc2 * sin1,   y2 = acc2 * cos2 + acc1 * sin2.
#
# Shape (B, S, K, H, Dh): hidden [B, S, K], weight [H*Dh, K] (nn.Linear's layout), the
# tables cos, sin [S, Dh] (leading dims of 1 allowed), an optional bias [H*Dh] (Qwen2's
# q/k projections); the result y [B, H, S, Dh], a transposed view of a contiguous
# [B, S, H, Dh], the layout the model's own rotation returns. Precision: fp32 accumulation
# (fp32 operands without TF32), the rotation in fp32, rounded once.

LINEAR_ARGS = ("hidden", "weight", "cos", "sin")


def linear_problem(shape) -> tuple[int, int, int, int, int]:
    """(B, S, K, H, Dh) of a family shape; Dh even."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 5 or shape[-1] % 2 or min(shape) < 1:
        raise ValueError(f"a rotary+linear shape is (B, S, K, H, Dh) with Dh even, got {shape}")
    return shape


def linear_reference(hidden, weight, cos, sin, bias=None, style="half"):
    """RoPE of the projection as the model computes it: F.linear, the heads split out and
    moved forward, the rotation of ``style`` (float64 operands: the ground truth)."""
    b, s, _ = hidden.shape
    dh = cos.shape[-1]
    q = F.linear(hidden, weight, bias).view(b, s, weight.shape[0] // dh, dh).transpose(1, 2)
    return _STYLES[style][0](q, cos.reshape(s, dh), sin.reshape(s, dh))


def linear_bound(hidden, weight, cos, sin, bias=None, style="half"):
    """The rotation's error_bound on the projection's magnitude |hidden| @ |weight|^T (+ |bias|),
    times max(1, sqrt(K) / 8) (fp32 accumulation, as the matmul family's bound)."""
    b, s, k = hidden.shape
    dh = cos.shape[-1]
    x, w = hidden.abs(), weight.abs()
    if x.dtype != torch.float64:
        x, w = x.float(), w.float()
    mag = x @ w.t()
    if bias is not None:
        mag = mag + bias.abs().to(mag.dtype)
    mag = mag.view(b, s, weight.shape[0] // dh, dh).transpose(1, 2)
    return _STYLES[style][1](mag, cos.reshape(s, dh).to(mag.dtype), sin.reshape(s, dh).to(mag.dtype)) \
        * max(1.0, math.sqrt(k) / 8.0)


# stol on the bound above: 64 fp32 ulps of accumulation (matmul's), plus for 16-bit operands the
# model's own roundings (q to the dtype before the rotation, the rotation's products: rotary's
# BOUND_TOL), which the eager baseline makes and the fused kernel need not
LINEAR_BOUND_TOL = {
    torch.float32: 64 * 2.0**-24 + BOUND_TOL[torch.float32],
    torch.float16: 64 * 2.0**-24 + 2.0**-11 + BOUND_TOL[torch.float16],
    torch.bfloat16: 64 * 2.0**-24 + 2.0**-8 + BOUND_TOL[torch.bfloat16],
}
# hidden's scale for "huge": the projection lands near fp16's top / far beyond fp32 LLM values
_LHUGE = {torch.float16: 2e3, torch.bfloat16: 1e15, torch.float32: 1e15}


def make_linear_inputs(shape, dtype, device, gen, kind="normal", style="half"):
    """{hidden [B, S, K], weight [H*Dh, K] (spread 1 / sqrt(K): q of unit spread), cos, sin
    [S, Dh] in ``style``'s layout} from ``gen``; kinds as the family's (hidden scaled),
    "random_tables" arbitrary tables (a kernel reading the wrong half or row of them shows)."""
    dtype = C.as_dtype(dtype)
    b, s, k, h, dh = linear_problem(shape)
    x = C.randn(gen, b * s, k)
    w = C.randn(gen, h * dh, k) * (1.0 / math.sqrt(k))
    cos, sin = _STYLES[style][2](s, dh)
    if kind == "huge":
        x = x * _LHUGE[dtype]
    elif kind == "tiny":
        x = x * C.log_uniform(gen, b * s, -6.0, -4.0)
    elif kind == "mixed_scale":
        x = x * C.log_uniform(gen, b * s, -3.0, 3.0)
    elif kind == "heavy_tail":
        x = C.cauchy(gen, b * s, k).clamp(-1e3, 1e3)
    elif kind == "random_tables":
        cos, sin = C.randn(gen, s, dh), C.randn(gen, s, dh)
    elif kind != "normal":
        raise ValueError(f"unknown input kind {kind!r}; known: normal, {', '.join(ADVERSARIAL)}")
    return {"hidden": x.reshape(b, s, k).to(dtype).to(device), "weight": w.to(dtype).to(device),
            "cos": cos.to(dtype).to(device), "sin": sin.to(dtype).to(device)}


def make_linear_bias_inputs(shape, dtype, device, gen, kind="normal", style="half"):
    """make_linear_inputs and a bias [H*Dh] (spread 0.5; Qwen2's q/k biases reach a few units)."""
    inp = make_linear_inputs(shape, dtype, device, gen, kind, style)
    _, _, _, h, dh = linear_problem(shape)
    inp["bias"] = (C.randn(gen, h * dh) * 0.5).to(C.as_dtype(dtype)).to(device)
    return inp


def linear_cost(shape, dtype):
    """(bytes, flops): hidden, the weight and the tables once, y written once; the GEMM's
    2*B*S*K*H*Dh flops and the rotation's 3 per element. q is never written apart: the traffic
    the fusion saves is 2*B*S*H*Dh*itemsize."""
    item = C.itemsize(dtype)
    b, s, k, h, dh = linear_problem(shape)
    n = h * dh
    return (b * s * k + n * k + b * s * n + 2 * s * dh) * item, 2 * b * s * k * n + 3 * b * s * n


# LLaMA-3-8B's q and k (32 and 8 heads of 128 over 4096) at 1 x 2048 and 8 x 2048, Qwen2-7B's
# (28 heads, 3584), GPT-NeoX-ish 64-wide heads
LINEAR_BENCH_SHAPES = ((1, 2048, 4096, 32, 128), (1, 2048, 4096, 8, 128), (8, 2048, 4096, 32, 128),
                       (8, 2048, 4096, 8, 128), (1, 2048, 3584, 28, 128), (4, 1024, 2048, 32, 64))
# Small enough for the interpreter's GEMM; heads of 2 to 128 lanes, Dh/2 no power of two (80,
# 96: padded lanes), K tails, one row, one head
LINEAR_SWEEP_SHAPES = ((1, 1, 8, 1, 2), (2, 3, 16, 2, 8), (1, 5, 33, 3, 16), (2, 17, 64, 2, 32),
                       (1, 9, 40, 2, 80), (1, 7, 24, 3, 96), (1, 33, 64, 1, 128))
LINEAR_EDGE_SHAPES = ((1, 1, 1, 1, 2), (3, 1, 7, 1, 4), (1, 97, 16, 3, 8), (1, 2, 16, 5, 64),
                      (2, 1, 130, 1, 256))

LINEAR_SPACE = {
    "block_m": [32, 64, 128],
    "heads": [1, 2, 4],
    "block_k": [32, 64, 128],
    "group_m": [1, 8, 16],
    "num_warps": [4, 8],
    "num_stages": [2, 3, 4, 5],
    "loads": ["pointers", "tma", "tma_ws"],
}
LINEAR_DEFAULT = {"block_m": 64, "heads": 1, "block_k": 32, "group_m": 8, "num_warps": 4,
                  "num_stages": 3, "loads": "pointers"}

_PROJ_ARGS = ("a_ptr, w_ptr, bias_ptr, cos_ptr, sin_ptr, y_ptr, M, N, K, S, H,\n"
              "               stride_am, stride_ak, stride_wn, stride_wk, stride_cs, stride_cd,\n"
              "               stride_ss, stride_sd,\n"
              "               HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_M: tl.constexpr,\n"
              "               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,\n"
              "               EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,\n"
              "               DOT_FP32: tl.constexpr, STEP: tl.constexpr, OFF: tl.constexpr")

# The rotation of a tile's two fp32 accumulators: acc1 holds the first elements of its heads'
# pairs, acc2 the second; pair jj of a head is lanes (jj * STEP, jj * STEP + OFF), its first at
# weight row row1: rotate-half pairs (jj, jj + Dh/2) (STEP 1, OFF HALF), interleaved pairs
# (2jj, 2jj + 1) (STEP 2, OFF 1). The pointer tile: [BLOCK_N] columns, broadcast over the rows
# by BIAS_ROWS; the TMA tile: [BLOCK_M * HEADS, HALF] already. pos: each row's position (its
# table row).
_ROTATE_PAIRS = '''
# x * cos + rot(x) * sin, rot(x) of a pair (x1, x2) = (-x2, x1)
y1 = acc1 * c1 + (-acc2) * s1
y2 = acc2 * c2 + acc1 * s2'''
_ROTATE_TILE = '''
if HAS_BIAS:
    acc1 += tl.load(bias_ptr + row1).to(tl.float32)BIAS_ROWS
    acc2 += tl.load(bias_ptr + row1 + OFF).to(tl.float32)BIAS_ROWS
lane1 = jj * STEP
c_row = cos_ptr + pos[:, None] * stride_cs
s_row = sin_ptr + pos[:, None] * stride_ss
c1 = tl.load(c_row + lane1[None, :] * stride_cd).to(tl.float32)
c2 = tl.load(c_row + (lane1 + OFF)[None, :] * stride_cd).to(tl.float32)
s1 = tl.load(s_row + lane1[None, :] * stride_sd).to(tl.float32)
s2 = tl.load(s_row + (lane1 + OFF)[None, :] * stride_sd).to(tl.float32)
''' + _ROTATE_PAIRS


# The TMA tile's interleaved rotation: the tables' rows (and the bias's) read whole, [BLOCK_M *
# HEADS, Dh] contiguous, and split into even and odd lanes as the accumulator is. Reading each
# lane 2jj and 2jj + 1 apart (_ROTATE_TILE's way) ran the tile 2.1x slower (H100, LLaMA-3-8B q at
# 8 x 2048, one head a tile: 1,820 against 861 us; docs/sweeps/rope_interleaved_probe.py).
_PAIRED_ROWS = '''
dd = tl.arange(0, 2 * HALF)
if HAS_BIAS:
    b1, b2 = tl.split(tl.reshape(tl.load(bias_ptr + head_base[:, None] + dd[None, :]).to(tl.float32),
                                 (BLOCK_M * HEADS, HALF, 2)))
    acc1 += b1
    acc2 += b2
c1, c2 = tl.split(tl.reshape(tl.load(cos_ptr + pos[:, None] * stride_cs + dd[None, :] * stride_cd).to(tl.float32),
                             (BLOCK_M * HEADS, HALF, 2)))
s1, s2 = tl.split(tl.reshape(tl.load(sin_ptr + pos[:, None] * stride_ss + dd[None, :] * stride_sd).to(tl.float32),
                             (BLOCK_M * HEADS, HALF, 2)))''' + _ROTATE_PAIRS


def _proj_pointer_kernel() -> str:
    body = MM.plain_tile_head() + '''
head = rbn // BLOCK_H                                              # [BLOCK_N] each column's head
j = rbn % BLOCK_H                                                  # its lane within the half
jj = tl.minimum(j, HALF - 1)                                       # padded lanes re-read lane HALF-1
row1 = head * (2 * HALF) + jj * STEP                               # weight row of a pair's first
a_ptrs = a_ptr + ram[:, None] * stride_am + rk[None, :] * stride_ak           # [BLOCK_M, BLOCK_K]
w1_ptrs = w_ptr + rk[:, None] * stride_wk + row1[None, :] * stride_wn         # [BLOCK_K, BLOCK_N]
w2_ptrs = w_ptr + rk[:, None] * stride_wk + (row1 + OFF)[None, :] * stride_wn
acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
''' + MM.k_loop([("acc1", "w1_ptrs", "w1", "stride_wk"), ("acc2", "w2_ptrs", "w2", "stride_wk")]) + '''
pos = ram % S                                                      # [BLOCK_M] positions
''' + _ROTATE_TILE.replace("BIAS_ROWS", "[None, :]") + '''
# y contiguous [B*S, H, 2 * HALF]: row m, head, lane
y_ptrs = y_ptr + rm.to(tl.int64)[:, None] * (H * 2 * HALF) + (head * (2 * HALF) + j * STEP)[None, :]
y_mask = (rm < M)[:, None] & ((rn < N) & (j < HALF))[None, :]
tl.store(y_ptrs, y1.to(y_ptr.dtype.element_ty), mask=y_mask)
tl.store(y_ptrs + OFF, y2.to(y_ptr.dtype.element_ty), mask=y_mask)'''
    return f'''@triton.jit
def _rope_proj({_PROJ_ARGS}):
    """One tile [BLOCK_M rows, BLOCK_N / BLOCK_H heads] of y: the pairs' two elements of each
    head as two fp32 accumulators sharing every loaded tile of a, rotated, stored once. Columns
    are indexed in a padded pair space N = H * BLOCK_H (BLOCK_H = next_pow2(HALF) pairs a head)."""
{C.indent(body, 4)}
'''


# loads "tma" / "tma_ws": a persistent kernel, every operand tile by TMA, the matmul family's
# K-major tile loop: HEADS heads are HEADS * Dh consecutive weight rows, one [HEADS * Dh, K]
# tile of the weight [H*Dh, K]. The fp32 tile [BLOCK_M, HEADS * Dh] is split in registers into
# the halves of its heads ([BLOCK_M * HEADS, Dh] -> two [BLOCK_M * HEADS, HALF], as matmul's
# subtiled store splits a tile), rotated, and stored as [BLOCK_M, HEADS, HALF] boxes of y viewed
# [B*S, H, Dh]. "tma_ws" warp-specializes the tile loop (producer warps issue the loads while
# the consumers run the MMAs and the previous tile's epilogue). The tables are read through
# pointers in the epilogue (L2-resident: S x Dh).
def _proj_tma_kernel(ws: bool) -> str:
    loop = "tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGS, flatten=True" + (
        ", warp_specialize=True)" if ws else ")")
    return f'''@triton.jit
def _rope_proj_tma(a_desc, w_desc, y_desc, bias_ptr, cos_ptr, sin_ptr, M, K, S, H, NUM_PROGS,
                   stride_cs, stride_cd, stride_ss, stride_sd,
                   HALF: tl.constexpr, HEADS: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, DOT_FP32: tl.constexpr,
                   STEP: tl.constexpr, OFF: tl.constexpr):
    """Tiles [BLOCK_M rows, HEADS heads] of y (BLOCK_N = HEADS * 2 * HALF columns), walked by
    NUM_PROGS programs; each tile's pairs rotated before the store."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(H, HEADS)
    num_pid_in_group = GROUP_M * num_pid_n
    for tile in {loop}:
{C.indent(MM.GROUP_ORDER_SRC.strip(chr(10)), 8)}
        off_m = pid_m * BLOCK_M
        head0 = pid_n * HEADS
        off_n = head0 * (2 * HALF)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
{C.indent(MM.tma_kmajor_k_loop([("acc", "w_desc", "w")]), 8)}
        # [BLOCK_M, HEADS * 2 * HALF] -> rows (m, head), the pairs' elements apart:
        # [BLOCK_M * HEADS, HALF] each (interleaved: even and odd lanes; rotate-half: halves)
        if STEP == 2:
            acc1, acc2 = tl.split(tl.reshape(acc, (BLOCK_M * HEADS, HALF, 2)))
        else:
            acc1, acc2 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M * HEADS, 2, HALF)), (0, 2, 1)))
        r = tl.arange(0, BLOCK_M * HEADS)
        pos = ((off_m + r // HEADS) % M) % S                      # each row's table row
        jj = tl.arange(0, HALF)
        head_base = tl.minimum(head0 + r % HEADS, H - 1) * (2 * HALF)   # each row's head's first weight row
        if STEP == 2:
{C.indent(_PAIRED_ROWS, 12)}
        else:
            row1 = head_base[:, None] + jj[None, :]
{C.indent(_ROTATE_TILE.replace("BIAS_ROWS", ""), 12)}
        if STEP == 2:      # the pairs joined back: one [BLOCK_M, HEADS, Dh] box
            y = tl.reshape(tl.join(y1, y2), (BLOCK_M, HEADS, 2 * HALF))
            y_desc.store([off_m, head0, 0], y.to(y_desc.dtype))
        else:              # the halves: two [BLOCK_M, HEADS, HALF] boxes
            y_desc.store([off_m, head0, 0], y1.to(y_desc.dtype).reshape(BLOCK_M, HEADS, HALF))
            y_desc.store([off_m, head0, HALF], y2.to(y_desc.dtype).reshape(BLOCK_M, HEADS, HALF))
'''


_PROJ_TMA_HOST = '''

_PROJ_PLANS = {}


def _proj_plan(x2, weight, H, Dh, has_bias):
    # (heads, bm, bk, stages, programs) of the TMA tiles for these operands, or False where the
    # device, the head width or the layouts rule descriptors out; worked out once per key
    half = Dh // 2
    if not _has_tma(x2.device) or half != _pow2(half) or half * x2.element_size() < 16:
        return False
    if not (_rows_ok(x2) and _rows_ok(weight)) or Dh > 256:   # a TMA box spans <= 256 rows
        return False
    M, K = x2.shape
    # a power of two <= H, the weight's box HEADS * Dh <= 256 rows
    heads = min(HEADS, 256 // Dh, _pow2(H) if H == _pow2(H) else _pow2(H) // 2)
    sms = _num_sms(x2.device)
    while heads > 1 and _cdiv(M, BLOCK_M) * _cdiv(H, heads) < sms:
        heads //= 2     # under one wave of tiles: narrower tiles, not idle SMs (H100, k of
                        # LLaMA-3-8B at 1 x 2048: 64 tiles of two heads 112.5 us, 128 of one 36.3)
    item = x2.element_size()
    # the pipeline's buffers share the shared memory with the staged y tile (bm x heads * Dh:
    # the interleaved store's one box; rotate-half stores two boxes of half of it through one
    # buffer, sm_90 and Triton 3.6: 217 and 184 KB at two heads of 128, 3 stages)
    budget = _smem_budget(x2.device) - min(BLOCK_M, max(16, _pow2(M))) * heads * Dh * item
    if INTERLEAVED and has_bias:
        budget -= 32 << 10   # the bias rows' split takes a layout conversion's scratch (28 KB
                             # at 128 rows of one or two heads of 128, sm_90, Triton 3.6)
    bm, _, bk, stages = _fit_gemm(BLOCK_M, heads * Dh, BLOCK_K, NUM_STAGES, NUM_WARPS, M,
                                  heads * Dh, K, item, budget, keep_n=True)
    return heads, bm, bk, stages, min(_cdiv(M, bm) * _cdiv(H, heads), sms)


def _proj_tma(x2, weight, bias, cos2, sin2, y, S, H, Dh, ieee, dot_fp32):
    # the TMA tiles, or False where they are ruled out (the plan is cached per shapes, strides,
    # dtype, device and alignment: a launch works out only its descriptors)
    key = (x2.shape, x2.stride(), weight.shape, weight.stride(), x2.dtype, x2.device, Dh,
           x2.data_ptr() % 16 == 0, weight.data_ptr() % 16 == 0)
    plan = _PROJ_PLANS.get(key)
    if plan is None:
        if len(_PROJ_PLANS) > 1024:      # a bound on a long-lived process's cache
            _PROJ_PLANS.clear()
        plan = _PROJ_PLANS[key] = _proj_plan(x2, weight, H, Dh, bias is not y)
    if plan is False:
        return False
    heads, bm, bk, stages, progs = plan
    M, K = x2.shape
    half = Dh // 2
    _rope_proj_tma[(progs,)](
        TensorDescriptor(x2, [M, K], [x2.stride(0), 1], [bm, bk]),
        TensorDescriptor(weight, [H * Dh, K], [weight.stride(0), 1], [heads * Dh, bk]),
        TensorDescriptor(y, [M, H, Dh], [H * Dh, Dh, 1], [bm, heads, Dh if INTERLEAVED else half]),
        bias, cos2, sin2, M, K, S, H, progs, *cos2.stride(), *sin2.stride(), HALF=half,
        HEADS=heads, BLOCK_M=bm, BLOCK_N=heads * Dh, BLOCK_K=bk, GROUP_M=GROUP_M,
        HAS_BIAS=bias is not y, IEEE=ieee, DOT_FP32=dot_fp32, STEP=2 if INTERLEAVED else 1,
        OFF=1 if INTERLEAVED else half, num_warps=NUM_WARPS, num_stages=stages)
    return True
'''


def _proj_launcher(p, bias: bool) -> str:
    call = '''block_h = max(2, _pow2(half))                             # lanes a half
        bm, bn, bk, stages = _fit_gemm(BLOCK_M, max(16, HEADS * block_h), BLOCK_K, NUM_STAGES, NUM_WARPS,
                                       M, H * block_h, K, x2.element_size(),
                                       _smem_budget(x2.device), operands=3, keep_n=True)
        _rope_proj[(_cdiv(M, bm) * _cdiv(H * block_h, bn),)](
            x2, weight, b, cos2, sin2, y, M, H * block_h, K, S, H, x2.stride(0), x2.stride(1),
            weight.stride(0), weight.stride(1), *cos2.stride(), *sin2.stride(), HALF=half,
            BLOCK_H=block_h, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M,
            EVEN_K=K % bk == 0, HAS_BIAS=b is not y, IEEE=ieee, DOT_FP32=dot_fp32,
            STEP=2 if INTERLEAVED else 1, OFF=1 if INTERLEAVED else half,
            num_warps=NUM_WARPS, num_stages=stages)'''
    if p["loads"] != "pointers":         # the pointer tiles where descriptors are ruled out
        call = ("if not _proj_tma(x2, weight, b, cos2, sin2, y, S, H, Dh, ieee, dot_fp32):\n"
                "            " + call.replace("\n", "\n    "))
    sig = "hidden, weight, cos, sin, bias" if bias else "hidden, weight, cos, sin"
    check = '''
    if bias.shape != (N,) or bias.dtype != weight.dtype:
        raise ValueError(f"bias must be [H*Dh={N}] in the weight's dtype, got {list(bias.shape)} {bias.dtype}")''' if bias else ""
    bias_arg = "bias" if bias else "y                                                      # no bias: any pointer"
    return f'''

def kernel_fn({sig}):
    """RoPE of the projection hidden @ weight^T{" + bias" if bias else ""} with its heads split out: hidden [B, S, K],
    weight [H*Dh, K], cos, sin [S, Dh] (leading dims of 1 allowed), any strides; returns y
    [B, H, S, Dh], a transposed view of a contiguous [B, S, H, Dh] (the model's layout)."""
    if hidden.dim() != 3 or weight.dim() != 2:
        raise ValueError(f"rotary+linear takes hidden [B, S, K] and weight [H*Dh, K], got "
                         f"{{list(hidden.shape)}} and {{list(weight.shape)}}")
    B, S, K = hidden.shape
    N = weight.shape[0]
    Dh = cos.shape[-1]
    cos2 = cos.reshape(cos.shape[-2], Dh)                          # [S, Dh] (a view: leading 1s)
    sin2 = sin.reshape(sin.shape[-2], sin.shape[-1])
    if Dh % 2 or N % Dh or weight.shape[1] != K or cos2.shape != (S, Dh) or sin2.shape != (S, Dh):
        raise ValueError(f"weight [H*Dh, K={{K}}] and tables [S={{S}}, Dh] with Dh even, got weight "
                         f"{{list(weight.shape)}}, cos {{list(cos.shape)}}, sin {{list(sin.shape)}}")
    if not (hidden.dtype == weight.dtype == cos.dtype == sin.dtype):
        raise ValueError("hidden, weight and the tables must share a dtype"){check}
    H = N // Dh
    half = Dh // 2
    M = B * S
    x2 = hidden.reshape(M, K)            # [M, K]: a view whenever B and S can merge
    if K == 0:                           # an empty sum: q = 0, and so its rotation
        return torch.zeros((B, S, H, Dh), dtype=hidden.dtype, device=hidden.device).transpose(1, 2)
    y = torch.empty((B, S, H, Dh), dtype=hidden.dtype, device=hidden.device)
    if M > 0 and H > 0:
        # the interpreter's tl.dot cannot multiply bf16 tiles (numpy has none): upcast them there
        dot_fp32 = hidden.dtype == torch.bfloat16 and hidden.device.type == "cpu"
        ieee = hidden.dtype == torch.float32 or dot_fp32
        b = {bias_arg}
        {call}
    return y.transpose(1, 2)
'''


def render_linear(params, bias: bool = False, style: str = "half") -> str:
    """Complete candidate source of RoPE fused into its projection (spec {"linear": true}) for
    one point of LINEAR_SPACE (missing params take LINEAR_DEFAULT values); ``bias``: the
    projection has one (kernel_fn's last argument); ``style``: rotate-half or interleaved pairs."""
    p = C.resolve(NAME, LINEAR_SPACE, LINEAR_DEFAULT, params)
    tma = p["loads"] != "pointers"
    how = {"pointers": "one program per tile, loads through pointers",
           "tma": "persistent TMA tiles (pointer tiles where the head width or the layouts "
                  "rule descriptors out)",
           "tma_ws": "persistent TMA tiles, warp-specialized (pointer tiles where the head "
                     "width or the layouts rule descriptors out)"}[p["loads"]]
    rot = "rotate_half(x)" if style == "half" else "rotate_every_two(x) (interleaved pairs 2i, 2i+1)"
    doc = f'''"""Rotary candidate with the projection fused in ({p["loads"]}): y = rope(hidden @ weight^T{" + bias" if bias else ""}),
the heads split out and moved forward, rope(x) = x * cos + {rot} * sin.

hidden [B, S, K], weight [H*Dh, K] (nn.Linear's layout), cos, sin [S, Dh]{", bias [H*Dh]" if bias else ""}; y [B, H, S, Dh]
as a transposed view of a contiguous [B, S, H, Dh]. A tile holds the two elements of its heads'
pairs as two fp32 accumulators (sharing each loaded tile of hidden), rotated in registers:
q is never written apart. Bytes the op must move: (B*S*K + H*Dh*K + B*S*H*Dh + 2*S*Dh)*itemsize;
flops 2*B*S*K*H*Dh. This variant: {how}.
Point: {C.point_line(LINEAR_SPACE, p)}
"""
{C.IMPORTS_SRC}
BLOCK_M = {p["block_m"]}          # tile rows (tokens; clamped at launch)
HEADS = {p["heads"]}              # heads a tile (its columns: HEADS x Dh, as two halves)
BLOCK_K = {p["block_k"]}          # K step
GROUP_M = {p["group_m"]}           # row-tiles per group of the swizzled tile order
NUM_WARPS = {p["num_warps"]}
NUM_STAGES = {p["num_stages"]}        # software-pipelining depth of the K loop
INTERLEAVED = {style == "interleaved"}   # pairs (2i, 2i+1) (GPT-J, Meta's LLaMA), else (i, i + Dh/2)
'''
    parts = [doc, MM.GEMM_HELPERS_SRC, "\n", _proj_pointer_kernel()]
    if tma:
        parts += [C.NUM_SMS_SRC, "\n\n", C.TMA_HELPERS_SRC, C.ROWS_OK_SRC, "\n\n",
                  _proj_tma_kernel(p["loads"] == "tma_ws"), _PROJ_TMA_HOST]
    parts.append(_proj_launcher(p, bias))
    return C.tidy("\n".join(parts))


def _linear_openers(shape, dtype: str) -> tuple:
    """bf16/fp16: the TMA tiles first, 128 rows by 256 columns (two heads of 128), then by one
    head; fp32 keeps the starter's pointers (its TMA tiles would be fp32 dots on tensor cores)."""
    if str(dtype).removeprefix("torch.") == "float32":
        return ()
    dh = int(tuple(shape)[-1])
    wide = max(1, min(4, 256 // max(dh, 1)))
    return ({"loads": "tma", "block_m": 128, "heads": wide, "block_k": 64, "num_warps": 8,
             "num_stages": 3},
            {"loads": "tma", "block_m": 128, "heads": max(1, wide // 2), "block_k": 64,
             "num_warps": 8, "num_stages": 4})


def _configure_linear(spec: dict) -> Family:
    bias = bool(spec.get("bias", False))
    style = spec.get("style", "half")
    args = LINEAR_ARGS + (("bias",) if bias else ())
    inputs = make_linear_bias_inputs if bias else make_linear_inputs

    def cost(shape, dtype):
        b, f = linear_cost(shape, dtype)
        n = shape[3] * shape[4]
        return (b + n * C.itemsize(dtype), f + shape[0] * shape[1] * n) if bias else (b, f)
    return dataclasses.replace(
        FAMILY, signature=f"kernel_fn({', '.join(args)}) with the projection fused in",
        arg_names=args, reference=functools.partial(linear_reference, style=style),
        make_inputs=functools.partial(inputs, style=style),
        cost=cost, bench_shapes=LINEAR_BENCH_SHAPES, sweep_shapes=LINEAR_SWEEP_SHAPES,
        edge_shapes=LINEAR_EDGE_SHAPES, adversarial=ADVERSARIAL, space=LINEAR_SPACE,
        default=LINEAR_DEFAULT, render=functools.partial(render_linear, bias=bias, style=style),
        error_bound=functools.partial(linear_bound, style=style), bound_tol=LINEAR_BOUND_TOL,
        openers_for=_linear_openers,
        out_order=(0, 2, 1, 3),            # y is a transposed view of a contiguous [B, S, H, Dh]
        description=(("Rotate-half" if style == "half" else "Interleaved (GPT-J)")
                     + " RoPE fused into its projection: rope(hidden @ weight^T"
                     + (" + bias" if bias else "") + ") with the heads split out, y [B, H, S, Dh]."),
        notes={"convention": "rotate-half" if style == "half" else "interleaved pairs",
               "shape": "(B, S, K, H, Dh)",
               "weight": "[H*Dh, K], nn.Linear's layout", "bound": "compute"},
        op_schema=("(Tensor hidden, Tensor weight, Tensor cos, Tensor sin, Tensor bias) -> Tensor"
                   if bias else "(Tensor hidden, Tensor weight, Tensor cos, Tensor sin) -> Tensor"),
        spec=dict(spec))


def configure(spec: dict) -> Family:
    """``spec["style"] = "interleaved"``: pairs (x[2i], x[2i+1]) rotate together (GPT-J),
    tables with each frequency twice in a row. ``spec["linear"]``: the q or k projection
    before the rotation fused in, kernel_fn(hidden, weight, cos, sin) (either style;
    ``bias``: the projection's bias, kernel_fn(hidden, weight, cos, sin, bias))."""
    style = spec.get("style", "half")
    if (set(spec) - {"style", "linear", "bias"} or style not in ("half", "interleaved")
            or not isinstance(spec.get("linear", False), bool) or not isinstance(spec.get("bias", False), bool)
            or spec.get("bias") and not spec.get("linear")):
        raise ValueError(f"rotary takes a spec {{style: half|interleaved, linear: bool, and with "
                         f"linear: bias: bool}}; got {spec!r}")
    if spec.get("linear"):
        return _configure_linear(spec)
    if style == "half":
        return FAMILY

    def render_interleaved(params):
        # the rotate-half kernels with the pair (i, i + Dh/2) read as (2i, 2i + 1)
        src = render(params)
        src = src.replace("(cols + HALF)[None, :]", "(2 * cols + 1)[None, :]")
        src = src.replace("cols[None, :]", "(2 * cols)[None, :]")
        src = src.replace("rotate_half(x) = cat(-x2, x1)", "rotate_every_two: pairs (2i, 2i + 1)")
        return src.replace('"""Rotary candidate', '"""Interleaved rotary candidate (pairs 2i, 2i+1)', 1)
    return dataclasses.replace(
        FAMILY, reference=_interleaved_reference, error_bound=_interleaved_bound,
        make_inputs=_interleaved_inputs, render=render_interleaved,
        signature="kernel_fn(x, cos, sin), interleaved pairs",
        description="Interleaved rotary embedding (GPT-J): x * cos + rotate_every_two(x) * sin.",
        spec=dict(spec))


FAMILY = dataclasses.replace(
    FAMILY, spellings=SPELLINGS, from_match=from_match,
    op_schema="(Tensor x, Tensor cos, Tensor sin) -> Tensor")
