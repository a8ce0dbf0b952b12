"""Matmul family: c = a @ b, a [M, K] @ b [K, N] -> c [M, N], optionally batched.

Shapes (the family's ``shape``) are GEMM problem sizes, not one tensor's shape:
(M, K, N) for a [M, K] @ b [K, N], and (Bt, M, K, N) for a batched product a [Bt, M, K] @
b [Bt, K, N] (q @ k^T and p @ v of eager attention, one product per (batch, head)). The profiler
records every aten::linear/mm/addmm/bmm/matmul call as [M, K, N] plus "batch"; ``from_profile``
turns that into this shape. b is made, as nn.Linear and q @ k^T pass it, as the transpose of a
contiguous [N, K] tensor (stride (1, K)); candidates must take any strides.

Precision: fp16/bf16 inputs, fp32 accumulation, output rounded once to the input dtype. fp32
inputs are multiplied in full fp32 (``input_precision="ieee"``: Triton's default on NVIDIA is
TF32, 10 mantissa bits, which the tolerance rejects), as torch.matmul does by default
(torch.backends.cuda.matmul.allow_tf32 is False). ``input_precision`` is accepted by Triton 3.0+
(3.6 and 3.9 both; "ieee" is valid on NVIDIA and AMD). Under Triton's CPU interpreter tl.dot
ignores input_precision (numpy fp32 matmul), and it multiplies bf16 tiles as their raw uint16
bit patterns (numpy has no bf16), so on CPU tensors the candidates upcast bf16 tiles to fp32
before tl.dot; on a GPU the native bf16 dot runs. Same products (bf16 x bf16 is exact in fp32),
same fp32 accumulation.

Bytes the op must move: (M*K + K*N + M*N) * itemsize per batch; flops 2*M*N*K per batch. At LLM
shapes it is compute bound (4096^3 bf16: 0.8 ms of tensor-core time against 0.02 ms of HBM
traffic); at M <= 64 (decode) it is bound by reading b.

Search space (``SPACE``), rendered by ``render`` into one self-contained candidate source:
- block_m, block_n, block_k: the output tile [BLOCK_M, BLOCK_N] a program computes and the K
  step. Clamped at launch: no larger than the problem (min 16, the smallest tl.dot), the fp32
  accumulator at most 128 elements per thread (BLOCK_M*BLOCK_N <= 4096 * num_warps), and the
  pipelined operand tiles (num_stages of [BLOCK_M, BLOCK_K] + [BLOCK_K, BLOCK_N]) within the
  device's shared memory (num_stages drops, then BLOCK_K halves).
- group_m: grouped ("swizzled") tile order: GROUP_M row-tiles sweep the columns together so the
  tiles running at once share a's rows and b's columns in L2 (1: plain row-major order).
- num_warps, num_stages (software pipelining depth of the K loop).
- split_k: K is cut into SPLIT_K slices, one program per (tile, slice) writes an fp32 partial
  tile to a workspace [SPLIT_K, Bt, M, N]; a second kernel sums the slices in a fixed order and
  rounds: deterministic, no atomics. More programs when M*N has few tiles (decode, tall K).
  Clamped so every slice has at least one BLOCK_K step.
- grid "tiles" (one program per output tile) or "persistent" (SMs * progs_per_sm programs per
  (batch, slice), each walking tiles pid, pid + P, ...).
- loads "pointers" (every tile loaded through computed pointers, any GPU) or "tma": operand tiles
  moved by the tensor memory accelerator through host-side tensor descriptors (Hopper and newer
  NVIDIA GPUs; the interpreter runs them too). A descriptor zero-fills past the edges and clips
  the store, so nothing is masked; b stored K-major (W^T of a linear layer, q @ k^T's k^T) is
  loaded as [BLOCK_N, BLOCK_K] tiles and transposed in registers. It applies without split-K,
  to operands with a unit last stride and 16-byte aligned rows (K and N multiples of 8 in
  16-bit types; an N that is not, with b K-major, keeps the TMA loads and stores c through
  masked pointers, an odd vocabulary's LM head, except on the warp-specialized kernel) and a
  batch of one or a batch on both sides; anything else, and GPUs without
  TMA (AMD, NVIDIA before sm_90), takes the pointer path. On the persistent grid the TMA
  kernel's programs walk every batch's tiles in one flattened loop, which lets Triton's
  pipeliner start the next tile's loads during this tile's epilogue. "tma_ws" is "tma"
  warp-specialized (tl.range(warp_specialize=True): producer warps load, consumer warps
  multiply) on the K loop, or on the persistent tile loop, where the installed Triton supports
  it on the GPU; a build that cannot compile it fails the verifier's smoke test like any other
  broken candidate.
- subtile: the TMA kernel stores its tile as two [BLOCK_M, BLOCK_N / 2] halves (half the
  epilogue's shared-memory staging, room for one more pipeline stage at 128 x 256).
- fp32_dot (fp32 operands only): "ieee" (full fp32), "tf32x3" (three TF32 products a K step,
  the operands split in registers), "tf32x3_split" (the operands split once before the GEMM).
- k_major: fp32 operands whose K is not their contiguous dim are copied K-contiguous first.
- fill: at launch, halve the output tile (columns first, then rows, not below 64) while twice
  its tiles still fit the GPU's SMs in one wave. One point serves every shape of
  a target, and the tile that suits the LM head starves a narrow projection: on an H100,
  LLaMA-3-8B at 1 x 2048 ran its 2048 x 4096 x 1024 K/V projections with 128 x 256 tiles (64
  tiles for 132 SMs) at 0.61x cuBLAS while the same point ran the 4096-wide ones at 1.07x.
Out-of-range rows and columns of a partial tile re-read valid ones (index modulo M and N) and are
never stored, so the loads need no M/N masks; the K tail is masked unless K is a multiple of
BLOCK_K (EVEN_K, decided at launch).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from kernels import Family
from kernels.patterns import Fit, NoFit, Ref, Spelling, T
from kernels import _common as C

NAME = "matmul"
SIGNATURE = "kernel_fn(a, b)"
ARG_NAMES = ("a", "b")
ADVERSARIAL = ("huge", "tiny", "mixed_scale", "constant", "heavy_tail")


def reference(a, b):
    """torch.matmul: what F.linear (x @ W^T), q @ k^T and p @ v run."""
    return torch.matmul(a, b)


# ---------------------------------------------------------------------------------------------
# shapes and inputs
# ---------------------------------------------------------------------------------------------

def problem(shape) -> tuple[int, int, int, int]:
    """(Bt, M, K, N) of a family shape (M, K, N) or (Bt, M, K, N)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 3:
        return (1,) + shape
    if len(shape) == 4:
        return shape
    raise ValueError(f"a matmul shape is (M, K, N) or (Bt, M, K, N), got {shape}")


def from_profile(record: dict) -> tuple:
    """The profiler's [M, K, N] plus "batch" (batched products) as this family's shape."""
    m, k, n = (int(s) for s in record["shape"])
    batch = int(record.get("batch", 1) or 1)
    return (batch, m, k, n) if batch > 1 else (m, k, n)


# Output magnitude T of the "huge" and "tiny" kinds (positive entries, so every output is about
# T): fp16 stays below its 65504 max with room, bf16/fp32 sit far beyond fp16's range.
_HUGE = {torch.float16: 2e4, torch.bfloat16: 1e30, torch.float32: 1e30}
_TINY = {torch.float16: 1e-5, torch.bfloat16: 1e-30, torch.float32: 1e-30}
# "mixed_scale": a's rows and the output columns get scales 10^-E .. 10^E each
_MIXED_E = {torch.float16: 1.5, torch.bfloat16: 6.0, torch.float32: 6.0}


def _operand(gen, bt, rows, k, kind, dtype, side):
    """Float32 [bt, rows, k]: a's rows (side "a") or the rows of w = b^T (side "b"), such that
    a @ w^T has the magnitudes ``kind`` asks for."""
    if kind == "normal":
        x = C.randn(gen, bt, rows, k)
        # a ~ N(0, 1), b ~ N(0, 1/K): every output has unit variance, whatever K
        return x if side == "a" else x / math.sqrt(max(k, 1))
    if kind in ("huge", "tiny"):
        t = (_HUGE if kind == "huge" else _TINY)[dtype]
        return (0.5 + C.rand(gen, bt, rows, k)) * math.sqrt(t / max(k, 1))
    if kind == "mixed_scale":
        e = _MIXED_E[dtype]
        scale = torch.pow(10.0, e * (2.0 * C.rand(gen, bt, rows, 1) - 1.0))
        x = C.randn(gen, bt, rows, k) * scale
        return x if side == "a" else x / math.sqrt(max(k, 1))
    if kind == "constant":
        # every output equals K * ca * cb: a garbage or doubly counted K-tail element shows
        c = C.randn(gen, bt, 1, 1)
        return c.expand(bt, rows, k).clone() if side == "a" else (c / max(k, 1)).expand(bt, rows, k).clone()
    if kind == "heavy_tail":
        # Cauchy entries (clamped: |a| <= 100, |b| <= 100/K keeps fp16 outputs below 1e4)
        x = C.cauchy(gen, bt * rows, k).reshape(bt, rows, k).clamp(-100.0, 100.0)
        return x if side == "a" else x / max(k, 1)
    raise ValueError(f"unknown input kind {kind!r}; known: normal, {', '.join(ADVERSARIAL)}")


