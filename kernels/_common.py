"""Helpers shared by the family files: dtype handling, random inputs, and source rendering.

Nothing here is imported by a rendered candidate: every candidate source is self-contained.
"""
from __future__ import annotations

import math

import torch


def as_dtype(dtype) -> torch.dtype:
    """torch.dtype from a torch.dtype or its name ("float16")."""
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def itemsize(dtype) -> int:
    return torch.empty((), dtype=as_dtype(dtype)).element_size()


def rows_and_cols(shape) -> tuple[int, int]:
    """(N, D) of a [..., D] shape viewed as [N, D]."""
    shape = tuple(int(s) for s in shape)
    if not shape:
        return 1, 1
    return math.prod(shape[:-1]), shape[-1]


# ---------------------------------------------------------------------------------------------
# random inputs (float32 on the generator's device; the family casts and moves them)
# ---------------------------------------------------------------------------------------------

def randn(gen, *size):
    return torch.randn(*size, generator=gen, device=gen.device)


def rand(gen, *size):
    return torch.rand(*size, generator=gen, device=gen.device)


def log_uniform(gen, n, lo, hi):
    """[n, 1] scales log-uniform in [10^lo, 10^hi]."""
    return torch.pow(10.0, lo + (hi - lo) * rand(gen, n, 1))


def random_signs(gen, n):
    """[n, 1] of +-1."""
    return torch.where(rand(gen, n, 1) < 0.5, -1.0, 1.0)


def cauchy(gen, n, d):
    """[n, d] ratio of normals: Cauchy distributed, occasional values of 1e3..1e7."""
    return randn(gen, n, d) / randn(gen, n, d).abs().clamp_min(1e-12)


# ---- normalization inputs (rmsnorm, layernorm) ----

# Largest magnitude a generated value may take, per dtype: finite in the dtype, and small enough
# that a sum of squares over 2^20 elements stays finite in fp32 (1e16^2 * 2^20 ~ 1e38 < 3.4e38).
_LIMIT = {torch.float16: 6.0e4, torch.bfloat16: 1e16, torch.float32: 1e16}
# "huge": fp16 values ~300 so x^2 (~1e5) overflows fp16 (max 65504) but not fp32; bf16/fp32 near
# the top of what an fp32 sum of squares holds.
_HUGE = {torch.float16: 300.0, torch.bfloat16: 1e15, torch.float32: 1e15}
# "mixed_scale": per-row scale times (+-OFFSET + unit noise); the offset is as large as the dtype
# still resolves unit noise on (fp16 has 11 significant bits, bf16 8).
_OFFSET = {torch.float16: 64.0, torch.bfloat16: 16.0, torch.float32: 1000.0}


NORM_KINDS = ("huge", "tiny", "mixed_scale", "constant_rows", "heavy_tail")


def norm_input(shape, dtype, gen, kind):
    """Float32 values (on gen.device) for the [..., D] input of rmsnorm/layernorm, of ``kind``."""
    n, d = rows_and_cols(shape)
    if kind == "normal":
        x = randn(gen, n, d)
    elif kind == "huge":
        x = randn(gen, n, d) * _HUGE[dtype]
    elif kind == "tiny":
        # 1e-6..1e-4: below fp16's smallest normal (6.1e-5); squares (1e-12..1e-8) sit far below a
        # 1e-6 eps, so a kernel that drops or misplaces eps is off by orders of magnitude.
        x = randn(gen, n, d) * log_uniform(gen, n, -6.0, -4.0)
    elif kind == "mixed_scale":
        # rows 10^-2..10^1.5 apart in scale, each a large constant offset plus unit noise
        x = (random_signs(gen, n) * _OFFSET[dtype] + randn(gen, n, d)) * log_uniform(gen, n, -2.0, 1.5)
    elif kind == "constant_rows":
        x = (randn(gen, n, 1) * 2.0).expand(n, d).clone()
    elif kind == "heavy_tail":
        x = cauchy(gen, n, d)
    else:
        raise ValueError(f"unknown input kind {kind!r}; known: normal, {', '.join(NORM_KINDS)}")
    lim = _LIMIT[dtype]
    return x.clamp(-lim, lim).reshape(tuple(int(s) for s in shape))


