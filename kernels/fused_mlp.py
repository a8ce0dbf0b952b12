"""Fused MLP family: y = down(silu(gate(x)) * up(x)), the SwiGLU MLP of LLaMA/Mistral.

Weights in nn.Linear's layout (what SwiGLUMLP in engine/models.py holds): w_gate [F, D],
w_up [F, D], w_down [D, F], each layer computing x @ w^T:
    g = x @ w_gate^T, u = x @ w_up^T   [N, F]
    h = silu(g) * u                    [N, F]   silu(g) = g * sigmoid(g)
    y = h @ w_down^T                   [N, D]
x has any number of leading dims ([B, S, D] in a model, viewed as [N, D]); y is shaped like x,
in x's dtype.

Shapes (the family's ``shape``): x's shape followed by F, e.g. (B, S, D, F) or (N, D, F). The
profiler records a gated MLP module's input x plus "d_model" and "ffn_dim"; ``from_profile``
appends ffn_dim. The profiler times only the MLP's glue (silu, mul) as fused_mlp (its GEMMs stay
matmul), while this family's reference and candidates are the whole MLP.

Precision: every GEMM accumulates in fp32 (fp32 inputs without TF32); h is rounded to x's dtype
once before the down projection (eager PyTorch rounds g, u, silu(g) and h).
Bytes the op must move: (2*N*D + 3*D*F)*itemsize (x, the weights, y), flops 6*N*D*F: compute
bound at LLM shapes. The SwiGLU activation alone (read g and u, write h: 3*N*F*itemsize, ~5
flops per element) is memory bound: the "separate" variant pays it as its own kernel, the
"fused" variant does it in the gate/up GEMM's epilogue and never writes g and u.

Search space (``SPACE``), rendered by ``render`` into one self-contained candidate source:
- variant "fused": one GEMM kernel computes tiles [BLOCK_M, BLOCK_N] of g and u together (two
  fp32 accumulators sharing each loaded tile of x) and writes h = silu(g) * u; then the down GEMM.
- variant "separate": a GEMM for g, one for u (each written in x's dtype, as eager does), an
  elementwise SwiGLU kernel (act_block elements per program) writing h, then the down GEMM.
- block_m, block_n, block_k, group_m, num_warps, num_stages: the tiles of every GEMM, clamped
  at launch as in the matmul family (the fused kernel's two accumulators get half the registers
  each, its shared memory holds one x tile and two weight tiles per stage).
- down_split_k: split-K of the down projection (K = F is the long dimension: decode-sized N
  has few output tiles), with the deterministic fixed-order sum of matmul's split-K.
- gemm_loads "tma": every GEMM moves its tiles by TMA where the device and the operands allow
  descriptors (else the pointer kernels run): the plain ones (g, u, the down projection) on
  the matmul family's persistent kernel, warp-specialized and subtiled (its bf16 opener,
  0.94-1.04x cuBLAS on an H100 at LLM shapes); the fused variant's gate/up kernel as a
  persistent TMA kernel of its own. A split down projection stays on the pointers.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from kernels import Family
from kernels.patterns import Fit, NoFit, Ref, Spelling, T
from kernels import _common as C
from kernels import matmul as MM

NAME = "fused_mlp"
SIGNATURE = "kernel_fn(x, w_gate, w_up, w_down)"
ARG_NAMES = ("x", "w_gate", "w_up", "w_down")
ADVERSARIAL = ("huge", "tiny", "mixed_scale", "heavy_tail")


def reference(x, w_gate, w_up, w_down):
    """engine/models.py SwiGLUMLP.forward with its weights passed in."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


# ---------------------------------------------------------------------------------------------
# shapes and inputs
# ---------------------------------------------------------------------------------------------