def make_inputs(shape, dtype, device, gen, kind="normal"):
    """{a: [M, K] or [Bt, M, K] contiguous, b: [K, N] or [Bt, K, N] as the transpose of a
    contiguous [N, K] (the layout F.linear multiplies by)} from ``gen``."""
    dtype = C.as_dtype(dtype)
    bt, m, k, n = problem(shape)
    batched = len(tuple(shape)) == 4
    a = _operand(gen, bt, m, k, kind, dtype, "a")
    w = _operand(gen, bt, n, k, kind, dtype, "b")                      # [Bt, N, K]
    if not batched:
        a, w = a[0], w[0]
    a = a.to(dtype).to(device)
    b = w.to(dtype).to(device).transpose(-1, -2)                       # [.., K, N], stride (1, K)
    return {"a": a, "b": b}


def error_bound(a, b):
    """The scale of the rounding error of a sum of K products, per output element:
    |a| @ |b| * max(1, sqrt(K) / 8) + |a @ b| * K / 64 (times stol = 64 fp32 ulps).

    Two regimes (a GPU's fp32 dot is a chain of FMAs per output, each rounding the running sum):
    - errors of random sign add up like a random walk, ~sqrt(K) u |a||b| (the probabilistic
      bound of Higham and Mary, SIAM J. Sci. Comput. 2019): the first term, 64 ulps of |a||b|
      up to K = 64 and 8 sqrt(K) ulps beyond;
    - terms of one sign make every partial sum grow towards the result and round the same way:
      the error drifts like K u |a @ b| (the deterministic gamma_K bound, which such inputs
      reach): the second term, which is small wherever the products cancel.
    Measured on the H200: a correct kernel was off by 88 ulps at K = 4096 with positive random
    entries and by 560 with constant ones; a flat 64 ulps rejected both. TF32 products (6800
    ulps at K = 16; 190-270 at K = 16k) and fp16 accumulators stay rejected: random-sign inputs
    keep the bound near sqrt(K), and the sweep has small-K shapes."""
    k = a.shape[-1]
    return (torch.matmul(a.abs(), b.abs()) * max(1.0, math.sqrt(k) / 8.0)
            + torch.matmul(a, b).abs() * (k / 64.0))


# |out - expected| <= atol + rtol*|expected| + stol*error_bound(a, b), expected = fp64 reference
# cast to the output dtype. stol = 64 fp32 ulps, times the growth with K above. Under the
# interpreter (numpy's blocked dots) a correct fp32-accumulating kernel stays
# below 8 ulps (random signs) to 30 (positive entries, BLOCK_K = 16 steps, K = 11008);
# TF32 products (fp32 inputs) are off by 190-270 ulps at K = 16k (6800 at K = 16), and an fp16
# accumulator by over 340. |a||b| grows with K, so does the bound. rtol: the output's rounding to
# fp16/bf16 (one ulp = 2^-10 / 2^-7 relative, doubled); atol: fp16's subnormal spacing.
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
    """(bytes, flops): read a and b once, write c once; one multiply and one add per product."""
    item = C.itemsize(dtype)
    bt, m, k, n = problem(shape)
    return bt * (m * k + k * n + m * n) * item, 2 * bt * m * n * k


# (M, K, N) and (Bt, M, K, N). LLM projections at 4096 tokens: Llama-2-7B q/o (4096^3) and
# gate/up (K=4096, N=11008), down (K=11008, N=4096); Mistral-7B/Llama-3-8B gate/up (N=14336),
# down, GQA k/v (N=1024), the lm_head (N=32000); decode-sized M (1, 16); attention's per-head
# q @ k^T and p @ v; and odd sizes.
BENCH_SHAPES = ((4096, 4096, 4096), (4096, 11008, 4096), (4096, 4096, 11008),
                (4096, 4096, 14336), (4096, 14336, 4096), (4096, 4096, 1024), (4096, 4096, 32000),
                (16, 4096, 4096), (1, 4096, 14336), (32, 2048, 128, 2048), (32, 2048, 2048, 128),
                (1000, 1000, 1000), (4097, 4095, 1023), (3, 5000, 7))
# Under the interpreter the verifier keeps shapes with Bt*M*K*N <= 2^15; the rest are for GPUs.
SWEEP_SHAPES = ((1, 1, 1), (2, 3, 5), (16, 16, 16), (17, 33, 9), (31, 64, 15), (64, 8, 64),
                (3, 7, 40, 5), (1, 300, 100), (4, 1000, 8), (2, 16, 32, 16),
                (128, 4096, 128), (1, 4096, 11008), (512, 512, 512), (4, 256, 64, 256))
EDGE_SHAPES = ((1, 1, 1), (1, 17, 1), (13, 1, 7), (97, 127, 2), (5, 2, 3, 7), (2, 1, 16000),
               (4099, 7, 1), (1, 2049, 3))


# ---------------------------------------------------------------------------------------------
# search space and rendering
# ---------------------------------------------------------------------------------------------

SPACE = {
    "block_m": [16, 32, 64, 128, 256],
    "block_n": [16, 32, 64, 128, 256],
    "block_k": [16, 32, 64, 128],
    "group_m": [1, 4, 8, 16],
    "num_warps": [2, 4, 8],
    "num_stages": [1, 2, 3, 4, 5],
    "split_k": [1, 2, 4, 8, 16],
    "grid": ["tiles", "persistent"],
    "progs_per_sm": [1, 2, 4],
    "loads": ["pointers", "tma", "tma_ws"],
    "fp32_dot": ["ieee", "tf32x3", "tf32x3_split"],
    "k_major": [False, True],
    "subtile": [False, True],
    "fill": [False, True],
}
DEFAULT = {"block_m": 128, "block_n": 128, "block_k": 32, "group_m": 8, "num_warps": 4,
           "num_stages": 3, "split_k": 1, "grid": "tiles", "progs_per_sm": 1, "loads": "pointers",
           "fp32_dot": "ieee", "k_major": False, "subtile": False, "fill": False}


GEMM_HELPERS_SRC = '''
MAX_ACC_PER_THREAD = 128   # fp32 accumulator registers per thread: BLOCK_M*BLOCK_N <= 4096*warps


''' + C.SMEM_BUDGET_SRC + '''

def _fit_gemm(bm, bn, bk, stages, warps, M, N, K, itemsize, budget, operands=2, keep_n=False):
    """Clamp a tile [bm, bn] with K step bk and its pipeline depth to the problem and the device:
    no block larger than its dimension (min 16, the smallest tl.dot), the fp32 accumulator(s)
    within MAX_ACC_PER_THREAD registers per thread, and ``stages`` buffered copies of the
    ``operands`` input tiles ([bm, bk] and (operands - 1) x [bk, bn]) within ``budget`` bytes
    of shared memory (stages drop first, then bk halves). ``keep_n``: bn is the whole row a
    fused reduction needs; only bm shrinks (to 16 at least)."""
    bm = min(bm, max(16, _pow2(M)))
    if not keep_n:
        bn = min(bn, max(16, _pow2(N)))
    bk = min(bk, max(16, _pow2(K)))
    max_acc = MAX_ACC_PER_THREAD * 32 * warps // max(1, operands - 1)
    while bm * bn > max_acc and max(bm, bn) > 16:
        if keep_n and bm <= 16:
            break
        if bm >= bn or keep_n:
            bm //= 2
        else:
            bn //= 2

    def smem(s, k):
        return max(1, s) * (bm + (operands - 1) * bn) * k * itemsize

    while stages > 1 and smem(stages, bk) > budget:
        stages -= 1
    while bk > 16 and smem(stages, bk) > budget:
        bk //= 2
    return bm, bn, bk, stages
'''