def split_sum(h: torch.Tensor, gen) -> tuple:
    """(x, r) in h's dtype with x + r == h exactly: the two terms of a residual add whose sum
    is ``h`` (an input a norm's adversarial kind made). x = u * h rounded, u uniform in
    [0.55, 0.95] per element (not a scaled copy of h: a kernel that normalized x instead of
    the sum would be caught), and r = h - x, exact by Sterbenz's lemma (x within [h/2, 2h],
    same sign). Then the model's add rounds nothing, and the judge's float64 reference and the
    kernel see the same sum: an offset row (c + noise, c large) would otherwise lose the
    noise's low bits in the add, which the norm then amplifies by |c| / std."""
    u = 0.55 + 0.4 * rand(gen, *h.shape).to(h.device)
    x = (u.double() * h.double()).to(h.dtype)
    return x, (h.double() - x.double()).to(h.dtype)


def residual_inputs(plain):
    """make_inputs of a fused residual norm from its plain norm's ``plain``: the plain x (of
    the stability stage's kind) is the sum, split exactly into x and residual (split_sum)."""
    def make(shape, dtype, device, gen, kind="normal"):
        kw = plain(shape, dtype, device, gen, kind)
        x, r = split_sum(kw.pop("x"), gen)
        return {"x": x, "residual": r, **kw}
    return make


# ---------------------------------------------------------------------------------------------
# search-space points
# ---------------------------------------------------------------------------------------------

def resolve(name: str, space: dict, default: dict, params) -> dict:
    """DEFAULT overlaid with ``params``; unknown names and values outside the space raise."""
    p = dict(default)
    for k, v in dict(params).items():
        if k not in space:
            raise ValueError(f"unknown {name} parameter {k!r}; known: {', '.join(space)}")
        if v not in space[k]:
            raise ValueError(f"{name} parameter {k}={v!r} not in {space[k]}")
        p[k] = v
    return p


def point_line(space: dict, p: dict) -> str:
    return ", ".join(f"{k}={p[k]!r}" for k in space)


# ---------------------------------------------------------------------------------------------
# source rendering
# ---------------------------------------------------------------------------------------------

def indent(text: str, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + line if line.strip() else "" for line in text.strip("\n").split("\n"))


def tiled_kernel(name: str, args: str, doc: str, prologue: str, body: str, persistent: bool) -> str:
    """Source of a @triton.jit kernel whose per-tile ``body`` (it reads ``tile``) runs once per
    program, or, with a persistent grid, for tiles pid, pid + P, pid + 2P, ... (P programs).

    The kernel must take ``num_tiles`` among its arguments. Under the Triton interpreter the loop
    variable of ``range(program_id, ...)`` is a Python int, so bodies never call ``tile.to(...)``:
    they convert ``tile * ROWS + tl.arange(...)`` instead.
    """
    out = ["@triton.jit", f"def {name}({args}):", indent(doc, 4)]
    if prologue.strip():
        out.append(indent(prologue, 4))
    if persistent:
        out.append("    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):")
        out.append(indent(body, 8))
    else:
        out.append("    tile = tl.program_id(0)")
        out.append(indent(body, 4))
    return "\n".join(out) + "\n"


def exp_expr(arg: str, use_exp2: bool) -> str:
    """exp(arg) in Triton source; the exp2 form scales the (small, already max-subtracted)
    argument by log2(e), never x itself, so no precision is lost at large |x|."""
    if use_exp2:
        return f"tl.exp2(({arg}) * 1.4426950408889634)"
    return f"tl.exp({arg})"


FIT_ROWS_SRC = '''
MAX_TILE = 65536  # elements in one program's register tile [ROWS, BLOCK]
# Shared memory that the software-pipelined loads of one loop may use: (stages - 1) buffered
# tiles. 48 KB fits Hopper's 227 KB and AMD's 64 KB LDS with room left for reductions.
PIPELINE_SMEM = 48 * 1024


def _fit_rows(rows, block):
    """Largest power of two <= rows such that a [rows, block] tile stays within MAX_TILE."""
    while rows > 1 and rows * block > MAX_TILE:
        rows //= 2
    return rows


def _fit_stages(stages, tile_bytes):
    """Largest stage count <= stages whose (stages - 1) buffered loads of tile_bytes fit in
    PIPELINE_SMEM; a bigger request would fail at launch (out of shared memory)."""
    while stages > 1 and (stages - 1) * tile_bytes > PIPELINE_SMEM:
        stages -= 1
    return stages
'''