def split_shape(shape) -> tuple[tuple, int, int, int]:
    """(x's shape, N, D, F) of a family shape (*x.shape, F)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        raise ValueError(f"a fused_mlp shape is (*x.shape, F), e.g. (N, D, F), got {shape}")
    xs, f = shape[:-1], shape[-1]
    return xs, math.prod(xs[:-1]), xs[-1], f


def from_profile(record: dict) -> tuple:
    """x's recorded shape plus the MLP's inner width (4 * D if the profiler could not tell)."""
    xs = tuple(int(s) for s in record["shape"])
    return xs + (int(record.get("ffn_dim") or 4 * xs[-1]),)


# "huge": gate/up pre-activations of standard deviation SIGMA: fp16 keeps h and y finite;
# at |g| > 88 exp(-g) overflows fp32, where silu must give g * 0 = 0 (not inf * 0, not inf / inf).
_SIGMA = {torch.float16: 30.0, torch.bfloat16: 1e3, torch.float32: 1e3}


def _scaled_randn(gen, n: int, d: int, dtype, kind: str) -> torch.Tensor:
    """[n, d] fp32 N(0, 1) rows, scaled as the input kind asks (per row for mixed_scale)."""
    x = C.randn(gen, n, d)
    if kind == "huge":
        return x * _SIGMA[dtype]
    if kind == "tiny":
        return x * 1e-3
    if kind == "mixed_scale":
        return x * C.log_uniform(gen, n, -2.0, 1.5)
    if kind == "heavy_tail":
        return C.cauchy(gen, n, d).clamp(-30.0, 30.0)
    if kind != "normal":
        raise ValueError(f"unknown input kind {kind!r}; known: normal, {', '.join(ADVERSARIAL)}")
    return x


def make_inputs(shape, dtype, device, gen, kind="normal"):
    """{x: [*x.shape], w_gate, w_up: [F, D], w_down: [D, F]} from ``gen``; x ~ N(0, 1) and weights
    scaled by 1/sqrt(fan-in), so g, u and y have unit scale whatever D and F."""
    dtype = C.as_dtype(dtype)
    xs, n, d, f = split_shape(shape)
    x = _scaled_randn(gen, n, d, dtype, kind)
    wg = C.randn(gen, f, d) / math.sqrt(max(d, 1))
    wu = C.randn(gen, f, d) / math.sqrt(max(d, 1))
    wd = C.randn(gen, d, f) / math.sqrt(max(f, 1))
    cast = lambda t: t.to(dtype).to(device)                        # noqa: E731
    return {"x": cast(x.reshape(xs)), "w_gate": cast(wg), "w_up": cast(wu), "w_down": cast(wd)}


def error_bound(x, w_gate, w_up, w_down):
    """(|h| + dh) @ |w_down|^T, dh = |silu'(g)| |u| (|x| @ |w_gate|^T) + |silu(g)| (|x| @ |w_up|^T):
    h's own rounding plus what the rounding of g's and u's sums does to it, through the down GEMM."""
    g, u = F.linear(x, w_gate), F.linear(x, w_up)
    sg = torch.sigmoid(g)
    silu = g * sg
    dsilu = sg * (1.0 + g * (1.0 - sg))
    xa = x.abs()
    dh = dsilu.abs() * u.abs() * F.linear(xa, w_gate.abs()) + silu.abs() * F.linear(xa, w_up.abs())
    # The GEMMs' fp32 accumulation error grows with their depth up to the deterministic bound
    # gamma_K = K u (kernels/matmul.py error_bound: equal-sign terms reach it; the bound here
    # has no signed result to tell them apart, so it takes the worst case)
    depth = max(x.shape[-1], w_down.shape[-1])
    return F.linear((silu * u).abs() + dh, w_down.abs()) * max(1.0, depth / 64.0)


# |out - expected| <= atol + rtol*|expected| + stol*bound (error_bound above), expected = fp64
# reference cast to the output dtype. fp16/bf16: h is rounded to the dtype before the down GEMM
# (half an ulp, 2^-11 / 2^-8; the "separate" variant also rounds g and u): stol is twice that.
# fp32: 64 ulps, as matmul. rtol: the output's rounding (2 ulps); atol: fp16's subnormal spacing.
# (TOLERANCE[dtype] = (atol, rtol), BOUND_TOL[dtype] = stol)
TOLERANCE = {
    torch.float32: (0.0, 1e-6),
    torch.float16: (1.2e-7, 2e-3),
    torch.bfloat16: (0.0, 1.6e-2),
}
BOUND_TOL = {
    torch.float32: 64 * 2.0**-24,
    torch.float16: 2.0**-10,
    torch.bfloat16: 2.0**-7,
}


def cost(shape, dtype):
    """(bytes, flops): read x and the three weights once, write y once (h never has to leave
    the chip in a fully fused kernel); three GEMMs of 2*N*D*F flops, ~5 flops of SwiGLU per h."""
    item = C.itemsize(dtype)
    _, n, d, f = split_shape(shape)
    return (2 * n * d + 3 * d * f) * item, 6 * n * d * f + 5 * n * f


# (*x.shape, F). Mistral-7B / Llama-3-8B (D 4096, F 14336) and Llama-2-7B (F 11008) at 4096
# tokens, a batch [B, S, D], decode-sized N, a 70B-style layer, and odd sizes.
BENCH_SHAPES = ((4096, 4096, 14336), (4096, 4096, 11008), (1, 2048, 4096, 14336),
                (16, 4096, 14336), (2048, 8192, 28672), (1000, 1000, 3000), (3, 77, 64, 200))