def tile_prologue() -> str:
    return '''
pid1 = tl.program_id(1)                                            # batch * SPLIT_K + split
batch = (pid1 // SPLIT_K).to(tl.int64)
split = pid1 % SPLIT_K
k_lo = split * K_SPLIT                                             # this slice: [k_lo, k_lo + k_len)
k_len = tl.minimum(K - k_lo, K_SPLIT)
a_base = a_ptr + batch * stride_ab
b_base = b_ptr + batch * stride_bb
c_base = c_ptr + split.to(tl.int64) * stride_cs + batch * stride_cb
num_pid_m = tl.cdiv(M, BLOCK_M)
num_pid_n = tl.cdiv(N, BLOCK_N)
num_pid_in_group = GROUP_M * num_pid_n'''


GROUP_ORDER_SRC = '''
# grouped order: GROUP_M row-tiles sweep the column tiles together (L2 reuse of a and b)
group_id = tile // num_pid_in_group
first_pid_m = group_id * GROUP_M
group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
pid_m = first_pid_m + (tile % num_pid_in_group) % group_size_m
pid_n = (tile % num_pid_in_group) // group_size_m'''


def tile_coords() -> str:
    return GROUP_ORDER_SRC + '''
rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                       # [BLOCK_M] output rows
rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                       # [BLOCK_N] output columns
rk = tl.arange(0, BLOCK_K)
# rows/columns past the edge re-read valid ones (never stored): the loads need no M/N mask
ram = (rm % M).to(tl.int64)
rbn = (rn % N).to(tl.int64)'''


def plain_tile_head() -> str:
    """Source opening a one-tile-a-program kernel over a [M, N] output with no batch or K split
    (fused epilogues: the gated MLP's up projection, the LM head's loss): the grouped tile
    order and the tile's row, column and K indices (tile_coords), the K loop's length k_len."""
    return '''
k_len = K
num_pid_m = tl.cdiv(M, BLOCK_M)
num_pid_n = tl.cdiv(N, BLOCK_N)
num_pid_in_group = GROUP_M * num_pid_n
tile = tl.program_id(0)''' + tile_coords()


def tma_kmajor_k_loop(operands) -> str:
    """Source of a TMA kernel's K loop for tile (off_m, off_n): a's tile from a_desc shared by
    ``operands`` = [(acc, desc, name), ...], each b stored K-major ([N, K], nn.Linear's weight)
    and transposed in registers, accumulated into acc in fp32."""
    lines = ["a = a_desc.load([off_m, k * BLOCK_K])"]
    lines += [f"{name} = tl.trans({desc}.load([off_n, k * BLOCK_K]))       # [BLOCK_K, BLOCK_N]"
              for _, desc, name in operands]
    lines += ["if DOT_FP32:                       # interpreter: its tl.dot cannot multiply bf16",
              "    a = a.to(tl.float32)"]
    lines += [f"    {name} = {name}.to(tl.float32)" for _, _, name in operands]
    lines += ["if IEEE:                           # fp32 operands: full fp32, no TF32"]
    lines += [f"    {acc} = tl.dot(a, {name}, {acc}, input_precision=\"ieee\")" for acc, _, name in operands]
    lines += ["else:"]
    lines += [f"    {acc} = tl.dot(a, {name}, {acc})" for acc, _, name in operands]
    return "for k in range(0, tl.cdiv(K, BLOCK_K)):\n" + C.indent("\n".join(lines), 4)


def k_loop(operands) -> str:
    """Source of the pipelined K loop: ``operands`` = [(acc, b_ptrs, b_name[, stride_k]), ...],
    each accumulating a_tile @ b_tile into acc in fp32; all share the tile of a (a_ptrs)."""
    ops = [tuple(o) + ("stride_bk",) * (4 - len(o)) for o in operands]
    lines = ["if EVEN_K:", "    a = tl.load(a_ptrs)"]
    lines += [f"    {name} = tl.load({ptrs})" for _, ptrs, name, _ in ops]
    lines += ["else:",
              "    k_mask = rk < k_len - k * BLOCK_K                          # the K tail",
              "    a = tl.load(a_ptrs, mask=k_mask[None, :], other=0.0)"]
    lines += [f"    {name} = tl.load({ptrs}, mask=k_mask[:, None], other=0.0)"
              for _, ptrs, name, _ in ops]
    lines += ["if DOT_FP32:                       # interpreter: its tl.dot cannot multiply bf16",
              "    a = a.to(tl.float32)"]
    lines += [f"    {name} = {name}.to(tl.float32)" for _, _, name, _ in ops]
    lines += ["if IEEE:                           # fp32 operands: full fp32, no TF32"]
    lines += [f"    {acc} = tl.dot(a, {name}, {acc}, input_precision=\"ieee\")"
              for acc, _, name, _ in ops]
    lines += ["else:"]
    lines += [f"    {acc} = tl.dot(a, {name}, {acc})" for acc, _, name, _ in ops]
    lines += ["a_ptrs += BLOCK_K * stride_ak"]
    lines += [f"{ptrs} += BLOCK_K * {stride}" for _, ptrs, _, stride in ops]
    return "for k in range(0, tl.cdiv(k_len, BLOCK_K)):\n" + C.indent("\n".join(lines), 4)


GEMM_ARGS = ("a_ptr, b_ptr, c_ptr, M, N, K, K_SPLIT,\n"
             "        stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,\n"
             "        stride_cs, stride_cb, stride_cm, num_tiles,\n"
             "        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,\n"
             "        GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,\n"
             "        IEEE: tl.constexpr, DOT_FP32: tl.constexpr")


def gemm_kernel(persistent: bool) -> str:
    """Source of ``_mm``: one output tile [BLOCK_M, BLOCK_N] of one (batch, K slice) per tile."""
    doc = '''
"""c[batch] = a[batch] @ b[batch] over the K slice of program_id(1): tile [BLOCK_M, BLOCK_N],
fp32 accumulator, K steps of BLOCK_K. SPLIT_K == 1 stores the tile in c's dtype; otherwise an
fp32 partial into slice ``split`` of the workspace c [SPLIT_K, Bt, M, N]."""'''
    body = tile_coords() + '''
a_ptrs = a_base + ram[:, None] * stride_am + (k_lo + rk)[None, :] * stride_ak   # [BLOCK_M, BLOCK_K]
b_ptrs = b_base + (k_lo + rk)[:, None] * stride_bk + rbn[None, :] * stride_bn   # [BLOCK_K, BLOCK_N]
acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
''' + k_loop([("acc", "b_ptrs", "b")]) + '''
c_ptrs = c_base + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]   # c is contiguous along N
c_mask = (rm < M)[:, None] & (rn < N)[None, :]
if SPLIT_K == 1:
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
else:
    tl.store(c_ptrs, acc, mask=c_mask)                             # fp32 partial'''
    return C.tiled_kernel("_mm", GEMM_ARGS, doc, tile_prologue(), body, persistent)


FILL_SRC = '''

MAX_FILL_STAGES = 5


def _fill_tiles(bm, bn, bk, stages, M, N, batch, sms, itemsize, budget):
    """(bm, bn, stages): the output tile halved, columns first, then rows, not below 64, while
    twice the tiles of [batch, M, N] still fit the GPU's ``sms`` in one wave: a narrow output
    then finishes in half the time (2048 x 1024 at 128 x 256 is 64 tiles for 132 SMs; at
    128 x 128, 128). Between half and one wave, halving would only trade one wave for two of
    half the work. A halved tile's K loop gets the pipeline stages the shared memory it frees
    holds (up to MAX_FILL_STAGES): one tile an SM, the K loop is all there is to hide its loads
    behind (H100, 2048 x 4096 x 1024 at 128 x 128: 3 stages 44.2 us, 4 35.4, 5 31.5; cuBLAS
    29.9). Smaller tiles need no more registers than the ones _fit_gemm passed."""
    halved = False
    while 2 * batch * _cdiv(M, bm) * _cdiv(N, bn) <= sms:
        if bn > 64 and bn >= bm:
            bn //= 2
        elif bm > 64:
            bm //= 2
        else:
            break
        halved = True
    if halved:
        fits = budget // ((bm + bn) * bk * itemsize)
        stages = max(stages, min(MAX_FILL_STAGES, fits))
    return bm, bn, stages
'''


SPLITK_SUM_SRC = '''@triton.jit
def _mm_splitk_sum(ws_ptr, c_ptr, total, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """c[i] = sum over s of ws[s, i] for the flat workspace [SPLIT_K, total], slices added in
    order 0, 1, ... (deterministic), rounded once to c's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    ptrs = ws_ptr + offs
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ptrs, mask=mask, other=0.0)
        ptrs += total                                              # next slice
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)
'''


