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

import torch

from kernels import Family
from kernels import _common as C
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


SPELLINGS = tuple(_spelling(r) for r in _ROT) + (
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
    return Fit({"style": "interleaved"}, (b, h, s, dh), {"x": x_ref, "cos": table(0), "sin": table(1)},
               post=() if heads_first else _bshd_post(m))


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
    refs = {n: _table_ref(m, n, b, s, dh) for n in ("cos", "sin")}
    post = ()
    if any(r is None for r in refs.values()):
        # the projection's layout: x [B, S, H, Dh] (here b, h, s = B, S, H)
        refs = {n: _bshd_table_ref(m, n, b, h, dh) for n in ("cos", "sin")}
        if any(r is None for r in refs.values()):
            return None
        shape, post = (b, s, h, dh), _bshd_post(m)
        refs["x"] = Ref("x", (("transpose", 1, 2),))
    else:
        refs["x"] = Ref("x")
    if m.meta("cos")["dtype"] != x["dtype"] or m.meta("sin")["dtype"] != x["dtype"]:
        raise NoFit("tables in another dtype than x: the contract takes one")
    spec = {"style": "interleaved"} if style == "interleaved" else {}
    return Fit(spec, shape, {"x": refs["x"], "cos": refs["cos"], "sin": refs["sin"]}, post=post)


def _interleaved_reference(x, cos, sin):
    return x * cos + rotate_every_two(x) * sin


def _interleaved_bound(x, cos, sin):
    return x.abs() * cos.abs() + rotate_every_two(x).abs() * sin.abs()


def _interleaved_inputs(shape, dtype, device, gen, kind="normal"):
    """The family's inputs with tables in the interleaved layout: each frequency twice in a row."""
    inp = make_inputs(shape, dtype, device, gen, kind)
    if kind != "random_tables":
        s, dh = int(shape[2]), int(shape[3])
        inv_freq = 1.0 / (THETA ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
        ang = torch.outer(torch.arange(s, dtype=torch.float32), inv_freq).repeat_interleave(2, dim=-1)
        inp["cos"] = ang.cos().to(C.as_dtype(dtype)).to(device)
        inp["sin"] = ang.sin().to(C.as_dtype(dtype)).to(device)
    return inp


def configure(spec: dict) -> Family:
    """``spec["style"] = "interleaved"``: pairs (x[2i], x[2i+1]) rotate together (GPT-J),
    tables with each frequency twice in a row."""
    style = spec.get("style", "half")
    if set(spec) - {"style"} or style not in ("half", "interleaved"):
        raise ValueError(f"rotary takes a spec {{style: half|interleaved}}; got {spec!r}")
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