# Under the interpreter the verifier keeps N*D*F <= 2^15; the last two are for GPUs.
SWEEP_SHAPES = ((1, 1, 1), (2, 3, 5), (16, 16, 16), (17, 33, 9), (2, 7, 16, 32), (5, 64, 96),
                (1, 8, 4000), (3, 40, 24, 10), (64, 512, 1408), (128, 1024, 1024))
EDGE_SHAPES = ((1, 1, 1), (1, 1, 7), (4, 1, 1), (13, 2, 3, 5), (1, 200, 100), (1000, 4, 8))


# ---------------------------------------------------------------------------------------------
# search space and rendering
# ---------------------------------------------------------------------------------------------

SPACE = {
    "variant": ["fused", "separate"],
    "block_m": [16, 32, 64, 128],
    "block_n": [32, 64, 128, 256],
    "block_k": [16, 32, 64, 128],
    "group_m": [1, 4, 8],
    "num_warps": [2, 4, 8],
    "num_stages": [1, 2, 3, 4],
    "down_split_k": [1, 2, 4],
    "act_block": [512, 1024, 2048, 4096],
    "gemm_loads": ["pointers", "tma"],
}
DEFAULT = {"variant": "fused", "block_m": 64, "block_n": 128, "block_k": 32, "group_m": 8,
           "num_warps": 4, "num_stages": 3, "down_split_k": 1, "act_block": 1024,
           "gemm_loads": "pointers"}

_UP_ARGS = ("a_ptr, bg_ptr, bu_ptr, h_ptr, M, N, K,\n"
            "            stride_am, stride_ak, stride_gk, stride_gn, stride_uk, stride_un,\n"
            "            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,\n"
            "            GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr,\n"
            "            DOT_FP32: tl.constexpr")


def _silu_mul(g: str, u: str) -> str:
    """silu(g) * u in fp32: g / (1 + exp(-g)) is -0 (not NaN) once exp(-g) overflows."""
    return f"{g} / (1.0 + tl.exp(-{g})) * {u}"


def _up_kernel() -> str:
    body = MM.plain_tile_head() + '''
a_ptrs = a_ptr + ram[:, None] * stride_am + rk[None, :] * stride_ak          # x [BLOCK_M, BLOCK_K]
g_ptrs = bg_ptr + rk[:, None] * stride_gk + rbn[None, :] * stride_gn         # w_gate^T [BLOCK_K, BLOCK_N]
u_ptrs = bu_ptr + rk[:, None] * stride_uk + rbn[None, :] * stride_un         # w_up^T
acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
''' + MM.k_loop([("acc_g", "g_ptrs", "bg", "stride_gk"), ("acc_u", "u_ptrs", "bu", "stride_uk")]) + f'''
h = {_silu_mul("acc_g", "acc_u")}                     # SwiGLU epilogue, fp32
h_ptrs = h_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :]                 # h contiguous [M, N]
tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])'''
    return f'''@triton.jit
def _mlp_up({_UP_ARGS}):
    """h = silu(a @ bg) * (a @ bu) for one tile [BLOCK_M, BLOCK_N] of h [M, N]: two fp32
    accumulators share every loaded tile of a; h is written once, in its dtype."""
{C.indent(body, 4)}


def _up_pointers(x2, w_gate, w_up, h, ieee, dot_fp32):
    # the up projection into h through pointers (any strides)
    N, D = x2.shape
    Fd = w_gate.shape[0]
    bm, bn, bk, stages = _fit_gemm(BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, NUM_WARPS, N, Fd, D,
                                   x2.element_size(), _smem_budget(x2.device), operands=3)
    wg, wu = w_gate.t(), w_up.t()                                  # [D, F] views
    grid = (_cdiv(N, bm) * _cdiv(Fd, bn),)
    _mlp_up[grid](x2, wg, wu, h, N, Fd, D, x2.stride(0), x2.stride(1), wg.stride(0),
                  wg.stride(1), wu.stride(0), wu.stride(1), BLOCK_M=bm, BLOCK_N=bn,
                  BLOCK_K=bk, GROUP_M=GROUP_M, EVEN_K=D % bk == 0, IEEE=ieee,
                  DOT_FP32=dot_fp32, num_warps=NUM_WARPS, num_stages=stages)
'''