# the fill axis' line in both launchers, right after _fit_gemm (FILL_SRC)
_FILL_CALL = ("\n    bm, bn, stages = _fill_tiles(bm, bn, bk, stages, M, N, batch, _num_sms(a.device),"
              "\n                                 a.element_size(), _smem_budget(a.device))")


def launcher_src(persistent: bool, fill: bool = False) -> str:
    """Source of ``_matmul(a, b, cfg)``: a [Ba, M, K] @ b [Bb, K, N] (Ba, Bb equal or 1) into a
    new contiguous [Bt, M, N], with cfg = (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K,
    NUM_WARPS, NUM_STAGES, PROGS_PER_SM); ``fill``: the tile halved for a narrow output."""
    fill_call = _FILL_CALL if fill else ""
    if persistent:
        grid = ("progs = min(num_tiles, max(1, _num_sms(a.device) * pps // (batch * splits)))\n"
                "    grid = (progs, batch * splits)          # persistent programs per (batch, slice)")
    else:
        grid = "grid = (num_tiles, batch * splits)         # one program per (tile, batch, slice)"
    return f'''

def _matmul(a, b, cfg):
    """a [Ba, M, K] @ b [Bb, K, N] (Ba and Bb equal, or 1: broadcast) -> new contiguous
    [max(Ba, Bb), M, N] in a's dtype. Any strides."""
    bm, bn, bk, group_m, split_k, warps, stages, pps = cfg
    batch, M, K = max(a.shape[0], b.shape[0]), a.shape[1], a.shape[2]
    N = b.shape[2]
    c = torch.empty((batch, M, N), dtype=a.dtype, device=a.device)
    if batch == 0 or M == 0 or N == 0:
        return c
    # the interpreter's tl.dot cannot multiply bf16 tiles (numpy has none): upcast them there
    dot_fp32 = a.dtype == torch.bfloat16 and a.device.type == "cpu"
    ieee = a.dtype == torch.float32 or dot_fp32
    bm, bn, bk, stages = _fit_gemm(bm, bn, bk, stages, warps, M, N, K, a.element_size(),
                                   _smem_budget(a.device)){fill_call}
    # K slices of whole BLOCK_K steps, none empty
    splits = max(1, min(split_k, _cdiv(K, bk)))
    k_split = max(1, _cdiv(_cdiv(K, splits), bk)) * bk
    splits = max(1, _cdiv(K, k_split))
    even_k = K % bk == 0
    sab = a.stride(0) if a.shape[0] > 1 else 0   # a batch of one is shared by every batch
    sbb = b.stride(0) if b.shape[0] > 1 else 0
    if splits > 1:
        out = torch.empty((splits, batch, M, N), dtype=torch.float32, device=a.device)
        scs = batch * M * N
    else:
        out, scs = c, 0
    num_tiles = _cdiv(M, bm) * _cdiv(N, bn)
    {grid}
    _mm[grid](a, b, out, M, N, K, k_split, sab, a.stride(1), a.stride(2), sbb, b.stride(1),
              b.stride(2), scs, M * N, N, num_tiles, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
              GROUP_M=group_m, SPLIT_K=splits, EVEN_K=even_k, IEEE=ieee, DOT_FP32=dot_fp32,
              num_warps=warps, num_stages=stages)
    if splits > 1:
        total = batch * M * N
        _mm_splitk_sum[(_cdiv(total, SUM_BLOCK),)](out, c, total, SPLIT_K=splits,
                                                          BLOCK=SUM_BLOCK, num_warps=4)
    return c
'''


# The TMA kernel's tile: its K loop and its store, shared by the one-tile-a-program grid and the
# persistent one. "Subtiled" stores the [BLOCK_M, BLOCK_N] result as two [BLOCK_M, BLOCK_N / 2]
# halves: half the shared memory for the epilogue's staging buffer, which leaves a 128 x 256
# tile its fourth pipeline stage.
_TMA_TILE = """off_m = pid_m * BLOCK_M
off_n = pid_n * BLOCK_N
acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
for k in K_RANGE:
    off_k = k * BLOCK_K
    if BATCHED:
        a = a_desc.load([batch, off_m, off_k]).reshape(BLOCK_M, BLOCK_K)
        if B_KMAJOR:
            b = tl.trans(b_desc.load([batch, off_n, off_k]).reshape(BLOCK_N, BLOCK_K))
        else:
            b = b_desc.load([batch, off_k, off_n]).reshape(BLOCK_K, BLOCK_N)
    else:
        a = a_desc.load([off_m, off_k])
        if B_KMAJOR:
            b = tl.trans(b_desc.load([off_n, off_k]))
        else:
            b = b_desc.load([off_k, off_n])
    if DOT_FP32:                       # interpreter: its tl.dot cannot multiply bf16
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if IEEE:                           # fp32 operands: full fp32, no TF32
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
if C_PTRS:                             # c's rows not 16-byte aligned: a masked store
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    c_ptrs = (c_desc + batch.to(tl.int64) * M * N + rm.to(tl.int64)[:, None] * N
              + rn[None, :])
    tl.store(c_ptrs, acc.to(c_desc.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])
elif SUBTILE:                          # two [BLOCK_M, BLOCK_N / 2] halves
    halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
    lo, hi = tl.split(halves)
    lo = lo.to(c_desc.dtype)
    hi = hi.to(c_desc.dtype)
    if BATCHED:
        c_desc.store([batch, off_m, off_n], lo.reshape(1, BLOCK_M, BLOCK_N // 2))
        c_desc.store([batch, off_m, off_n + BLOCK_N // 2], hi.reshape(1, BLOCK_M, BLOCK_N // 2))
    else:
        c_desc.store([off_m, off_n], lo)
        c_desc.store([off_m, off_n + BLOCK_N // 2], hi)
else:
    out = acc.to(c_desc.dtype)
    if BATCHED:
        c_desc.store([batch, off_m, off_n], out.reshape(1, BLOCK_M, BLOCK_N))
    else:
        c_desc.store([off_m, off_n], out)"""

_TMA_ARGS = """a_desc, b_desc, c_desc, M, N, K, BATCH_N, NUM_PROGS,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            GROUP_M: tl.constexpr, BATCHED: tl.constexpr, B_KMAJOR: tl.constexpr,
            IEEE: tl.constexpr, DOT_FP32: tl.constexpr, SUBTILE: tl.constexpr,
            C_PTRS: tl.constexpr"""
_K_RANGE = "range(0, tl.cdiv(K, BLOCK_K))"
_K_RANGE_WS = "tl.range(0, tl.cdiv(K, BLOCK_K), warp_specialize=True)"


def tma_src(persistent: bool, ws: bool) -> str:
    """Source of ``_mm_tma``, every operand tile moved by TMA. One output tile a program, or
    (``persistent``) NUM_PROGS programs walking the tiles of every batch pid, pid + NUM_PROGS,
    ... in one flattened loop (Triton's pipeliner may start the next tile's loads during this
    tile's epilogue). ``ws``: warp specialization (producer warps issue the loads, consumer
    warps the MMAs) on the K loop, or on the tile loop of the persistent grid."""
    doc = '''"""c[batch] = a[batch] @ b[batch] by output tiles [BLOCK_M, BLOCK_N], every operand tile
moved by TMA: descriptors over a [(Bt,) M, K], b [(Bt,) K, N] or, B_KMAJOR, its K-major
storage [(Bt,) N, K], and c [(Bt,) M, N]. Loads past the edges read zeros, the store is
clipped: no masks. fp32 accumulator, stored once in c's dtype. C_PTRS: c is a pointer to a
contiguous [(Bt,) M, N] whose rows a descriptor cannot address (N * itemsize not a multiple of
16: an odd vocabulary's LM head), stored through masked pointers; the loads stay on TMA."""'''
    head = ["num_pid_m = tl.cdiv(M, BLOCK_M)", "num_pid_n = tl.cdiv(N, BLOCK_N)",
            "num_pid_in_group = GROUP_M * num_pid_n"]
    k_range = _K_RANGE_WS if ws and not persistent else _K_RANGE
    tile = GROUP_ORDER_SRC.strip("\n") + "\n" + _TMA_TILE.replace("K_RANGE", k_range)
    if persistent:
        loop = ("tl.range(tl.program_id(0), num_tiles, NUM_PROGS, flatten=True"
                + (", warp_specialize=True)" if ws else ")"))
        body = "\n".join(head + ["tiles_per_batch = num_pid_m * num_pid_n",
                                  "num_tiles = tiles_per_batch * BATCH_N",
                                  f"for t in {loop}:",
                                  "    batch = t // tiles_per_batch",
                                  "    tile = t % tiles_per_batch",
                                  C.indent(tile, 4)])
    else:
        body = "\n".join(["tile = tl.program_id(0)", "batch = tl.program_id(1)"] + head + [tile])
    return ("\n\n@triton.jit\ndef _mm_tma(" + _TMA_ARGS + "):\n" + C.indent(doc, 4) + "\n"
            + C.indent(body, 4) + "\n")