NUM_SMS_SRC = '''
_SMS = {}


def _num_sms(device):
    """Streaming multiprocessors (CUs on ROCm) of the device; any fixed count is correct
    elsewhere. Read once per device: persistent launchers ask on every call."""
    if device.type != "cuda":
        return 8
    if device.index not in _SMS:
        _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device.index]
'''

# The shared-memory budget of one program, for candidates that size tiles and pipelines by it.
SMEM_BUDGET_SRC = '''_SMEM = {}


def _smem_budget(device):
    """Shared memory (LDS on ROCm) one program may use, in bytes: the opt-in limit where torch
    reports it (NVIDIA, torch >= 2.6), else 64 KB, which every NVIDIA and AMD GPU has. The
    interpreter has no shared memory: no limit. Read once per device (a property query costs
    microseconds of host time on every call)."""
    if device.type != "cuda":
        return 1 << 30
    if device.index not in _SMEM:
        props = torch.cuda.get_device_properties(device)
        _SMEM[device.index] = (int(props.shared_memory_per_block_optin)
                               if hasattr(props, "shared_memory_per_block_optin") else 64 * 1024)
    return _SMEM[device.index]
'''

# Tensor descriptors (TMA) for candidates that have a descriptor path: matmul, attention.
TMA_HELPERS_SRC = '''from triton.tools.tensor_descriptor import TensorDescriptor

_TMA_DEVICES = {}


def _has_tma(device):
    """Hopper-class NVIDIA GPUs (sm_90+) move tiles with TMA; the interpreter emulates it."""
    if device.type == "cpu":
        return True
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    if device.index not in _TMA_DEVICES:
        _TMA_DEVICES[device.index] = torch.cuda.get_device_capability(device)[0] >= 9
    return _TMA_DEVICES[device.index]

'''

# Whether a tensor can back a TMA descriptor: the host check of the TMA launchers that take
# arbitrary operands (attention's q, k, v, o; the fused MLP's x, weights and h)
ROWS_OK_SRC = '''

def _rows_ok(t):
    """Unit last stride, 16-byte aligned base and leading strides: what a descriptor needs."""
    item = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all((s * item) % 16 == 0 for s in t.stride()[:-1]))
'''

# Host-side helpers every rendered source carries: triton.cdiv and triton.next_power_of_2 are
# Triton constexpr functions, whose wrapper costs ~3 us a call in host code (Triton 3.9, measured
# on the CPU); a launcher calls them up to nine times, and a launch-bound model pays it per op.
IMPORTS_SRC = '''import torch
import triton
import triton.language as tl


def _cdiv(a, b):
    return -(-a // b)


def _pow2(n):
    return 1 << (n - 1).bit_length() if n > 0 else 0
'''


def cache_hints(enabled: bool) -> tuple[str, str]:
    """(keep, stream) keyword suffixes for tl.load: evict_last for data read again, evict_first
    for data read for the last time; empty strings when disabled."""
    if not enabled:
        return "", ""
    return ', eviction_policy="evict_last"', ', eviction_policy="evict_first"'


def tidy(src: str) -> str:
    """At most two blank lines in a row, one newline at the end."""
    lines, blank = [], 0
    for line in src.rstrip().split("\n"):
        blank = blank + 1 if not line.strip() else 0
        if blank <= 2:
            lines.append(line.rstrip())
    return "\n".join(lines) + "\n"


def select_src(one_pass: str | None, looped: str) -> str:
    """Launcher lines (4-space indented) choosing the kernel, its tile [rows, width] and its
    pipeline depth; ``one_pass`` (a kernel name or None) takes rows up to MAX_TILE wide."""
    fit = '''rows = _fit_rows(ROWS_PER_PROG, width)
# pipelined loads keep (stages - 1) x tiles [rows, width] (+2 rows: weight/bias chunks) in shared memory
stages = _fit_stages(NUM_STAGES, (rows + 2) * width * x2.dtype.itemsize)'''
    if one_pass is None:
        src = f'''kernel, width = {looped}, min(BLOCK_D, block)   # chunks no wider than the row
{fit}
meta = {{"ROWS": rows, "BLOCK_D": width, "NUM_STAGES": stages}}'''
    else:
        src = f'''if block <= MAX_TILE:
    kernel, width = {one_pass}, block
else:                                # a wider row does not fit one register tile
    kernel, width = {looped}, min(BLOCK_D, block)
{fit}
if kernel is {one_pass}:
    meta = {{"ROWS": rows, "BLOCK": width}}
else:
    meta = {{"ROWS": rows, "BLOCK_D": width, "NUM_STAGES": stages}}'''
    return indent(src, 4)