# gemm_loads "tma", variant "fused": the up projection's two GEMMs and the SwiGLU as one
# persistent kernel, every tile by TMA: x [N, D] and the weights in their nn.Linear storage
# [F, D] (K-major tiles, transposed in registers), two fp32 accumulators sharing each x tile,
# h stored through a descriptor (clipped at the edges). Programs walk the tiles in one flattened
# loop, as matmul's persistent TMA kernel does.
_UP_TMA_KERNEL = f'''@triton.jit
def _mlp_up_tma(a_desc, g_desc, u_desc, h_desc, M, N, K, NUM_PROGS,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, IEEE: tl.constexpr, DOT_FP32: tl.constexpr):
    """h = silu(a @ g^T) * (a @ u^T), tiles [BLOCK_M, BLOCK_N] of h [M, N]; g, u stored [N, K]."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGS, flatten=True):
{C.indent(MM.GROUP_ORDER_SRC.strip(chr(10)), 8)}
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
{C.indent(MM.tma_kmajor_k_loop([("acc_g", "g_desc", "bg"), ("acc_u", "u_desc", "bu")]), 8)}
        h = {_silu_mul("acc_g", "acc_u")}                 # SwiGLU epilogue, fp32
        h_desc.store([off_m, off_n], h.to(h_desc.dtype))


def _up_tma(x2, w_gate, w_up, h, ieee, dot_fp32):
    # the TMA up projection into h, or False where the device or the layouts rule it out
    if not _has_tma(x2.device) or not all(_rows_ok(t) for t in (x2, w_gate, w_up, h)):
        return False
    item = x2.element_size()
    N, D = x2.shape
    Fd = w_gate.shape[0]
    bm, bn, bk, stages = _fit_gemm(BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, NUM_WARPS, N, Fd, D,
                                   item, _smem_budget(x2.device), operands=3)
    tiles = _cdiv(N, bm) * _cdiv(Fd, bn)
    progs = min(tiles, _num_sms(x2.device))
    _mlp_up_tma[(progs,)](
        TensorDescriptor(x2, [N, D], [x2.stride(0), 1], [bm, bk]),
        TensorDescriptor(w_gate, [Fd, D], [w_gate.stride(0), 1], [bn, bk]),
        TensorDescriptor(w_up, [Fd, D], [w_up.stride(0), 1], [bn, bk]),
        TensorDescriptor(h, [N, Fd], [Fd, 1], [bm, bn]), N, Fd, D, progs,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M, IEEE=ieee, DOT_FP32=dot_fp32,
        num_warps=NUM_WARPS, num_stages=stages)
    return True
'''


_ACT_KERNEL = f'''@triton.jit
def _swiglu(g_ptr, u_ptr, h_ptr, total, BLOCK: tl.constexpr):
    """h = silu(g) * u elementwise over the flat [total] (fp32 math, rounded once)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(h_ptr + offs, ({_silu_mul("g", "u")}).to(h_ptr.dtype.element_ty), mask=mask)
'''


def _launcher(p) -> str:
    if p["variant"] == "fused":
        call = "_up_pointers(x2, w_gate, w_up, h, ieee, dot_fp32)"
        if p["gemm_loads"] == "tma":               # the pointers where descriptors are ruled out
            call = f"if not _up_tma(x2, w_gate, w_up, h, ieee, dot_fp32):\n        {call}"
        up = f'''h = torch.empty((N, Fd), dtype=x.dtype, device=x.device)
    {call}'''
    else:
        up = '''cfg = (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, 1, NUM_WARPS, NUM_STAGES, 1)
    g = _gemm(x2, w_gate.t(), cfg)                                 # [N, F] in x's dtype
    u = _gemm(x2, w_up.t(), cfg)
    h = torch.empty((N, Fd), dtype=x.dtype, device=x.device)
    _swiglu[(_cdiv(N * Fd, ACT_BLOCK),)](g, u, h, N * Fd, BLOCK=ACT_BLOCK, num_warps=4)'''
    return f'''

def kernel_fn(x, w_gate, w_up, w_down):
    """SwiGLU MLP: (silu(x @ w_gate^T) * (x @ w_up^T)) @ w_down^T for x [..., D], w_gate and
    w_up [F, D], w_down [D, F] (nn.Linear layout, any strides); returns [..., D] in x's dtype."""
    D = x.shape[-1]
    Fd = w_gate.shape[0]
    if w_gate.shape != (Fd, D) or w_up.shape != (Fd, D) or w_down.shape != (D, Fd):
        raise ValueError("weights must be w_gate, w_up [F, D] and w_down [D, F]")
    if not (x.dtype == w_gate.dtype == w_up.dtype == w_down.dtype):
        raise ValueError("x and the weights must share a dtype")
    out_shape = x.shape
    x2 = x.reshape(-1, D)                                          # [N, D]
    N = x2.shape[0]
    if N == 0:
        return torch.empty(out_shape, dtype=x.dtype, device=x.device)
    # the interpreter's tl.dot cannot multiply bf16 tiles (numpy has none): upcast them there
    dot_fp32 = x.dtype == torch.bfloat16 and x.device.type == "cpu"
    ieee = x.dtype == torch.float32 or dot_fp32
    {up}
    down = (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, DOWN_SPLIT_K, NUM_WARPS, NUM_STAGES, 1)
    y = _gemm(h, w_down.t(), down)                                 # [N, D]
    return y.reshape(out_shape)

''' + (_GEMM_TMA_SRC if p["gemm_loads"] == "tma" else _GEMM_SRC)