def tma_host_src(fill: bool = False) -> str:
    """Source of the TMA kernel's host side (_tma_plan, _matmul_tma); ``fill`` as in
    launcher_src."""
    return _TMA_HOST_HEAD + (_FILL_CALL if fill else "") + _TMA_HOST_TAIL


# split after the plan's _fit_gemm call, where the fill line goes
_TMA_HOST_HEAD = '''

_TMA_PLANS = {}


def _tma_plan(a, b, cfg):
    """How _mm_tma computes a [(Bt,) M, K] @ b [(Bt,) K, N] (both 2-D, or both 3-D with one
    batch size): (out shape, (shape, strides, block) of the a, b and c descriptors, grid,
    meta-parameters), or None where the device or the layout rules descriptors out. Worked
    out once per (shapes, strides, dtype, device), so that a call's host time is the
    descriptors and the launch: no tensor views, no device queries (each costs microseconds,
    and a GEMM of a few hundred microseconds is launched from Python)."""
    bm, bn, bk, group_m, split_k, warps, stages, pps = cfg
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = a.shape[0] if a.dim() == 3 else 1
    item = a.element_size()
    b_kmajor = b.stride(-2) == 1 and b.stride(-1) != 1         # storage [N, K]: a weight^T
    sa = [a.stride(-2), a.stride(-1)]
    sb = [b.stride(-1), b.stride(-2)] if b_kmajor else [b.stride(-2), b.stride(-1)]
    lead = [sa[0], sb[0]] + ([a.stride(0), b.stride(0)] if batch > 1 else [])
    # c's rows unaligned (N * itemsize not a multiple of 16: GPT-2's 50,257-token LM head):
    # stored through pointers, the operands still loaded by TMA where b is K-major
    # (not yet on the warp-specialized kernel: a pointer epilogue in its partitioned tile loop
    # is untried on a GPU, and such a GEMM took the pointer kernel before)
    c_ptrs = (N * item) % 16 != 0
    if (M == 0 or N == 0 or K == 0 or (a.dim() == 3 and b.shape[0] != batch)
            or not _has_tma(a.device) or (c_ptrs and (TMA_WS or not b_kmajor))
            or sa[1] != 1 or sb[1] != 1
            or any((s * item) % 16 for s in lead)):
        return None
    bm, bn, bk, stages = _fit_gemm(bm, bn, bk, stages, warps, M, N, K, item,
                                   _smem_budget(a.device))'''
_TMA_HOST_TAIL = '''
    b_shape, b_block = ([N, K], [bn, bk]) if b_kmajor else ([K, N], [bk, bn])
    cn = bn // 2 if SUBTILE else bn            # the store's block: half a tile when subtiled
    descs = (([M, K], sa, [bm, bk]), (b_shape, sb, b_block),
             None if c_ptrs else ([M, N], [N, 1], [bm, cn]))
    if batch > 1:                      # a leading batch dimension, one matrix per block
        descs = (([batch, M, K], [a.stride(0)] + sa, [1, bm, bk]),
                 ([batch] + b_shape, [b.stride(0)] + sb, [1] + b_block),
                 None if c_ptrs else ([batch, M, N], [M * N, N, 1], [1, bm, cn]))
    dot_fp32 = a.dtype == torch.bfloat16 and a.device.type == "cpu"
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, BATCHED=batch > 1,
                B_KMAJOR=b_kmajor, IEEE=a.dtype == torch.float32 or dot_fp32,
                DOT_FP32=dot_fp32, SUBTILE=SUBTILE, C_PTRS=c_ptrs, num_warps=warps,
                num_stages=stages)
    tiles = _cdiv(M, bm) * _cdiv(N, bn)
    if TMA_PERSISTENT:                 # pps programs an SM walk every batch's tiles
        grid = (min(tiles * batch, _num_sms(a.device) * pps),)
    else:
        grid = (tiles, batch)
    return list(a.shape[:-1]) + [N], descs, grid, (M, N, K, batch, grid[0]), meta


def _matmul_tma(a, b, cfg):
    """a @ b through _mm_tma into a new contiguous [(Bt,) M, N] in a's dtype, or None when the
    device or the operands rule descriptors out (the pointer path runs instead)."""
    key = (a.shape, a.stride(), b.shape, b.stride(), a.dtype, a.device)
    plan = _TMA_PLANS.get(key, False)
    if plan is False:
        if len(_TMA_PLANS) > 1024:     # a bound on a long-lived process's cache
            _TMA_PLANS.clear()
        plan = _TMA_PLANS[key] = _tma_plan(a, b, cfg)
    if plan is None or a.data_ptr() % 16 or b.data_ptr() % 16:
        return None
    out_shape, (da, db, dc), grid, args, meta = plan
    c = torch.empty(out_shape, dtype=a.dtype, device=a.device)
    # each descriptor's base is the operand itself: only its address and dtype are read
    _mm_tma[grid](TensorDescriptor(a, *da), TensorDescriptor(b, *db),
                  TensorDescriptor(c, *dc) if dc else c, *args, **meta)
    return c
'''



# fp32_dot "tf32x3_split": each fp32 operand x is split once, before the GEMM, into
# hi = x rounded to TF32 (11 significant bits) and lo = x - hi (exact in fp32), written as one
# operand with K tripled: a' = [a_hi | a_hi | a_lo] along K, b' = [b_hi ; b_lo ; b_hi], so
# a' @ b' = a_hi b_hi + a_hi b_lo + a_lo b_hi and the GEMM's dots run plain TF32 on operands
# straight from memory ("tf32x3" splits every tile again in the K loop, in registers). Extra
# traffic: 3 x (M*K + K*N) * 4 bytes written and read back by the GEMM. An Inf or NaN keeps
# itself as hi and 0 as lo; as with "tf32x3", an Inf meets the other side's lo (0 for a value
# TF32 holds exactly) and gives NaN where eager gives Inf (the family's inputs are finite). A
# finite x that would round past FLT_MAX keeps its truncated hi.
TF32_SPLIT_SRC = '''
SPLIT_BLOCK = 1024     # elements per program of the TF32 split


@triton.jit
def _tf32_split(x_ptr, o_ptr, total, D1, D2, D3, s0, s1, s2, s3, o0, o1, o2, o3, seg,
                LO_SEG: tl.constexpr, BLOCK: tl.constexpr):
    # x [D0, D1, D2, D3] (any strides) -> three copies in o, ``seg`` elements apart along K:
    # copy LO_SEG lo = x - hi, the others hi = x rounded to TF32
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < total
    i3 = idx % D3
    t = idx // D3
    i2 = t % D2
    t = t // D2
    i1 = t % D1
    i0 = t // D1
    x = tl.load(x_ptr + i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3, mask=mask, other=0.0)
    bits = x.to(tl.uint32, bitcast=True)
    hi = ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)    # rounded to TF32
    cut = (bits & 0xFFFFE000).to(tl.float32, bitcast=True)               # truncated
    finite = (x == x) & (tl.abs(x) < float("inf"))
    hi = tl.where(tl.abs(hi) < float("inf"), hi, cut)
    hi = tl.where(finite, hi, x)
    lo = tl.where(finite, x - hi, 0.0)
    o = i0 * o0 + i1 * o1 + i2 * o2 + i3 * o3
    for s in tl.static_range(3):
        if s == LO_SEG:
            tl.store(o_ptr + o + s * seg, lo, mask=mask)
        else:
            tl.store(o_ptr + o + s * seg, hi, mask=mask)


def _split3(x, k_dim, lo_seg):
    # x fp32 with K along dim k_dim -> the same shape but K tripled (a: hi, hi, lo; b: hi, lo,
    # hi), laid out in x's own stride order (a weight^T stays K-major), read and written in
    # that order
    if x.dim() > 4:                                # lead dims merged (K is one of the last 3)
        y = _split3(x.reshape((-1,) + tuple(x.shape[-3:])), k_dim, lo_seg)
        return y.reshape(tuple(x.shape[:-3]) + tuple(y.shape[1:]))
    nd, kd = x.dim(), k_dim % x.dim()
    perm = sorted(range(nd), key=lambda d: (-x.stride(d) if x.shape[d] > 1 else 0, d))
    o = torch.empty([x.shape[d] * (3 if d == kd else 1) for d in perm], dtype=x.dtype,
                    device=x.device)
    pad = 4 - nd
    dims = [1] * pad + [x.shape[d] for d in perm]
    xs = [0] * pad + [x.stride(d) for d in perm]
    os_ = [0] * pad + list(o.stride())
    total = x.numel()
    if total:
        _tf32_split[(_cdiv(total, SPLIT_BLOCK),)](
            x, o, total, dims[1], dims[2], dims[3], *xs, *os_,
            x.shape[kd] * o.stride(perm.index(kd)), LO_SEG=lo_seg, BLOCK=SPLIT_BLOCK,
            num_warps=4)
    return o.permute([perm.index(d) for d in range(nd)])
'''