def residual_sum_src(mask: str, x_row: str, r_row: str, h_row: str, cols: str, hint: str) -> str:
    """Triton lines of the fused residual add: h = x + r rounded to h's dtype, as the model's
    own add stores it (torch adds two bf16 tensors in fp32 and rounds once), written out, and
    x = h in fp32 for the norm: the norm reads the sum the model would have read."""
    return f'''
xa = tl.load({x_row} + {cols}, mask={mask}, other=0.0{hint}).to(tl.float32)
ra = tl.load({r_row} + {cols}, mask={mask}, other=0.0{hint}).to(tl.float32)
h = (xa + ra).to(h_ptr.dtype.element_ty)
tl.store({h_row} + {cols}, h, mask={mask})
x = h.to(tl.float32)'''


def residual_launcher_src(p: dict, one_pass: str | None, chunked: str, params: str, doc: str,
                          prep: str, affine: str, flags: str = "") -> str:
    """kernel_fn of a fused residual add + norm (rmsnorm and layernorm ``residual: true``):
    x and residual [..., D] viewed as [N, D], out [2, N, D] ([h; y]) in x's dtype, the row
    kernels launched as the plain norm's are. ``params``: kernel_fn's arguments after
    residual; ``prep``: the launcher lines making the norm's operands (``affine``, passed
    between r and h; ``flags`` after num_tiles)."""
    grid = ("(min(num_tiles, _num_sms(x.device) * PROGS_PER_SM),)  # persistent programs"
            if p["grid"] == "persistent" else "(num_tiles,)  # one tile per program")
    # two operands stream through the pipelined loop: x's and r's chunks
    select = select_src(one_pass, chunked).replace("(rows + 2) * width", "(2 * rows + 2) * width")
    return f'''

def kernel_fn(x, residual, {params}):
    """{doc}"""
    D = x.shape[-1]
    out_shape = (2,) + tuple(x.shape)
    if x.stride(-1) != 1:
        x = x.contiguous()               # kernels assume unit stride along D; any row stride works
    if residual.stride(-1) != 1:
        residual = residual.contiguous()
    x2 = x.reshape(-1, D)                # [N, D]: a view whenever the leading dims can merge
    r2 = residual.reshape(-1, D)
    N = x2.shape[0]
{indent(prep, 4)}
    out = torch.empty((2, N, D), dtype=x.dtype, device=x.device)   # [h; y]
    if N == 0 or D == 0:
        return out.reshape(out_shape)
    block = _pow2(D)
{select}
    num_tiles = _cdiv(N, rows)
    grid = {grid}
    kernel[grid](x2, r2, {affine}, out[0], out[1], N, D, x2.stride(0), r2.stride(0), float(eps),
                 num_tiles, {flags}**meta, num_warps=NUM_WARPS, num_stages=stages)
    return out.reshape(out_shape)
'''


# a weight of ones for a norm without one (multiplying by 1.0 is exact): the row kernels stay
# as they are; one cached vector per (size, dtype, device)
ONES_SRC = '''_ONES = {}


def _ones(d, dtype, device):
    key = (d, dtype, device)
    if key not in _ONES:
        _ONES[key] = torch.ones(d, dtype=dtype, device=device)
    return _ONES[key]
'''


def row_constants_src(p: dict, chunks: str = "chunked loop", persistent: str = "persistent grid only") -> str:
    """The module constants of a norm's row kernels (rmsnorm, layernorm) at point ``p``."""
    return f'''ROWS_PER_PROG = {p["rows_per_prog"]}   # rows per program tile (halved at launch to fit MAX_TILE)
BLOCK_D = {p["block_d"]}        # chunk width of the {chunks}
NUM_WARPS = {p["num_warps"]}
NUM_STAGES = {p["num_stages"]}       # software-pipelining depth of the chunk loops
PROGS_PER_SM = {p["progs_per_sm"]}     # {persistent}
'''