_GEMM_SRC = '''

def _gemm(a, b, cfg):
    # a [M, K] @ b [K, N] in a's dtype: the pointer kernel
    return _matmul(a.unsqueeze(0), b.unsqueeze(0), cfg)[0]
'''
_GEMM_TMA_SRC = '''

def _gemm(a, b, cfg):
    # a [M, K] @ b [K, N] in a's dtype: the TMA kernel where the device and the operands allow
    # it (unsplit), else the pointer kernel
    if cfg[4] == 1:
        c = _matmul_tma(a, b, cfg)
        if c is not None:
            return c
    return _matmul(a.unsqueeze(0), b.unsqueeze(0), cfg)[0]
'''


def render(params) -> str:
    """Complete candidate source for one point of SPACE (missing params take DEFAULT values)."""
    p = C.resolve(NAME, SPACE, DEFAULT, params)
    tma = p["gemm_loads"] == "tma"
    if p["variant"] == "fused":
        how = ("one GEMM kernel for g and u with the SwiGLU in its epilogue (writes h once:\n"
               "N*F*itemsize), then the down GEMM")
    else:
        how = ("GEMMs writing g and u, a SwiGLU kernel (reads both, writes h: 3*N*F*itemsize\n"
               "more traffic than the fused variant's), then the down GEMM")
    doc = f'''"""Fused-MLP candidate ({p["variant"]}): y = (silu(x @ w_gate^T) * (x @ w_up^T)) @ w_down^T.

x [..., D], w_gate, w_up [F, D], w_down [D, F] (nn.Linear layout), any strides; y shaped like x
in x's dtype. fp32 accumulation in every GEMM (fp32 operands without TF32).
Bytes the op must move: (2*N*D + 3*D*F)*itemsize; flops 6*N*D*F. This variant: {how}.
Point: {C.point_line(SPACE, p)}
"""
{C.IMPORTS_SRC}
BLOCK_M = {p["block_m"]}          # GEMM output tile rows (clamped at launch)
BLOCK_N = {p["block_n"]}         # GEMM output tile columns (F for gate/up, D for down)
BLOCK_K = {p["block_k"]}          # K step
GROUP_M = {p["group_m"]}           # row-tiles per group of the swizzled tile order
NUM_WARPS = {p["num_warps"]}
NUM_STAGES = {p["num_stages"]}        # software-pipelining depth of the K loops
DOWN_SPLIT_K = {p["down_split_k"]}      # K slices of the down projection
ACT_BLOCK = {p["act_block"]}       # elements per program of the SwiGLU kernel ("separate")
SUM_BLOCK = 1024       # elements per program of the split-K sum
'''
    if tma:                            # matmul's TMA plan reads these
        doc += '''TMA_PERSISTENT = True  # gemm_loads "tma": the TMA kernels' programs walk the tiles
TMA_WS = True          # matmul's warp-specialized kernel
SUBTILE = True         # and matmul's stores each tile as two halves
'''
    parts = [doc, MM.GEMM_HELPERS_SRC, "\n", MM.gemm_kernel(False), "\n", MM.SPLITK_SUM_SRC]
    if p["variant"] == "fused":
        parts += ["\n", _up_kernel()]
    else:
        parts += ["\n", _ACT_KERNEL]
    parts += [MM.launcher_src(False)]
    if tma:
        parts += [C.NUM_SMS_SRC, "\n\n", C.TMA_HELPERS_SRC, MM.tma_src(True, True),
                  MM.tma_host_src()]
        if p["variant"] == "fused":
            parts += [C.ROWS_OK_SRC, "\n\n", _UP_TMA_KERNEL]
    parts += [_launcher(p)]
    return C.tidy("\n".join(parts))