# "k_major": a copy of each fp32 operand whose K is not its contiguous dim first (a row-major b
# [K, N], a transposed a): fp32 tiles reach the tensor cores without the transpose through
# shared memory that 32-bit tiles need (ldmatrix transposes only 16-bit ones); the copy is (M*K
# or K*N)*4 bytes read and written, timed with the kernel. The matmul family and GEMM regions
# (b_k: b's K dim, -2, or 1 for a weight [N, K]) share it.
K_MAJOR_SRC = '''

def _k_major(a, b, b_k):
    # fp32 operands with K contiguous (copies where they are not); others as they are
    if a.dtype == torch.float32:
        if a.stride(-1) != 1 and a.shape[-1] > 1:
            a = a.contiguous()
        if b.stride(b_k) != 1 and b.shape[b_k] > 1:
            b = b.transpose(b_k, -1).contiguous().transpose(b_k, -1)
    return a, b
'''


def _kernel_fn(tma: bool = False, split: bool = False, k_major: bool = False) -> str:
    copy_call = """
    a, b = _k_major(a, b, -2)                      # K-contiguous fp32 operands""" if k_major else ""
    split_call = """
    if a.dtype == torch.float32:       # [a_hi | a_hi | a_lo] @ [b_hi ; b_lo ; b_hi], TF32 dots
        a, b = _split3(a, -1, 2), _split3(b, -2, 1)""" if split else ""
    tma_call = """
    if a.dim() == b.dim():                          # descriptors where the layout allows
        c = _matmul_tma(a, b, CONFIG)
        if c is not None:
            return c""" if tma else ""
    return '''

def kernel_fn(a, b):
    """a [M, K] @ b [K, N] -> [M, N], or batched a [Bt, M, K] @ b [Bt, K, N] -> [Bt, M, N]
    (either operand may be 2-D and is then shared by every batch); fp32 accumulation, result in
    a's dtype. Any strides."""
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise ValueError(f"matmul takes 2-D or 3-D operands, got {a.dim()}-D and {b.dim()}-D")
    if a.dtype != b.dtype:
        raise ValueError(f"operands of different dtypes: {a.dtype}, {b.dtype}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"inner dimensions differ: {list(a.shape)} @ {list(b.shape)}")TMA_CALL
    a3 = a if a.dim() == 3 else a.unsqueeze(0)          # views: [Ba, M, K], [Bb, K, N]
    b3 = b if b.dim() == 3 else b.unsqueeze(0)
    if a3.shape[0] != b3.shape[0] and min(a3.shape[0], b3.shape[0]) != 1:
        raise ValueError(f"batch sizes differ: {list(a.shape)} @ {list(b.shape)}")
    c = _matmul(a3, b3, CONFIG)
    return c if a.dim() == 3 or b.dim() == 3 else c[0]
'''.replace("TMA_CALL", copy_call + split_call + tma_call)


def render(params) -> str:
    """Complete candidate source for one point of SPACE (missing params take DEFAULT values)."""
    p = C.resolve(NAME, SPACE, DEFAULT, params)
    persistent = p["grid"] == "persistent"
    tma = p["loads"] in ("tma", "tma_ws") and p["split_k"] == 1
    if p["split_k"] > 1:
        traffic = (f"with SPLIT_K = {p['split_k']} it also writes and re-reads an fp32 workspace of "
                   f"SPLIT_K*M*N*4 bytes per batch")
    else:
        traffic = "it writes c once"
    fill_line = ("FILL = True             # launchers halve the tile for a narrow output (_fill_tiles)\n"
                 if p["fill"] else "")
    if tma:
        traffic += "; operand tiles move by TMA (tensor descriptors) where the GPU has it"
        if p["subtile"]:
            traffic += ", and c leaves in two halves of a tile"
    doc = f'''"""Matmul candidate ({p["block_m"]}x{p["block_n"]}x{p["block_k"]} tiles, {p["grid"]} grid, split_k={p["split_k"]}{", TMA loads" if tma else ""}{" (warp-specialized)" if tma and p["loads"] == "tma_ws" else ""}): c = a @ b.

a [M, K] or [Bt, M, K], b [K, N] or [Bt, K, N], any strides; c contiguous in a's dtype. fp32
accumulation; {FP32_DOT_DOC[p["fp32_dot"]]}
Bytes the op must move: (M*K + K*N + M*N)*itemsize per batch; flops 2*M*N*K per batch.
Each tile re-reads its rows of a and columns of b from L2/HBM; {traffic}.
Point: {C.point_line(SPACE, p)}
"""
{C.IMPORTS_SRC}
BLOCK_M = {p["block_m"]}         # output tile rows (clamped at launch)
BLOCK_N = {p["block_n"]}         # output tile columns
BLOCK_K = {p["block_k"]}          # K step
GROUP_M = {p["group_m"]}           # row-tiles per group of the swizzled tile order
SPLIT_K = {p["split_k"]}           # K slices (fp32 partials summed in a fixed order)
NUM_WARPS = {p["num_warps"]}
NUM_STAGES = {p["num_stages"]}        # software-pipelining depth of the K loop
PROGS_PER_SM = {p["progs_per_sm"]}      # persistent grid only
TMA_PERSISTENT = {persistent}   # the TMA kernel's programs walk the tiles (persistent grid)
TMA_WS = {tma and p["loads"] == "tma_ws"}          # the TMA kernel is warp-specialized
SUBTILE = {p["subtile"]}          # the TMA kernel stores a tile as two [BLOCK_M, BLOCK_N / 2] halves
{fill_line}SUM_BLOCK = 1024       # elements per program of the split-K sum
CONFIG = (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, NUM_WARPS, NUM_STAGES, PROGS_PER_SM)
'''
    parts = [doc, GEMM_HELPERS_SRC]
    if persistent or tma or p["fill"]:   # the TMA plan and the fill name _num_sms on any grid
        parts.append(C.NUM_SMS_SRC)
    if p["fill"]:
        parts.append(FILL_SRC)
    parts += ["\n", gemm_kernel(persistent), "\n", SPLITK_SUM_SRC,
              launcher_src(persistent, p["fill"])]
    if tma:
        parts += ["\n\n", C.TMA_HELPERS_SRC, tma_src(persistent, p["loads"] == "tma_ws"),
                  tma_host_src(p["fill"])]
    split = p["fp32_dot"] == "tf32x3_split"
    if split:
        parts.append(TF32_SPLIT_SRC)
    if p["k_major"]:
        parts.append(K_MAJOR_SRC)
    parts.append(_kernel_fn(tma, split, p["k_major"]))
    src = C.tidy("\n".join(parts))
    # the templates' fp32 dots say "ieee"; bf16/fp16 tiles never take that branch
    dot = "tf32" if split else p["fp32_dot"]
    return src.replace('input_precision="ieee"', f'input_precision="{dot}"')


# fp32 operands on tensor cores: "tf32x3" splits each operand into a TF32 high part and a TF32
# remainder and sums three TF32 products (hi*hi + hi*lo + lo*hi): 22 significant bits a
# product against fp32's 24, within the fp32 error bound above (fp32 accumulation dominates
# it). Three TF32 products run at a third of the TF32 rate, on Hopper still about twice the
# fp32 FMA rate (datasheet: ~495 dense TF32 against ~67 fp32 TFLOP/s). The verifier decides on
# the GPU (the interpreter ignores input_precision and multiplies in numpy fp32).
FP32_DOT_DOC = {
    "ieee": "fp32 operands multiply in full fp32 (input_precision=\"ieee\", no TF32).",
    "tf32": "fp32 operands multiply on tensor cores in TF32 (input_precision=\"tf32\", 10-bit "
            "mantissas: what cuDNN does for an fp32 convolution by default); fp32 accumulation.",
    "tf32x3": "fp32 operands multiply on tensor cores as three TF32 products (input_precision=\"tf32x3\": "
              "hi*hi + hi*lo + lo*hi, 22 significant bits a product; fp32 accumulation).",
    "tf32x3_split": "fp32 operands split once into TF32 hi and lo parts before the GEMM "
                    "([a_hi | a_hi | a_lo] @ [b_hi ; b_lo ; b_hi], K tripled): three TF32 products "
                    "a K step as plain TF32 dots on operands read from memory; fp32 accumulation.",
}