# bf16/fp16 targets' first moves, both on TMA: the separate variant with its three GEMMs on the
# matmul family's bf16 opener (128 x 256 x 64, 8 warps, 3 stages: 0.94-1.04x cuBLAS on an H100),
# then the fused variant (gate and up as one persistent kernel with two accumulators and the
# SwiGLU in its epilogue, 128 x 128 x 64: g and u never reach memory, the fusion eager and
# torch.compile do not make). In the loop on an H100 (LLaMA-3-8B's MLP, 8 x 2048 x 4096 x
# 14336, bf16, two calls) the fused point ran 20,197.6 us and the separate one 16,082.7 us
# (compile 16,385.8): separate first, fused still tried second.
HALF_OPENERS = ({"variant": "separate", "gemm_loads": "tma", "block_m": 128, "block_n": 256,
                 "block_k": 64, "num_warps": 8, "num_stages": 3},
                {"variant": "fused", "gemm_loads": "tma", "block_m": 128, "block_n": 128,
                 "block_k": 64, "num_warps": 8, "num_stages": 3})


def openers_for(shape, dtype: str) -> tuple:
    return () if str(dtype).removeprefix("torch.") == "float32" else HALF_OPENERS


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
    description="SwiGLU MLP down(silu(gate(x)) * up(x)), nn.Linear weight layout.",
    notes={"shape": "(*x.shape, F)", "weights": "w_gate, w_up [F, D]; w_down [D, F]",
           "bound": "compute", "activation_alone": "memory bound (3*N*F*itemsize)"},
    error_bound=error_bound,
    bound_tol=BOUND_TOL,
    from_profile=from_profile,
    openers_for=openers_for,
)


# ---------------------------------------------------------------------------------------------
# the SwiGLU activation alone: h = silu(g) * u, timed apart by the benchmark
# ---------------------------------------------------------------------------------------------
# Not a family the profiler or the loop targets (no model runs it as one op): the elementwise
# kernel of the "separate" variant as a standalone kernel_fn(g, u), so that `python -m engine
# bench --families fused_mlp` can time the memory-bound part of the MLP against eager
# F.silu(g) * u and torch.compile, at the MLPs' [N, F], and the verifier can judge it.
# Bytes it must move: read g and u, write h: 3*N*F*itemsize; ~5 flops per element.

def act_reference(g, u):
    """What eager SwiGLUMLP runs between its GEMMs: silu, then a multiply (two kernels)."""
    return F.silu(g) * u


def act_make_inputs(shape, dtype, device, gen, kind="normal"):
    """{g, u: [N, F]}: pre-activations g ~ N(0, 1) (scaled by kind, as the MLP's make_inputs
    scales x) and u ~ N(0, 1)."""
    dtype = C.as_dtype(dtype)
    n, f = (int(s) for s in shape)
    g = _scaled_randn(gen, n, f, dtype, kind)
    u = C.randn(gen, n, f)
    return {"g": g.to(dtype).to(device), "u": u.to(dtype).to(device)}


def act_cost(shape, dtype):
    n, f = (int(s) for s in shape)
    return 3 * n * f * C.itemsize(dtype), 5 * n * f


def act_shape(shape) -> tuple[int, int]:
    """[N, F] of h for a fused_mlp shape (*x.shape, F)."""
    _, n, _, f = split_shape(shape)
    return n, f


# fp32 math rounded once: 2 ulps of the output; atol covers the subnormal silu(g) of very
# negative g, where g / (1 + exp(-g)) is -0 once exp overflows (fp16: its subnormal spacing).
ACT_TOLERANCE = {
    torch.float32: (1e-37, 1e-6),
    torch.float16: (1.2e-7, 2e-3),
    torch.bfloat16: (1e-37, 1.6e-2),
}
ACT_SPACE = {"act_block": SPACE["act_block"]}
ACT_DEFAULT = {"act_block": DEFAULT["act_block"]}


def act_render(params) -> str:
    p = C.resolve("fused_mlp.swiglu", ACT_SPACE, ACT_DEFAULT, params)
    doc = f'''"""SwiGLU activation: h = silu(g) * u elementwise, the kernel between fused_mlp's GEMMs.

g, u [N, F] (any strides; copied contiguous first if they are not), h [N, F] in their dtype,
computed in fp32 and rounded once. Bytes the op must move: 3*N*F*itemsize.
Point: {C.point_line(ACT_SPACE, p)}
"""
{C.IMPORTS_SRC}
ACT_BLOCK = {p["act_block"]}       # elements per program
'''
    launcher = '''

def kernel_fn(g, u):
    if g.shape != u.shape or g.dtype != u.dtype:
        raise ValueError("g and u must share a shape and a dtype")
    g, u = g.contiguous(), u.contiguous()
    h = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    total = g.numel()
    if total:
        _swiglu[(_cdiv(total, ACT_BLOCK),)](g, u, h, total, BLOCK=ACT_BLOCK, num_warps=4)
    return h
'''
    return C.tidy("\n".join([doc, _ACT_KERNEL, launcher]))