# The first moves after the starter, by the target's shape. Measured on the H200 (fp32,
# Triton 3.6, triton.testing.do_bench medians): at 4096^3 cuBLAS's fp32 takes 2,677 us; "tf32x3"
# at the default tile (128 x 128 x 32, 4 warps, 3 stages) 3,800 us and at 128 x 64 x 64, 8 warps,
# 4 stages 2,602 us, the best of 56 tiles; at 256 x 524288 x 256 every unsplit tile took
# 55-123 ms against cuBLAS's 1.3 ms: 4 to 8 output tiles keep 4 to 8 of 132 SMs busy.
SMS = 132               # an H100/H200's SMs: the order of any data-center GPU's


def _split_point(shape) -> dict:
    """Split K where the output has fewer 64 x 64 tiles than the GPU has SMs and K is long
    (each slice keeps at least 8 K steps): the tile and slice count, or {} where not."""
    bt, m, k, n = problem(shape)
    tiles = bt * math.ceil(m / 64) * math.ceil(n / 64)
    if tiles >= SMS or k < 64 * 8 * 2:
        return {}
    split = 1
    while split < 16 and tiles * split < SMS and k // (split * 2) >= 64 * 8:
        split *= 2
    return {"split_k": split, "block_m": 64, "block_n": 64, "block_k": 64,
            "num_warps": 4, "num_stages": 3, "loads": "pointers"}


# bf16/fp16 targets whose K is not split open with the fastest points measured: first the
# persistent TMA kernel, warp-specialized, 128 x 256 x 64 tiles, 3 stages, 8 warps, 16-row
# groups, its tile stored in two halves. On an H100 (Triton 3.6, triton.testing.do_bench
# medians, L2 flushed; docs/sweeps/points.py, docs/benchmarks.md) it ran 4096 x 4096 x 4096 in 190.6 us
# (0.94x cuBLAS), 4096 x 11008 x 4096 (M x K x N) in 521.2 (0.99x), 4096 x 4096 x 11008 in
# 531.9 (1.04x) and 8192 x 4096 x 14336 in 1,407.7 (1.01x), where one tile a program through
# TMA ran 0.76-0.88x. Then the H200 probe's points (docs/benchmarks.md, "The Hopper points,
# probed"): TMA loads with 64-deep K steps at 128x128 tiles, 3 stages, 4 warps (4096^3: 193
# us, 0.91x cuBLAS), then 128x256x64 tiles, 4 stages, 8 warps (4096x11008x4096: 543 us,
# 0.83x). Without openers a LLaMA-1B run (8192 x 2048 x {256, 2048, 32000}) spent its first
# matmul experiments on split-K and fp32 points that cannot apply and reached TMA at its 6th.
# With ``fill``: a no-op at those shapes (hundreds of tiles), the tile halved where a narrow
# output fills under half the SMs (the 1024-wide K/V projections of 2048 tokens, 64 tiles:
# 0.61x cuBLAS at 128 x 256 on the H100); that case is not yet measured with it.
HALF_PERSISTENT = {"block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3,
                   "group_m": 16, "loads": "tma_ws", "grid": "persistent", "subtile": True,
                   "fill": True}