ACTIVATION = Family(
    name="fused_mlp.swiglu",
    signature="kernel_fn(g, u)",
    arg_names=("g", "u"),
    reference=act_reference,
    make_inputs=act_make_inputs,
    tolerance=ACT_TOLERANCE,
    cost=act_cost,
    bench_shapes=tuple(dict.fromkeys(act_shape(s) for s in BENCH_SHAPES)),
    sweep_shapes=((1, 1), (2, 3), (17, 33), (5, 96), (1, 4000), (64, 1408), (128, 1024)),
    edge_shapes=((1, 7), (13, 1), (4099, 3)),
    adversarial=ADVERSARIAL,
    space=ACT_SPACE,
    default=ACT_DEFAULT,
    render=act_render,
    description="SwiGLU activation silu(g) * u alone: the memory-bound part of fused_mlp "
                "(its \"separate\" variant's elementwise kernel), timed apart.",
    notes={"bound": "memory", "no_run": "No run in the database kept a fused_mlp experiment of "
                                        "the \"separate\" variant: starter only."},
)


# ---------------------------------------------------------------------------------------------
# spellings: how model code writes it (kernels/patterns.py)
# ---------------------------------------------------------------------------------------------

_ACTS = {
    "silu": lambda g: F.silu(g),
    "sigmoid": lambda g: g * torch.sigmoid(g),
    "gelu": lambda g: F.gelu(g),                  # approximate captured: "none" or "tanh"
}


def _gated(act):
    def fn(x, wg, wu, wd):
        return F.linear(_ACTS[act](F.linear(x, wg)) * F.linear(x, wu), wd)
    args = (("x", T((2, 4, 8))), ("wg", T((16, 8))), ("wu", T((16, 8))), ("wd", T((8, 16))))
    return Spelling(f"{act}_gate_up_down", fn, args, loose=("approximate",))


def _packed(act, first):
    # gate and up as one projection [2F, D] split by chunk (Phi-3: gate first; many GLU layers
    # write "x, gate = chunk" with the activation on the second half)
    def fn(x, wgu, wd):
        a, b = F.linear(x, wgu).chunk(2, dim=-1)
        g, u = (a, b) if first else (b, a)
        return F.linear(u * _ACTS[act](g), wd)
    args = (("x", T((2, 4, 8))), ("wgu", T((32, 8))), ("wd", T((8, 16))))
    return Spelling(f"{act}_packed_{'first' if first else 'second'}", fn, args, loose=("approximate",))


SPELLINGS = tuple(_gated(a) for a in _ACTS) + tuple(_packed(a, f) for a in _ACTS for f in (True, False))
_ACT_SPEC = {"silu": None, "sigmoid": None, "gelu:none": "gelu", "gelu:tanh": "gelu_tanh"}


def from_match(m):
    """down(act(gate(x)) * up(x)) with bias-free projections; act silu (SwiGLU) or gelu (GeGLU)."""
    x = m.meta("x")
    packed = m.meta("wgu")
    if packed is not None:                     # one [2F, D] projection: its two row blocks
        return _packed_fit(m, x, packed)
    ws = [m.meta(n) for n in ("wg", "wu", "wd")]
    if x is None or any(w is None or len(w["shape"]) != 2 for w in ws):
        return None
    d, (f, d1), (f2, d2), (d3, f3) = x["shape"][-1], ws[0]["shape"], ws[1]["shape"], ws[2]["shape"]
    if not (d == d1 == d2 == d3 and f == f2 == f3):
        return None
    if any(w["dtype"] != x["dtype"] for w in ws) or not x["dtype"].is_floating_point:
        raise NoFit("weights and x in different dtypes: the contract takes one")
    spec = _act_spec(m)
    if spec is None:
        return None
    args = {"x": Ref("x"), "w_gate": Ref("wg"), "w_up": Ref("wu"), "w_down": Ref("wd")}
    return Fit(spec, tuple(x["shape"]) + (f,), args)


def _act_spec(m) -> dict | None:
    """The spec of the matched activation (the spelling's name, gelu's approximate captured);
    None for one no contract computes."""
    act = m.pattern.split("/")[1].split("_")[0]
    if act == "gelu":
        act = f"gelu:{m.captures.get('approximate', 'none')}"
    if act not in _ACT_SPEC:
        return None
    return {"act": _ACT_SPEC[act]} if _ACT_SPEC[act] else {}


def _packed_fit(m, x, wgu):
    """The packed spelling: w_gate and w_up are row blocks of one [2F, D] weight (contiguous
    views: the kernel reads them in place), the gate's block first or second as chunk split it."""
    wd = m.meta("wd")
    if x is None or wd is None or len(wgu["shape"]) != 2 or len(wd["shape"]) != 2:
        return None
    (f2, d1), (d3, f), d = wgu["shape"], wd["shape"], x["shape"][-1]
    if not (f2 == 2 * f and d == d1 == d3):
        return None
    if wgu["dtype"] != x["dtype"] or wd["dtype"] != x["dtype"] or not x["dtype"].is_floating_point:
        raise NoFit("weights and x in different dtypes: the contract takes one")
    spec = _act_spec(m)
    if spec is None:
        return None
    first, second = Ref("wgu", (("slice", 0, 0, f),)), Ref("wgu", (("slice", 0, f, 2 * f),))
    gate, up = (first, second) if m.pattern.endswith("_first") else (second, first)
    args = {"x": Ref("x"), "w_gate": gate, "w_up": up, "w_down": Ref("wd")}
    return Fit(spec, tuple(x["shape"]) + (f,), args)


# GeLU in fp32 for the kernels: the exact form through erf, the tanh form through exp
# (tanh(z) = 1 - 2 / (exp(2z) + 1): exact limits at both ends, no overflow to NaN).
_GELU_SRC = {
    "gelu": "0.5 * {g} * (1.0 + tl.erf({g} * 0.7071067811865476)) * {u}",
    "gelu_tanh": ("0.5 * {g} * (2.0 - 2.0 / (tl.exp(1.5957691216057308 * ({g} + 0.044715 * {g} * {g} * {g})) "
                  "+ 1.0)) * {u}"),
}


def _act_reference(act):
    approx = "tanh" if act == "gelu_tanh" else "none"

    def reference(x, w_gate, w_up, w_down):
        return F.linear(F.gelu(F.linear(x, w_gate), approximate=approx) * F.linear(x, w_up), w_down)
    return reference


def _act_bound(act):
    approx = "tanh" if act == "gelu_tanh" else "none"

    def bound(x, w_gate, w_up, w_down):
        # as error_bound, with gelu's value and a slope bound of 1.13 (|gelu'| <= 1.13 everywhere)
        g, u = F.linear(x, w_gate), F.linear(x, w_up)
        a = F.gelu(g, approximate=approx)
        xa = x.abs()
        dh = 1.13 * u.abs() * F.linear(xa, w_gate.abs()) + a.abs() * F.linear(xa, w_up.abs())
        depth = max(x.shape[-1], w_down.shape[-1])
        return F.linear((a * u).abs() + dh, w_down.abs()) * max(1.0, depth / 64.0)
    return bound


def configure(spec: dict) -> Family:
    """``spec["act"]``: "gelu" (erf) or "gelu_tanh": the GeGLU MLP down(gelu(gate(x)) * up(x))."""
    act = spec.get("act", "silu")
    if set(spec) - {"act"} or act not in ("silu", "gelu", "gelu_tanh"):
        raise ValueError(f"fused_mlp takes a spec {{act: silu|gelu|gelu_tanh}}; got {spec!r}")
    if act == "silu":
        return FAMILY
    expr = _GELU_SRC[act]

    def render_act(params):
        src = render(params)
        for g, u in (("acc_g", "acc_u"), ("g", "u")):
            src = src.replace(_silu_mul(g, u), expr.format(g=g, u=u))
        return src.replace('"""Fused-MLP candidate', f'"""GeGLU ({act}) fused-MLP candidate, silu read as {act}', 1)
    return dataclasses.replace(
        FAMILY, reference=_act_reference(act), error_bound=_act_bound(act), render=render_act,
        signature=f"kernel_fn(x, w_gate, w_up, w_down) with {act}",
        description=f"GeGLU MLP down({act}(gate(x)) * up(x)), nn.Linear weight layout.",
        spec=dict(spec))


FAMILY = dataclasses.replace(
    FAMILY, spellings=SPELLINGS, from_match=from_match,
    op_schema="(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down) -> Tensor")