HALF_OPENERS = (HALF_PERSISTENT, {"block_k": 64, "loads": "tma"},
                {"block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 4, "loads": "tma"})
# Decode-sized rows (M <= DECODE_M) in bf16/fp16 open with 16-row tiles through TMA, unsplit,
# before the split point: on the H100, 16 x 4096 x 4096 ran 22.2 us (1.06x cuBLAS's 23.5) and
# 16 x 4096 x 14336 55.1 us (1.00x); K split in 4 through pointers ran 0.79x and 0.92x.
DECODE_M = 64
HALF_DECODE = {"block_m": 16, "block_n": 32, "block_k": 128, "num_stages": 5, "loads": "tma"}


def default_for(shape, dtype: str) -> dict:
    """The starter for a target of this shape: its first opener (below). K split where the
    output has too few tiles for the GPU: unsplit, KernelBench's matrix-vector product (2048 x
    1 output, K = 1M) ran on 16 of 132 SMs and its starter did not finish the verifier in a
    66 s budget. fp32 on tensor cores (tf32x3, accurate to fp32's ~1e-6): the IEEE dot ran
    8205 x 2949 x 5921 at 14% of the speed of light (15.2 ms, cuBLAS 6.5 ms) and, one
    experiment a KernelBench budget at that size, was all the run tried. The exact fp32 dot
    stays in the space."""
    first = openers_for(shape, dtype)
    if not first or (dtype != "float32" and not _split_point(shape)):
        return {}      # a bf16/fp16 target starts at DEFAULT; its openers are the Hopper tiles
    return dict(first[0])


def openers_for(shape, dtype: str) -> tuple:
    """The first moves for a target of this shape. Split K where the output has fewer 64 x 64
    tiles than the GPU has SMs and K is long (each slice keeps at least 8 K steps). For fp32, in
    the same move (an experiment costs 10-40 s on the GPU and a KernelBench problem's budget
    holds three or four): tf32x3 at the tile measured best for it where K is not split, with
    K-contiguous operand copies (that tile ran 2048 x 8192 x 4096 in 1,866 us with b K-major,
    2,684-2,875 us with b row-major); then tf32x3 alone, where that move was not kept; then
    128 x 128 tiles through TMA (FP32_WIDE, below); then TMA loads alone (2,602 us at 4096^3
    with b row-major against 2,703 us through pointers). Not
    "tf32x3_split": on the H200 (Triton 3.6) its plain TF32 dots ran 3.8-5.7 ms at 4096^3
    (cuBLAS fp32 2.7 ms) and, on KernelBench's positive inputs at 2048 x 8192 x 4096, erred by
    1.5e-4 of the output (fp32: ~1e-6) while passing the verifier's smaller shapes: the
    end-to-end check kept it out. It stays a point of the space; the judge decides."""
    first = _split_point(shape)
    if dtype != "float32":
        if problem(shape)[1] <= DECODE_M:
            return (HALF_DECODE,) + ((first,) if first else ())
        return (first,) if first else HALF_OPENERS
    wide = ()
    if not first:
        first = {"block_m": 128, "block_n": 64, "block_k": 64, "num_warps": 8,
                 "num_stages": 4, "loads": "pointers"}
        wide = (FP32_WIDE,)
    return ({**first, "fp32_dot": "tf32x3", "k_major": True}, {"fp32_dot": "tf32x3"},
            *wide, {"loads": "tma"})


# On the H200 (KernelBench level 1 at the shipped 4096-8192-wide fp32 shapes, 2.5-minute
# budgets) the search reached 128 x 128 x 64 tiles through TMA at its 17th experiment in five of
# seven GEMM problems, and that point was each one's best or within 3% of it: 1,452-1,591 us
# against 1,657-1,822 us for 128 x 64 through TMA and cuBLAS's fp32 2,768-2,849 us (1.7-1.9x).
# Tried right after the starter, a one-minute budget reaches it.
FP32_WIDE = {"block_n": 128, "loads": "tma"}


# Operand layouts a target is verified and timed at, as the model passes them: a "mk" (row-major
# [M, K]) or "km" (a transposed one, A.T @ B), b "nk" (the transpose of a contiguous [N, K]:
# nn.Linear's W^T, q @ k^T's k^T; the plain contract) or "kn" (row-major [K, N]: torch.matmul of
# two plain matrices). The tile loads differ per layout: on the H200 a tf32x3 tile timed 1.87 ms
# with b K-major ran the model's row-major 2048 x 8192 x 4096 product in 2.88 ms.
LAYOUTS = {"a": ("mk", "km"), "b": ("nk", "kn")}


def _inputs_for(a_layout: str, b_layout: str):
    def make(shape, dtype, device, gen, kind="normal"):
        x = make_inputs(shape, dtype, device, gen, kind)     # the same values, re-laid out
        a, b = x["a"], x["b"]
        if a_layout == "km":
            a = a.transpose(-1, -2).contiguous().transpose(-1, -2)      # stride (.., 1, M)
        if b_layout == "kn":
            b = b.contiguous()                                          # stride (.., N, 1)
        return {"a": a, "b": b}
    return make


def configure(spec: dict) -> Family:
    """The GEMM with its operands in the layouts ``spec`` names ({"a": "mk" | "km", "b": "nk" |
    "kn"}; missing keys: the plain contract's "mk" and "nk")."""
    a_l, b_l = spec.get("a", "mk"), spec.get("b", "nk")
    if set(spec) - set(LAYOUTS) or a_l not in LAYOUTS["a"] or b_l not in LAYOUTS["b"]:
        raise ValueError(f"matmul takes a spec {{a: mk | km, b: nk | kn}}; got {spec!r}")
    if (a_l, b_l) == ("mk", "nk"):
        return FAMILY
    what = {"km": "a transposed ([M, K] stored [K, M])", "kn": "b row-major [K, N]",
            "mk": "", "nk": ""}
    lay = ", ".join(w for w in (what[a_l], what[b_l]) if w)
    return dataclasses.replace(
        FAMILY, make_inputs=_inputs_for(a_l, b_l),
        description=f"{FAMILY.description[:-1]}; {lay}.",
        notes=dict(FAMILY.notes, a_layout=a_l, b_layout={"nk": FAMILY.notes["b_layout"],
                                                         "kn": "row-major [K, N]"}[b_l]),
        spec=dict(spec))


def layout_spec(a: dict, b: dict | None) -> dict:
    """{a: .., b: ..} of two captured operands (shape and stride), the plain layouts left out;
    b None: the plain contract's (a linear layer's W^T)."""
    spec = {}
    ash, ast = tuple(a["shape"]), tuple(a.get("stride") or ())
    bsh, bst = (tuple(b["shape"]), tuple(b.get("stride") or ())) if b else ((), ())
    if len(ast) >= 2 and ash[-1] > 1 and ash[-2] > 1 and ast[-2] == 1 and ast[-1] != 1:
        spec["a"] = "km"
    if len(bst) >= 2 and bsh[-1] > 1 and bsh[-2] > 1 and bst[-1] == 1 and bst[-2] != 1:
        spec["b"] = "kn"
    return spec


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
    description="GEMM a [M, K] @ b [K, N] (or batched [Bt, ...]); fp32 accumulation, no TF32.",
    notes={"shape": "(M, K, N) or (Bt, M, K, N)", "b_layout": "transpose of a contiguous [N, K]",
           "bound": "compute"},
    error_bound=error_bound,
    bound_tol=BOUND_TOL,
    from_profile=from_profile,
    openers=({"fp32_dot": "tf32x3"},),
    openers_for=openers_for,
    default_for=default_for,
)


# ---------------------------------------------------------------------------------------------
# spellings: how model code writes it (kernels/patterns.py)
# ---------------------------------------------------------------------------------------------

_AB = (("a", T((4, 8))), ("b", T((8, 6))))
SPELLINGS = (
    Spelling("matmul", lambda a, b: a @ b, _AB),
    Spelling("matmul_batched", lambda a, b: a @ b, (("a", T((2, 4, 8))), ("b", T((2, 8, 6))))),
    Spelling("matmul_4d", lambda a, b: a @ b, (("a", T((2, 3, 4, 8))), ("b", T((2, 3, 8, 6))))),
    Spelling("mm", lambda a, b: torch.mm(a, b), _AB),
    Spelling("bmm", lambda a, b: torch.bmm(a, b), (("a", T((2, 4, 8))), ("b", T((2, 8, 6))))),
    # nn.Linear: x @ W^T (+ bias), at the ranks models call it with
    Spelling("linear", lambda x, w: torch.nn.functional.linear(x, w), (("x", T((4, 8))), ("w", T((6, 8)))),
             loose=("bias",)),
    Spelling("linear_3d", lambda x, w: torch.nn.functional.linear(x, w),
             (("x", T((2, 4, 8))), ("w", T((6, 8)))), loose=("bias",)),
    Spelling("addmm", lambda c, a, b: torch.addmm(c, a, b), (("c", T((6,))),) + _AB),
    Spelling("einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), _AB, loose=("equation",)),
)


def _lead(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _gemm(a, b, out):
    """How a @ b (torch.matmul semantics) of these shapes runs as the family's 2-D / 3-D GEMM:
    (shape, a views, b views, post ops), or NoFit."""
    ash, bsh = tuple(a["shape"]), tuple(b["shape"])
    post = [("reshape", list(out["shape"]))]
    if len(bsh) == 1:                                  # matrix-vector: b [K] -> [K, 1]
        b_views, bsh = [("unsqueeze", -1)], bsh + (1,)
    else:
        b_views = []
    if len(ash) == 1:
        raise NoFit("a vector times a matrix: the contract's a is a matrix")
    m_, k = ash[-2], ash[-1]
    n = bsh[-1]
    if bsh[-2] != k:
        return None
    if len(bsh) == 2:                                  # [..., M, K] @ [K, N]: fold the leading dims into M
        rows = _lead(ash[:-1])
        a_views = [("reshape", [rows, k])] if len(ash) != 2 else []
        return (rows, k, n), a_views, b_views, post
    la, lb = ash[:-2], bsh[:-2]
    bt = _lead(lb)
    if len(ash) == 2 or _lead(la) == 1:                # one a for every batch of b
        a_views = [("reshape", [m_, k])] if len(ash) != 2 else []
    elif tuple(la) == tuple(lb) or len(la) >= len(lb) and tuple(la[len(la) - len(lb):]) == tuple(lb) and _lead(la) == bt:
        a_views = [("reshape", [bt, m_, k])] if len(ash) != 3 else []
    else:
        raise NoFit(f"batch dims {list(la)} @ {list(lb)} broadcast: the contract takes equal batches")
    b_views += [("reshape", [bt, k, n])] if len(bsh) != 3 else []
    return (bt, m_, k, n), a_views, b_views, post


def _einsum_pair(eq: str):
    """For "<lead>k,kn-><lead>n" (a contraction of a's last index with a matrix): True."""
    try:
        lhs, rhs = eq.replace(" ", "").split("->")
        x, y = lhs.split(",")
    except ValueError:
        return False
    return (len(y) == 2 and x[-1] == y[0] and rhs == x[:-1] + y[1] and len(set(x + y)) == len(x) + 1)


def from_match(m):
    """A GEMM in any of torch's spellings, as the family's a [M, K] @ b [K, N] (leading dims of
    a folded into M) or batched product; a linear layer's bias and an addmm's added term stay
    an add after the kernel."""
    name = m.pattern.split("/")[1]
    out = m.out_meta()
    if out is None:
        return None
    post_add = []
    if name.startswith("linear"):
        a, w = m.meta("x"), m.meta("w")
        if a is None or w is None or len(w["shape"]) != 2:
            return None
        b = dict(w, shape=(w["shape"][1], w["shape"][0]))
        an, bn, b_extra = "x", "w", [("t",)]
        if m.node("bias") is not None:
            post_add = [("add", Ref("bias"))]
    else:
        a, b = m.meta("a"), m.meta("b")
        an, bn, b_extra = "a", "b", []
        if name == "addmm":
            if m.meta("c") is None:
                return None
            post_add = [("add", Ref("c"))]
        if name == "einsum" and not _einsum_pair(str(m.captures.get("equation", ""))):
            raise NoFit(f"einsum {m.captures.get('equation')!r}: not a contraction the contract runs")
    if a is None or b is None:
        return None
    if a["dtype"] != b["dtype"] or not a["dtype"].is_floating_point or out["dtype"] != a["dtype"]:
        raise NoFit(f"operands {a['dtype']} @ {b['dtype']} -> {out['dtype']}: the contract "
                    f"multiplies two tensors of one float dtype")
    got = _gemm(a, b, out)
    if got is None:
        return None
    shape, av, bv, post = got
    # the layouts the model passes (a linear layer's W^T is the plain contract's b)
    spec = layout_spec(a, None if name.startswith("linear") else b)
    return Fit(spec, tuple(shape), {"a": Ref(an, tuple(av)), "b": Ref(bn, tuple(b_extra + bv))},
               post=tuple(post + post_add))


FAMILY = dataclasses.replace(
    FAMILY, spellings=SPELLINGS, from_match=from_match,
    op_schema="(Tensor a, Tensor b) -> Tensor",
    profile_ops=("aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm",
                 "aten::baddbmm", "aten::_scaled_mm"))
