"""Attention family: o = softmax(scale * q @ k^T (+ causal mask)) @ v, per (batch, head).

q [B, H, S, D]; k, v [B, Hkv, S, D] with grouped-query attention: H % Hkv == 0 and query head h
reads key/value head h // (H // Hkv) (Hkv == H: multi-head; Hkv == 1: multi-query). ``causal``
hides key j from query i when j > i (torch's is_causal: the mask is aligned top-left, which for
equal lengths is the usual decoder mask); ``scale`` defaults to 1/sqrt(D). Output [B, H, S, D]
in q's dtype. Candidates accept key/value lengths other than the queries' (same mask rule).

Shapes (the family's ``shape``): (B, H, S, D, Hkv, causal), causal 1 or 0; (B, H, S, D) and
(B, H, S, D, Hkv) mean causal with Hkv = H resp. the given Hkv; a seventh entry Sk is the
keys' length where it is not S (cross-attention, SegFormer's and PVT's keys pooled to fewer
positions): k, v are [B, Hkv, Sk, D], and such a shape is never causal. The profiler records
q's shape plus "kv_heads" for aten::scaled_dot_product_attention, and "causal" (its is_causal
argument) when the call passes no mask; ``from_profile`` takes a call without that key as
causal (a decoder's own mask). ``size`` (the verifier's interpreter cap) is q's numel times
the key blocks of 64.

The reference is F.scaled_dot_product_attention(q, k, v, is_causal, scale, enable_gqa) (torch
>= 2.5; 2.11 and 2.13 both have it): what LLaMA-style models call. q, k are made contiguous and
v as the [B, S, Hkv, D] -> [B, Hkv, S, D] transposed view a fused projection leaves (any strides
must work). Bytes the op must move: (2*B*H + 2*B*Hkv)*S*D*itemsize (read q, k, v, write o);
flops 4*B*H*S*S*D (half of it when causal): compute bound from S ~ 512 on.

Runtime masks (spec "mask": "bias" | "keep" | "hide", with "mask_dims" and, for a bool mask a
model writes out by hand, "fill"; section "runtime masks" below): kernel_fn(q, k, v, causal,
scale, mask) takes a mask the model computes when it runs (a padding mask from attention_mask,
a position bias), of any shape that broadcasts to [B, H, Sq, Sk]: a float bias added to the
scaled scores in fp32, or a bool mask (SDPA's True keeps a key; masked_fill's True hides it).
Kernels read it with its strides, broadcast dims at stride 0, in every key block. The reference
is SDPA with attn_mask (a row with every key masked gives 0) for an SDPA call, and the model's
own computation (``by_hand_masked``: NaN for a row of -inf, uniform weights for a finite fill)
for a hand-written one. Causal and a runtime mask come together only as a bias followed by the
causal mask (ALiBi as MPT writes it: spec "causal": true, family shapes ending in causal 1; the
kernels add the bias, then hide the future keys and skip the blocks above the diagonal); every
other masked contract's family shapes end in causal 0 (SDPA takes one or the other).

v's own head dim (spec "v_head_dim": Dv; multi-head latent attention, DeepSeek-V2/V3 and Kimi
K2: q and k 192 wide with their rotary part, v 128): v is [B, Hkv, Sk, Dv] and o [B, H, Sq, Dv];
the family shape's D stays q's and k's. The kernels read v's width from v, so every point
serves it; the reference is SDPA (which takes it), cost and inputs follow Dv.

Soft cap (spec "softcap": c, on a hand-written match; Gemma 2's attn_logit_softcapping): the
scaled scores become c * tanh(s / c) before the mask and the softmax. The reference and the
baseline are the model's own computation (``by_hand_capped``; SDPA has no cap); the kernels cap
each block's scores in registers (``_cap_src``), in base 2 with exp2 (the cap times log2(e)).

Numerics (flash attention): per program a tile of BLOCK_M queries, an online softmax over key
blocks of BLOCK_N (running max m, sum l rescaled by exp(m_old - m_new); rows that have seen only
masked keys subtract 0, not -inf, so no NaN), scores and accumulators in fp32; p is rounded to
v's dtype for the p @ v dot (as every flash kernel does). fp32 operands multiply, in both dots,
in the precision the ``fp32_dot`` axis names: full fp32 on the CUDA cores (input_precision="ieee")
or three TF32 products on the tensor cores ("tf32x3", accurate to about fp32); an fp32 target
starts at "tf32x3", at a tile measured for it (``default_for``, ``FP32_START``). Under the
interpreter bf16 tiles are upcast before tl.dot (its dot cannot multiply bf16; see
kernels/matmul.py), and tl.dot ignores input_precision (numpy fp32 matmul): only a GPU computes
the TF32 products.

Search space (``SPACE``), rendered by ``render`` into one self-contained candidate source:
- block_m, block_n: query rows per program, keys per step (clamped at launch: no larger than
  the sequence (min 16), registers for the [BLOCK_M, D] accumulator and [BLOCK_M, BLOCK_N]
  scores at most 192 fp32 per thread, pipelined K/V tiles within shared memory).
- causal_blocks: "mask_all" (visit every key block, mask each: the naive kernel), "skip" (stop at
  the diagonal: causal programs skip the blocks above it, about half the work), "split" (skip,
  and only the blocks crossing the diagonal or the sequence end pay for a mask: the others run
  a mask-free loop). Without causal, "split" still saves the mask on all but the last block.
- use_exp2: exp2 with log2(e) folded into the score scale (one multiply less per score).
- fold_scale: False (the scores are scaled in a pass of their own, s = s * qk_scale, before the
  row max and the exponent) or True (the row max of the raw scores is scaled, once a row, and
  each score's scale rides in its exponent's argument, s * qk_scale - m, one fused multiply-add:
  one floating-point operation less per score, where the softmax's arithmetic, not the tensor
  cores, bounds a Hopper flash kernel). Valid for a positive scale only (max(c * s) = c * max(s)
  needs c > 0): the kernel takes it through a constexpr FOLD, False for any other scale, and
  not with a runtime mask or a soft cap (both act on scaled scores; those render the unfolded
  step).
- m_order: "forward" or "reverse" (causal programs with the most key blocks start first: the
  last query blocks, which do the most work, do not trail the grid).
- num_warps, num_stages (software pipelining of the key loop).
- loads: "pointers" (any GPU, any strides) or "tma": q, k and v tiles and the o store through 4-D
  tensor descriptors (block [1, 1, rows, BLOCK_D]; zeros past the sequence and the head dim, the
  store clipped), on Hopper and newer NVIDIA GPUs and under the interpreter, for operands with a
  unit last stride and 16-byte aligned rows; anything else takes the pointer kernel. "ws": on a
  Hopper GPU (sm_90), bf16/fp16, head dims 64, 128 or 256 (q's and v's equal), no runtime mask or
  cap, a positive scale: the warp-specialized kernel written in Gluon (``_WS_SRC``: a loader
  warp, two consumer warp groups taking turns on the tensor cores, FlashAttention-3's schedule;
  block_n its key step, 64 or 128, num_stages its K/V ring depth, K and V apart where fewer than
  3 slots of one ring fit); anything else, and the
  interpreter, the "tma" kernel of the same point.
- ws_grid (loads "ws" only): "tiles", one program a 128-row tile, the GPU's scheduler handing
  tiles to SMs as they free; "persistent", one program an SM, its tiles dealt by the host
  (``_ws_schedule``: the scheduler simulated, each tile to the least-loaded program in index
  order, a head's tiles together heaviest first); "strided", one program an SM taking tiles
  p, p + P, ... In both persistent grids a tile's q loads under the last tile's end. H100,
  do_bench against SDPA (docs/benchmarks.md): persistent 1.05x at 4 x 32 x 4096 causal, 1.03x
  at 8 x 2048, 0.96x at head dim 64 (tiles 0.86-1.00x); strided 1.13x at LLaMA-3-8B's 1 x 2048
  (persistent 1.07x) and 1.03x not causal, behind elsewhere.
- warp_specialize (TMA kernel only; the pointer kernel renders the same): the main key loop as
  ``tl.range(..., warp_specialize=True)``: Triton splits it into a producer warp group issuing
  the K/V descriptor loads and consumer warp groups doing the dots and the softmax, so a tile's
  softmax overlaps the next tile's loads (FlashAttention-3's producer/consumer schedule, as far
  as the compiler builds it; Hopper and Blackwell). With num_warps 8 only: Triton 3.6's
  warp-specialization pass fails on this loop with 4 warps (H100); with 8 it ran at 0.83x SDPA
  at 4 x 32 x 4096 x 128, no faster than the same point without it. The interpreter runs the
  loop as written (the CPU tests check its values).
- split_d: a head dim as two power-of-2 parts (``_split_dim``: 192 = 128 + 64, 96 = 64 + 32,
  80 = 64 + 16), q @ k^T as two dots into the same scores and p @ v into two accumulators,
  where one power-of-2 tile pads with zeros (192 to 256: a third more q @ k^T work; 80 to
  128); a dim one tile holds without padding (128, MLA's v) keeps one tile, its second part
  of width 0 left out at compile time. The TMA kernel reads the second parts through
  descriptors on views from the first part's width on. Targets with such a head dim start
  with it (``openers_for``, ``default_for``).
- fp32_dot (fp32 operands only: bf16/fp16 tiles never take that branch): "ieee" (full fp32) or
  "tf32x3" (three TF32 products, the operands split in registers), for q @ k^T and p @ v alike.
  Not plain "tf32" (10-bit mantissas, ~2^-11 a product): the contract is fp32 attention (the
  reference in float64, the bound 64 fp32 ulps of the scores' magnitude) whatever the model's
  torch.backends.cuda.matmul.allow_tf32, as for the matmul family, whose space has only
  fp32-grade dots; the run's TF32 flag moves the speed of light (engine/hw.py), not the bound.
  Only a convolution region offers "tf32", where its spec carries cuDNN's TF32 setting from the
  process that captured the model; attention's match fixes no spec. Emulated, TF32 dots erred by
  2.6 to 140 times the bound on the inputs the verifier makes (tests): every such point would be
  a rejected experiment.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import textwrap

import torch
import torch.nn.functional as F

from kernels import Family
from kernels import _common as C
from kernels.patterns import Fit, NoFit, Ref, Scalar, Spelling, T

NAME = "attention"
SIGNATURE = "kernel_fn(q, k, v, causal, scale)"
ARG_NAMES = ("q", "k", "v", "causal", "scale")
ADVERSARIAL = ("huge", "tiny", "mixed_scale", "constant_rows", "heavy_tail")
MAX_HEAD_DIM = 256
WS_HEAD_DIMS = (64, 128, 256)    # the head dims of the warp-specialized kernel (loads "ws")


def reference(q, k, v, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])


def by_hand(q, k, v, causal, scale):
    """The same function as ``reference``, computed as a model writes it out: q @ k^T scaled, the
    future keys hidden by masked_fill(-inf), softmax in at least fp32 and cast back (as Hugging
    Face's eager attention), @ v; GQA by repeat_interleave. The baseline of a hand-written match (spec
    {"written": "by_hand"}): its eager and torch.compile timings are what the model runs. On the
    H200, KernelBench 43's (128 x 8 x 512 x 96, fp32, causal) took 5,245 us this way against
    SDPA's 1,793 us, so SDPA was no measure of the model's own attention."""
    return _written_out(q, k, v, causal, scale)


def _hide_causal(sq: int, sk: int, device):
    """The keys a causal mask hides: bool [Sq, Sk], True above the diagonal."""
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(1)


def _capped(cap):
    """The scores' logit soft cap as Gemma 2 writes it, cap * tanh(s / cap) (spec "softcap";
    None: the scores as they are)."""
    if cap is None:
        return lambda s: s
    return lambda s: torch.tanh(s / cap) * cap


def by_hand_capped(cap: float):
    """``by_hand`` with the scores soft-capped before the mask and the softmax: the reference
    and the baseline of a capped match (SDPA has no cap)."""
    def fn(q, k, v, causal, scale):
        return _written_out(q, k, v, causal, scale, _capped(cap))
    return fn


def _written_out(q, k, v, causal, scale, on_scores=None):
    """Attention as a model writes it out (``by_hand``; ``by_hand_masked`` passes its mask as
    ``on_scores``, applied to the scaled scores before the causal mask)."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-2, -1)) * sc                      # [B, H, Sq, Sk]
    if on_scores is not None:
        s = on_scores(s)
    if causal:
        s = s.masked_fill(_hide_causal(*s.shape[-2:], s.device), float("-inf"))
    p = torch.softmax(s, dim=-1, dtype=torch.promote_types(s.dtype, torch.float32))
    return p.to(q.dtype) @ v


# ---------------------------------------------------------------------------------------------
# shapes and inputs
# ---------------------------------------------------------------------------------------------

def problem(shape) -> tuple[int, int, int, int, int, bool]:
    """(B, H, S, D, Hkv, causal) of a family shape with 4 to 7 entries (keys_len: the 7th)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (4, 5, 6, 7):
        raise ValueError(f"an attention shape is (B, H, S, D[, Hkv[, causal[, Sk]]]), got {shape}")
    b, h, s, d = shape[:4]
    hkv = shape[4] if len(shape) > 4 else h
    causal = bool(shape[5]) if len(shape) > 5 else True
    if hkv < 1 or h % hkv:
        raise ValueError(f"query heads ({h}) must be a multiple of key/value heads ({hkv})")
    if len(shape) > 6 and (shape[6] < 1 or (causal and shape[6] != s)):
        raise ValueError(f"keys' length {shape[6]} with {s} queries" + (
            " and a causal mask: the contract's causal shapes have Sk = S" if causal else ""))
    return b, h, s, d, hkv, causal


def keys_len(shape) -> int:
    """Sk, the keys' (and values') length: the shape's 7th entry, else S."""
    return int(shape[6]) if len(shape) > 6 else int(shape[2])


def _score_count(shape) -> int:
    """Scores the shape computes: B * H * S * Sk, or the lower triangle's when causal."""
    b, h, s, _, _, causal = problem(shape)
    return b * h * (s * (s + 1) // 2 if causal else s * keys_len(shape))


def size(shape) -> int:
    """q's numel times its key blocks of 64: the interpreter's work grows as S * Sk."""
    b, h, s, d, _, _ = problem(shape)
    return b * h * s * d * max(1, -(-keys_len(shape) // 64))


def from_profile(record: dict) -> tuple:
    b, h, s, d = (int(x) for x in record["shape"])
    hkv = int(record.get("kv_heads") or h)
    return (b, h, s, d, hkv, int(bool(record.get("causal", True))))


# "huge": scores of standard deviation ~300 (q, k ~ N(0, 300)): exp(300) overflows even fp32,
# so a kernel without the max subtraction returns inf/NaN.
_HUGE_SIGMA = math.sqrt(300.0)


def make_inputs(shape, dtype, device, gen, kind="normal", v_dim=None):
    """{q: [B, H, S, D], k: [B, Hkv, Sk, D], v: [B, Hkv, Sk, Dv] (a transposed view), causal,
    scale} from ``gen``; Dv is ``v_dim`` (spec "v_head_dim"), else D."""
    dtype = C.as_dtype(dtype)
    b, h, s, d, hkv, causal = problem(shape)
    sk = keys_len(shape)
    dv = v_dim or d
    q = C.randn(gen, b, h, s, d)
    k = C.randn(gen, b, hkv, sk, d)
    v = C.randn(gen, b, sk, hkv, dv)                                   # [B, Sk, Hkv, Dv]
    if kind == "huge":
        q, k = q * _HUGE_SIGMA, k * _HUGE_SIGMA
    elif kind == "tiny":
        # scores ~1e-6: attention is uniform over the visible keys; padded key lanes that score
        # 0 instead of -inf would take a share
        q, k = q * 1e-3, k * 1e-3
    elif kind == "mixed_scale":
        # every query row its own temperature: 10^-2 (uniform) .. 10^1.5 (one-hot)
        q = q * torch.pow(10.0, -2.0 + 3.5 * C.rand(gen, b, h, s, 1))
    elif kind == "constant_rows":
        k = k[:, :, :1, :].expand(b, hkv, sk, d).clone()              # equal scores along a row
    elif kind == "heavy_tail":
        v = C.cauchy(gen, b * sk * hkv, dv).reshape(b, sk, hkv, dv).clamp(-1e4, 1e4)
    elif kind != "normal":
        raise ValueError(f"unknown input kind {kind!r}; known: normal, {', '.join(ADVERSARIAL)}")
    v = v.to(dtype).to(device).transpose(1, 2)                         # [B, Hkv, Sk, Dv] view
    return {"q": q.to(dtype).to(device), "k": k.to(dtype).to(device), "v": v,
            "causal": causal, "scale": 1.0 / math.sqrt(d)}


def error_bound(q, k, v, causal, scale, cap=None):
    """(P * (1 + A)) @ |v|: P the attention weights, A = |scale| |q| @ |k|^T the scores' own
    magnitude (a score's rounding error is ~u*A, which moves its weight by that factor). A soft
    cap (``cap``) changes P; it moves no score's error up (tanh's slope is at most 1)."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = _capped(cap)((q @ k.transpose(-1, -2)) * sc)
    a = (q.abs() @ k.abs().transpose(-1, -2)) * abs(sc)
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        hide = torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(hide, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return (p * (1.0 + a)) @ v.abs()


# |out - expected| <= atol + rtol*|expected| + stol*bound (error_bound above), expected = fp64
# SDPA cast to the output dtype. fp16/bf16: p is rounded to the dtype for p @ v (half an ulp,
# 2^-11 / 2^-8 relative, of each weight): stol is twice that; rtol the output's own rounding
# (doubled). fp32: fp32 dots and exp, stol 64 ulps. "tf32x3" dots need no more: a product
# hi*hi + hi*lo + lo*hi (hi rounded to TF32, lo = x - hi as the tensor core reads it, its low 13
# bits cut; lo*lo dropped) is off by at most ~5 * 2^-22 = 20 ulps of |q||k| (|p||v|), inside the
# 64 ulps of A (and of P @ |v|) the bound grants. Emulated on the CPU (tests), tf32x3 attention
# stays below 0.07 of the bound on every input kind, as IEEE fp32 does; plain TF32 (2^-11 a
# product) is off by 2.6-140 times it. A kernel that drops the scale, the causal mask, the GQA
# head mapping or the max subtraction is off by O(1) of the bound.
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


def cost(shape, dtype, v_dim=None):
    """(bytes, flops): read q, k, v once, write o once; 2*D flops per score for q @ k^T and 2*Dv
    for p @ v (Dv: ``v_dim``, else D), about 5 more per score for the softmax; causal visits
    S*(S+1)/2 scores."""
    item = C.itemsize(dtype)
    b, h, s, d, hkv, _ = problem(shape)
    dv = v_dim or d
    byts = (b * h * s + b * hkv * keys_len(shape)) * (d + dv) * item
    return byts, _score_count(shape) * (2 * d + 2 * dv + 5)


# (B, H, S, D, Hkv, causal). Llama-3-8B / Mistral-7B prefill (32 q heads, 8 kv heads, D 128) at
# 2k and 4k tokens, Llama-2-7B (MHA), a 70B-style 64/8 head split at 8k, GPT-2 / BERT (12 heads
# of 64, BERT bidirectional), a D=64 GQA model, and odd sizes.
BENCH_SHAPES = ((4, 32, 4096, 128, 8, 1), (1, 32, 2048, 128, 8, 1), (1, 32, 4096, 128, 32, 1),
                (1, 64, 8192, 128, 8, 1), (8, 12, 1024, 64, 12, 1), (8, 12, 512, 64, 12, 0),
                (4, 16, 2048, 64, 4, 0), (3, 6, 1000, 64, 2, 1), (2, 8, 777, 128, 8, 0))
# Under the interpreter the verifier keeps size() <= 2^15: the first eight; the rest are for GPUs.
SWEEP_SHAPES = ((1, 1, 1, 16, 1, 1), (1, 2, 7, 16, 1, 0), (2, 4, 33, 64, 2, 1),
                (1, 2, 65, 64, 1, 0), (1, 4, 17, 128, 2, 1), (2, 2, 100, 32, 2, 0),
                (1, 8, 50, 64, 2, 1), (1, 2, 40, 128, 1, 0), (1, 2, 130, 64, 1, 1),
                (2, 12, 512, 64, 12, 0), (1, 32, 1024, 128, 8, 1), (1, 8, 4097, 64, 2, 1))
EDGE_SHAPES = ((1, 1, 1, 64, 1, 0), (1, 1, 1, 128, 1, 1), (3, 3, 5, 64, 1, 1),
               (1, 2, 127, 64, 2, 0), (1, 1, 97, 80, 1, 1), (2, 6, 13, 96, 3, 0),
               (1, 2, 64, 256, 2, 1))


# ---------------------------------------------------------------------------------------------
# search space and rendering
# ---------------------------------------------------------------------------------------------

SPACE = {
    "block_m": [16, 32, 64, 128],
    "block_n": [16, 32, 64, 128],
    "num_warps": [2, 4, 8],
    "num_stages": [1, 2, 3, 4],
    "causal_blocks": ["mask_all", "skip", "split"],
    "use_exp2": [False, True],
    "m_order": ["forward", "reverse"],
    "loads": ["pointers", "tma", "ws"],
    "fp32_dot": ["ieee", "tf32x3"],
    "fold_scale": [False, True],
    "warp_specialize": [False, True],
    "split_d": [False, True],
    "ws_grid": ["tiles", "persistent", "strided"],
}
DEFAULT = {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2,
           "causal_blocks": "skip", "use_exp2": False, "m_order": "forward", "loads": "pointers",
           "fp32_dot": "ieee", "fold_scale": False, "warp_specialize": False,
           "split_d": False, "ws_grid": "tiles"}


# What the rendered source says its fp32 dots compute (docstring), and the comment on its fp32
# branch. "tf32x3": Triton splits each fp32 operand x into hi = TF32(x) and lo = x - hi and sums
# hi*lo + lo*hi, then hi*hi, on the tensor cores (an fp32 accumulator): 22 significant bits a
# product against fp32's 24. On the H200 three TF32 products (415 / 3 TFLOP/s) outrun the fp32
# units (51): the IEEE dot ran KernelBench's MinGPT causal attention (fp32, 128 x 8 heads x 512
# x 96) in 11,496 us against eager's 1,793 us (cuBLAS fp32 bmm and softmax).
FP32_DOT_DOC = {
    "ieee": "fp32 operands multiply in full fp32 on the CUDA cores (input_precision=\"ieee\", "
            "no TF32)",
    "tf32x3": "fp32 operands multiply on the tensor cores as three TF32 products "
              "(input_precision=\"tf32x3\": hi*hi + hi*lo + lo*hi, 22 significant bits a product, "
              "accurate to about fp32)",
}
FP32_DOT_NOTE = {
    "ieee": "fp32 tiles: full fp32, no TF32",
    "tf32x3": "fp32 tiles: three TF32 products (~fp32)",
}


# An fp32 target's starter: tf32x3 at 128 x 64, 8 warps. On the H200 (Triton 3.6, causal,
# triton.testing.do_bench medians) that tile, one stage where D pads to 128 (shared memory),
# ran KernelBench's 128 x 8 x 512 x 96 in 2,161 us, the fastest of 11 tiles and variants tried
# there, and 4 x 32 x 2048 x 64 in 1,793 us; the family's 64 x 32, 4 warps took 3,206 and
# 2,162 us, the IEEE dot there 11,519 and 6,550 us (eager fp32 5,245 and 8,487 us, SDPA 1,793
# and 2,174 us). At 2048 x 64 TMA loads with the split causal loop, exp2 and the reverse order
# took 1,328 us: moves for the search.
FP32_START = {"fp32_dot": "tf32x3", "block_m": 128, "block_n": 64, "num_warps": 8}


# bf16/fp16 targets' first moves: the fastest points of an exploratory sweep on an H100 (Triton
# 3.6, triton.testing.do_bench medians, L2 flushed; docs/sweeps, docs/benchmarks.md) at
# 4 x 32 x 4096 causal, GQA 4: 64 x 64 blocks through TMA, 3 stages, exp2, heaviest query
# blocks first, the causal loop split at the diagonal ran head dim 128 in 1,206-1,209 us
# (0.80-0.82x SDPA; the default point 1,762 us, 0.56x); 128 x 64, 8 warps, 4 stages ran head
# dim 64 in 728 us (0.92x) and, on 16 heads, 256 in 1,145 (0.82-0.84x).
HALF_OPENERS = ({"block_m": 64, "block_n": 64, "num_stages": 3, "use_exp2": True, "loads": "tma",
                 "m_order": "reverse", "causal_blocks": "split"},
                {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 4, "use_exp2": True,
                 "loads": "tma", "causal_blocks": "split"})


# A head dim that is no power of 2 opens with it in two parts (split_d): an H100 sweep
# (docs/sweeps/h100_odd_head_dims.json, do_bench, causal, bf16) ran this point at Phi-3's 96
# (4 x 32 x 4096) in 953.8 us against SDPA's 992.9 (1.04x; unsplit 1165.7), at DeepSeek's MLA
# (q/k 192, v 128; 4 x 16 x 4096) in 745.7 against 590.9 (0.79x; unsplit 813.2), and the first
# opener split ran Phi-2's 80 (4 x 32 x 2048) at 1.00x SDPA (unsplit 0.81x).
SPLIT_OPENERS = ({"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3, "use_exp2": True,
                  "loads": "tma", "causal_blocks": "split", "m_order": "reverse", "fold_scale": True,
                  "split_d": True},
                 dict(HALF_OPENERS[0], split_d=True))


# Hopper's warp-specialized Gluon kernel (loads "ws") opens where it applies (head dim 64, 128
# or 256), on its two persistent grids (dealt, then strided). H100, do_bench, bf16, GQA 8,
# causal: 128-key blocks and a ring of 3 K/V tiles ran 4 x 32 x 4096 x 128 1.05x SDPA (the
# Triton point HALF_OPENERS[0] about 0.85x), 8 x 2048 1.03-1.04x, head dim 64 0.96x; strided
# LLaMA-3-8B's 1 x 2048 1.13x; head dim 256 (64-key blocks, K and V apart) 0.89-0.96x
# (docs/benchmarks.md). Elsewhere than on Hopper the point runs its Triton TMA kernel (this tile).
WS_OPENER = dict(HALF_OPENERS[0], loads="ws", block_n=128, ws_grid="persistent")


def openers_for(shape, dtype: str) -> tuple:
    """The first moves for a target: HALF_OPENERS for bf16/fp16 (fp32 starts on the tensor
    cores at FP32_START, default_for), WS_OPENER first at the head dims the warp-specialized
    kernel takes; where the head dim is no power of 2 (80, 96, 192), SPLIT_OPENERS first
    (split_d: no zero padding in the dots)."""
    if str(dtype).removeprefix("torch.") == "float32":
        return ()
    if _odd_head_dim(shape):
        return SPLIT_OPENERS + HALF_OPENERS
    ws = (WS_OPENER, dict(WS_OPENER, ws_grid="strided"))
    return (ws if problem(shape)[3] in WS_HEAD_DIMS else ()) + HALF_OPENERS


def space_for(shape, dtype: str) -> dict:
    """The "ws" loads (and their grids) only where the warp-specialized kernel can run: 16-bit
    operands at a head dim it takes; elsewhere the point would render the same TMA kernel."""
    if str(dtype).removeprefix("torch.") in ("bfloat16", "float16") and \
            problem(shape)[3] in WS_HEAD_DIMS:
        return {}
    return _without_ws(shape, dtype)


def _without_ws(shape, dtype: str) -> dict:
    """The space without the "ws" loads: for contracts that kernel does not take (a runtime
    mask, a soft cap) and targets it cannot run."""
    return {"loads": [v for v in SPACE["loads"] if v != "ws"], "ws_grid": [DEFAULT["ws_grid"]]}


def _odd_head_dim(shape) -> bool:
    """A head dim that is no power of 2 (80, 96, 192): split_d computes it without padding."""
    d = problem(shape)[3]
    return d > 16 and bool(d & (d - 1))


def default_for(shape, dtype: str) -> dict:
    """The starter of a target: fp32 on the tensor cores (tf32x3, accurate to about fp32, at
    FP32_START's tile), its head dim in two parts where it is no power of 2 (split_d: on an
    H100, KernelBench's MinGPT attention, fp32 128 x 8 x 512 x 96 causal, ran FP32_START in
    1,949.2 us and with split_d in 1,352.6, 1.32x SDPA's 1,785, the loop's own timing); the
    IEEE dot stays in the space (fp32_dot "ieee"). Other dtypes: the family's default (the
    axis does not touch their dots; their openers split, ``openers_for``)."""
    if str(dtype).removeprefix("torch.") != "float32":
        return {}
    return dict(FP32_START, split_d=True) if _odd_head_dim(shape) else dict(FP32_START)


_HELPERS_SRC = '''
MAX_HEAD_DIM = 256
MAX_REGS_PER_THREAD = 192  # fp32 registers for the accumulator [BM, D] and scores [BM, BN]


''' + C.SMEM_BUDGET_SRC + '''

def _fit_attn(bm, bn, bd, stages, warps, sq, sk, itemsize, budget, q_tiles=1, mask_tiles=0,
              bdv=None):
    """Clamp the query tile bm and key step bn to the sequence (min 16, the smallest tl.dot),
    registers (bm * (bdv + bn) fp32 within MAX_REGS_PER_THREAD per thread: the accumulator
    [bm, bdv] and the scores, plus ``mask_tiles`` [bm, bn] tiles of a runtime mask) and shared
    memory (``q_tiles`` copies of the q tile [bm, bd], ``stages`` buffered K [bn, bd] and V
    [bn, bdv] tiles and p [bm, bn] on its way to the second dot; stages drop first, then bn,
    then bm). ``bdv``, v's padded head dim, is bd unless v's head dim is its own (MLA)."""
    bdv = bd if bdv is None else bdv
    bm = min(bm, max(16, _pow2(sq)))
    bn = min(bn, max(16, _pow2(sk)))
    while bm * (bdv + (1 + mask_tiles) * bn) > MAX_REGS_PER_THREAD * 32 * warps and max(bm, bn) > 16:
        if bm >= bn:
            bm //= 2
        else:
            bn //= 2

    def smem(s, n):
        return (q_tiles * bm * bd + max(1, s) * n * (bd + bdv) + bm * n) * itemsize

    while stages > 1 and smem(stages, bn) > budget:
        stages -= 1
    while bn > 16 and smem(stages, bn) > budget:
        bn //= 2
    while bm > 16 and smem(stages, bn) > budget:
        bm //= 2
    return bm, bn, stages
'''

_SPLIT_DIM_SRC = '''

def _split_dim(n):
    """A head dim n as two power-of-2 tile widths (hi, lo), hi + lo >= n, where two parts pad
    less than one tile: 192 -> (128, 64), 96 -> (64, 32), 80 -> (64, 16); else one tile and
    no second part (lo 0): 128 -> (128, 0), 112 -> (128, 0). One tile pads 192 to 256 (a
    third more q @ k^T work) and 80 to 128."""
    full = max(16, _pow2(n))
    hi = full // 2
    if hi < 16 or n <= hi:
        return full, 0
    lo = max(16, _pow2(n - hi))
    return (hi, lo) if hi + lo < full else (full, 0)
'''


_ARGS = ("q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, H, GROUP, SQ, SK, D, DV,\n"
         "          stride_qb, stride_qh, stride_qm, stride_qd,\n"
         "          stride_kb, stride_kh, stride_kn, stride_kd,\n"
         "          stride_vb, stride_vh, stride_vn, stride_vd,\n"
         "          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,\n"
         "          BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr, DOT_FP32: tl.constexpr")


# a runtime mask's extra arguments: its pointer, the value hidden scores take (bool masks) and
# its strides over [B, H, Sq, Sk] (0 on broadcast dims)
_MASK_ARGS = ("m_ptr, fill, stride_mb, stride_mh, stride_mm, stride_mn,\n          ")


def _args(mask, tma: bool, fold: bool = False, split: bool = False) -> str:
    base = (_TMA_ARGS if tma else _ARGS) + (", FOLD: tl.constexpr" if fold else "")
    if split:     # the head dims' second parts: their descriptors, their widths
        if tma:
            base = base.replace("o_desc, qk_scale", "o_desc, q2_desc, k2_desc, v2_desc, o2_desc, qk_scale")
        base = base.replace("BLOCK_DV: tl.constexpr,",
                            "BLOCK_DV: tl.constexpr, BLOCK_D2: tl.constexpr, BLOCK_DV2: tl.constexpr,")
    if not mask:
        return base
    cut = base.index("BLOCK_M")
    return base[:cut] + _MASK_ARGS + base[cut:]


_TMA_ARGS = ("q_desc, k_desc, v_desc, o_desc, qk_scale, H, GROUP, SQ, SK,\n"
             "              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,\n"
             "              BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr, DOT_FP32: tl.constexpr")


def _mask_src(p, mask) -> str:
    """The runtime mask applied to one block's scores s [BLOCK_M, BLOCK_N] (scaled, fp32), read
    through pointers with its own strides (TMA points too: the mask is one byte or one element
    per score, broadcast dims stride 0). Bool masks come as uint8 (1 = True)."""
    load = '''
mk = tl.load(m_base + offs_m[:, None] * stride_mm + kn[None, :] * stride_mn,
             mask=(offs_m < SQ)[:, None] & (kn < SK)[None, :], other=0)   # [BLOCK_M, BLOCK_N]'''
    kind = mask["kind"]
    if kind == "bias":
        if p["use_exp2"]:
            return load + '''
mb = mk.to(tl.float32)
# base-2 scores take the bias times log2(e); the most negative biases stay as they are
# (finfo.min * log2(e) overflows to -inf, and an all-padding row of finfo.min, uniform
# weights in the reference, would turn into 0 / 0)
s = s + tl.where(mb > -2.0e38, mb * 1.4426950408889634, mb)'''
        return load + '''
s = s + mk.to(tl.float32)                                          # the additive bias, in fp32'''
    if kind == "keep":
        return load + '''
s = tl.where(mk != 0, s, fill)                                     # True keeps the key'''
    return load + '''
s = tl.where(mk != 0, fill, s)                                     # True hides the key'''


def _cap_src(c: float) -> str:
    """The soft cap on one block's scaled scores: c * tanh(s / c), c in the scores' units (base
    2 with exp2: the cap times log2(e), as the scores). tanh near 0 by its series (1 - 2 / (e^2z
    + 1) loses z's digits there; the series to z^9 is off by < 4e-9 for |z| < 1/4), the exact
    limits beyond."""
    return f'''
z = s * {1.0 / c!r}                                       # s / cap
z2 = z * z
t_small = z * (1.0 + z2 * (-0.3333333333333333 + z2 * (0.13333333333333333
              + z2 * (-0.05396825396825397 + z2 * 0.021869488536155203))))
t_big = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)
s = {c!r} * tl.where(tl.abs(z) < 0.25, t_small, t_big)   # soft cap: cap * tanh(s / cap)'''


def _step(p, masked: bool, tma: bool = False, mask=None, cap=None) -> str:
    """One key block at start_n: scores, (runtime mask), (causal and tail mask), online-softmax
    update, p @ v. With ``tma`` the K and V tiles come through descriptors (zeros past Sk and D:
    the key mask still applies). A runtime ``mask`` applies to every block, masked or not."""
    e2 = p["use_exp2"]
    exp = (lambda a: f"tl.exp2({a})") if e2 else (lambda a: f"tl.exp({a})")
    split = bool(p.get("split_d"))
    if tma:
        loads = '''
kt = tl.trans(k_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D))   # [BLOCK_D, BLOCK_N]
vt = v_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_DV)           # [BLOCK_N, BLOCK_DV]'''
        if split:    # the second parts (width 0: none; a compile-time branch)
            loads += '''
if BLOCK_D2 > 0:
    kt2 = tl.trans(k2_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D2))  # dims BLOCK_D on
if BLOCK_DV2 > 0:
    vt2 = v2_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_DV2)'''
    else:
        loads = '''
kt = tl.load(k_base + kn[None, :] * stride_kn + offs_d[:, None] * stride_kd,
             mask=(kn < SK)[None, :] & d_ok[:, None], other=0.0)   # [BLOCK_D, BLOCK_N]
vt = tl.load(v_base + kn[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
             mask=(kn < SK)[:, None] & dv_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_DV]'''
        if split:
            loads += '''
if BLOCK_D2 > 0:
    kt2 = tl.load(k_base + kn[None, :] * stride_kn + offs_d2[:, None] * stride_kd,
                  mask=(kn < SK)[None, :] & d2_ok[:, None], other=0.0)  # [BLOCK_D2, BLOCK_N]
if BLOCK_DV2 > 0:
    vt2 = tl.load(v_base + kn[:, None] * stride_vn + offs_dv2[None, :] * stride_vd,
                  mask=(kn < SK)[:, None] & dv2_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_DV2]'''
    # both dots of fp32 tiles in the point's precision; bf16/fp16 tiles take the native dot
    dot, note = p["fp32_dot"], FP32_DOT_NOTE[p["fp32_dot"]]
    lines = ['''
kn = start_n + offs_n                                              # [BLOCK_N] key positions''' + loads + f'''
qd = q
if DOT_FP32:                       # interpreter: its tl.dot cannot multiply bf16
    qd = qd.to(tl.float32)
    kt = kt.to(tl.float32)
s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
if IEEE:                           # {note}
    s = tl.dot(qd, kt, s, input_precision="{dot}")
else:
    s = tl.dot(qd, kt, s)''']
    if split:      # the head dim's second part, into the same scores
        lines.append(f'''if BLOCK_D2 > 0:
    qd2 = q2
    if DOT_FP32:
        qd2 = qd2.to(tl.float32)
        kt2 = kt2.to(tl.float32)
    if IEEE:
        s = tl.dot(qd2, kt2, s, input_precision="{dot}")
    else:
        s = tl.dot(qd2, kt2, s)''')
    if folds(p, mask, cap):
        # FOLD (qk_scale > 0): the raw scores' row max scaled once a row, each score scaled in
        # its exponent's argument (one FMA); otherwise the scaled scores, as below
        vis = ("\n" + C.indent(_VISIBLE_SRC, 4)) if masked else ""
        lines.append(f'''
if FOLD:{vis}
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = {exp("m_i - m_ref")}
    pr = {exp("s * qk_scale - m_ref[:, None]")}
else:
    s = s * qk_scale{vis}
{C.indent(_online_src(exp), 4)}''')
        lines.append(_update_src(p, exp, dot, note))
        return "\n".join(x.strip("\n") for x in lines)
    lines.append("s = s * qk_scale")
    if cap is not None:
        lines.append(_cap_src(cap * (1.4426950408889634 if e2 else 1.0)))
    if mask:
        lines.append(_mask_src(p, mask))
    if masked:
        lines.append(_VISIBLE_SRC)
    lines.append(_online_src(exp))
    lines.append(_update_src(p, exp, dot, note))
    return "\n".join(x.strip("\n") for x in lines)


# the causal and tail mask of a block's scores s [BLOCK_M, BLOCK_N]
_VISIBLE_SRC = '''visible = (kn < SK)[None, :]
if CAUSAL:
    visible = visible & (offs_m[:, None] >= kn[None, :])
s = tl.where(visible, s, float("-inf"))'''


def _online_src(exp) -> str:
    """The online softmax's new max, the rescale of what came before and this block's p, from
    scaled scores s."""
    return f'''m_new = tl.maximum(m_i, tl.max(s, axis=1))
# rows that saw only masked keys so far subtract 0: exp(-inf - 0) = 0, not exp(-inf + inf) = NaN
m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
alpha = {exp("m_i - m_ref")}
pr = {exp("s - m_ref[:, None]")}'''


def folds(p, mask=None, cap=None) -> bool:
    """Whether the point's key step folds the scale into the exponent (fold_scale; not with a
    runtime mask or a soft cap, which act on the scaled scores)."""
    return bool(p.get("fold_scale")) and not mask and cap is None


def _update_src(p, exp, dot: str, note: str) -> str:
    """The online-softmax update after pr and alpha: the running sum, p @ v (and p @ v's second
    part into acc2 with split_d), the running max."""
    second = ""
    if p.get("split_d"):
        second = f'''
if BLOCK_DV2 > 0:
    if DOT_FP32:
        vt2 = vt2.to(tl.float32)
    acc2 = acc2 * alpha[:, None]
    if IEEE:
        acc2 = tl.dot(pv, vt2, acc2, input_precision="{dot}")
    else:
        acc2 = tl.dot(pv, vt2, acc2)'''
    return f'''
l_i = l_i * alpha + tl.sum(pr, axis=1)
pv = pr.to(vt.dtype)                                               # p rounded to v's dtype
if DOT_FP32:
    pv = pv.to(tl.float32)
    vt = vt.to(tl.float32)
acc = acc * alpha[:, None]
if IEEE:                           # {note}
    acc = tl.dot(pv, vt, acc, input_precision="{dot}")
else:
    acc = tl.dot(pv, vt, acc){second}
m_i = m_new'''


def _kernel(p, tma: bool = False, mask=None, cap=None) -> str:
    """The kernel's source: ``_attn_fwd`` (pointer loads, any strides) or, with ``tma``,
    ``_attn_fwd_tma`` (q, k, v tiles and the o store through 4-D tensor descriptors); with a
    runtime ``mask`` ({"kind", "safe"}) both read it through pointers in every key block."""
    cb = p["causal_blocks"]
    if p["m_order"] == "reverse":
        pid = "pid_m = tl.num_programs(0) - 1 - tl.program_id(0)              # heaviest query blocks first"
    else:
        pid = "pid_m = tl.program_id(0)"
    # key range: all blocks, or up to the diagonal (causal)
    if cb == "mask_all":
        bounds = "hi = SK"
    else:
        bounds = ("hi = SK\nif CAUSAL:\n"
                  "    hi = tl.minimum(SK, (pid_m + 1) * BLOCK_M)               # skip blocks above the diagonal")
    step_masked = _step(p, True, tma, mask, cap)
    # the TMA kernel's main key loop warp-specialized: Triton splits it into a producer warp
    # group issuing the K/V descriptor loads and consumer groups doing the dots and the
    # softmax, so one tile's softmax runs under the next tile's loads (FlashAttention-3's
    # schedule, as far as the compiler builds it). Triton 3.6's pass fails on this loop with 4
    # warps (H100, every shape tried: "PassManager::run failed"): 8 warps and up only; with 8
    # it ran, at 0.83x SDPA, no faster than without (docs/benchmarks.md)
    ws = ", warp_specialize=True" if tma and p["warp_specialize"] and p["num_warps"] >= 8 else ""
    if cb == "split":
        # blocks [0, n_full * BLOCK_N) are entirely visible to every row of the tile
        loops = f'''
n_full = SK // BLOCK_N
if CAUSAL:
    n_full = tl.minimum(n_full, (pid_m * BLOCK_M + 1) // BLOCK_N)
for start_n in {"tl.range" if ws else "range"}(0, n_full * BLOCK_N, BLOCK_N{ws}):                 # no mask needed
{C.indent(_step(p, False, tma, mask, cap), 4)}
for start_n in range(n_full * BLOCK_N, hi, BLOCK_N):                # diagonal / tail blocks
{C.indent(step_masked, 4)}'''
    else:
        loops = f'''
for start_n in {"tl.range" if ws else "range"}(0, hi, BLOCK_N{ws}):
{C.indent(step_masked, 4)}'''
    scale_note = ("log2(e) * scale: scores in base 2" if p["use_exp2"] else "scale")
    m_base = ""
    if mask:
        m_base = ("\n    m_base = m_ptr + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh"
                  "   # the mask's [Sq, Sk] plane")
    split = bool(p.get("split_d"))
    if mask and mask["safe"]:
        # a row whose keys are all masked: SDPA's output there is 0, not 0 / 0 (acc is 0 too)
        finish = "o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]       # all-masked rows: 0"
        if split:
            finish += "\n    if BLOCK_DV2 > 0:\n        o2 = acc2 / tl.where(l_i == 0.0, 1.0, l_i)[:, None]"
    else:
        finish = "o = acc / l_i[:, None]" + (
            "\n    if BLOCK_DV2 > 0:\n        o2 = acc2 / l_i[:, None]" if split else "")
    if tma:
        name, args = "_attn_fwd_tma", _args(mask, True, folds(p, mask, cap), split)
        index = '''b = bh // H
    h = bh % H
    hk = h // GROUP                                                # the key/value head (GQA)'''
        bases = '''q = q_desc.load([b, h, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, BLOCK_D)  # zeros past Sq, D'''
        store = '''o_desc.store([b, h, pid_m * BLOCK_M, 0],
                 o.to(o_desc.dtype).reshape(1, 1, BLOCK_M, BLOCK_DV))  # clipped at Sq and Dv'''
        if split:  # the second parts' descriptors start at dims BLOCK_D and BLOCK_DV
            bases += '''
    if BLOCK_D2 > 0:                         # the head dim's second part (0: none, decided at compile time)
        q2 = q2_desc.load([b, h, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, BLOCK_D2)'''
            store += '''
    if BLOCK_DV2 > 0:
        o2_desc.store([b, h, pid_m * BLOCK_M, 0], o2.to(o2_desc.dtype).reshape(1, 1, BLOCK_M, BLOCK_DV2))'''
    else:
        name, args = "_attn_fwd", _args(mask, False, folds(p, mask, cap), split)
        index = '''b = (bh // H).to(tl.int64)
    h = bh % H
    hk = (h // GROUP).to(tl.int64)                                 # the key/value head (GQA)'''
        bases = '''d_ok = offs_d < D
    dv_ok = offs_dv < DV
    q_base = q_ptr + b * stride_qb + h.to(tl.int64) * stride_qh
    k_base = k_ptr + b * stride_kb + hk * stride_kh
    v_base = v_ptr + b * stride_vb + hk * stride_vh
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=(offs_m < SQ)[:, None] & d_ok[None, :], other=0.0)   # [BLOCK_M, BLOCK_D]'''
        store = '''o_base = o_ptr + (b * SQ * H + h) * DV                         # o [B, SQ, H, DV] in memory
    tl.store(o_base + offs_m[:, None] * (H * DV) + offs_dv[None, :], o.to(o_ptr.dtype.element_ty),
             mask=(offs_m < SQ)[:, None] & dv_ok[None, :])'''
        if split:
            bases += '''
    if BLOCK_D2 > 0:                     # the head dims' second parts (0: none, decided at compile time)
        offs_d2 = BLOCK_D + tl.arange(0, BLOCK_D2)
        d2_ok = offs_d2 < D
        q2 = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d2[None, :] * stride_qd,
                     mask=(offs_m < SQ)[:, None] & d2_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D2]
    if BLOCK_DV2 > 0:
        offs_dv2 = BLOCK_DV + tl.arange(0, BLOCK_DV2)
        dv2_ok = offs_dv2 < DV'''
            store += '''
    if BLOCK_DV2 > 0:
        tl.store(o_base + offs_m[:, None] * (H * DV) + offs_dv2[None, :], o2.to(o_ptr.dtype.element_ty),
                 mask=(offs_m < SQ)[:, None] & dv2_ok[None, :])'''
    acc2 = ("\n    if BLOCK_DV2 > 0:\n        acc2 = tl.zeros([BLOCK_M, BLOCK_DV2], dtype=tl.float32)   # o's dims BLOCK_DV on"
            if split else "")
    return f'''@triton.jit
def {name}({args}):
    """Program (query block, batch * H + head): o[rows] = softmax(q k^T * scale) v over the key
    blocks of BLOCK_N, online softmax in fp32; qk_scale = {scale_note}."""
    {pid}
    bh = tl.program_id(1)
    {index}
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)               # [BLOCK_M] query positions
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)                               # v's and o's head dim
    {bases}{m_base}
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)     # running max
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                    # running sum of p
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32){acc2}
{C.indent(bounds, 4)}
{C.indent(loops, 4)}
    {finish}
    {store}
'''




def _mask_prep(p, mask) -> str:
    """kernel_fn's lines that check the runtime mask and view it as [B, H, SQ, SK]: broadcast
    dims expanded to stride 0 (never a copy), a bool mask viewed as uint8; ``fill`` the value
    a hidden score takes, in the kernel's score units (base 2 with exp2)."""
    kind, fill = mask["kind"], mask.get("fill")
    want = ("mask.is_floating_point()" if kind == "bias" else "mask.dtype == torch.bool")
    what = "a float bias" if kind == "bias" else "a bool mask"
    lines = f'''if not {want}:
        raise ValueError(f"the mask must be {what}, got {{mask.dtype}}")
    if mask.dim() > 4:
        raise ValueError(f"a mask of rank {{mask.dim()}}: it broadcasts to [B, H, Sq, Sk]")
    mk = mask
    while mk.dim() < 4:
        mk = mk.unsqueeze(0)
    mk = mk.expand(B, H, SQ, SK)        # broadcast dims read with stride 0: no [B, H, Sq, Sk] copy
    '''
    if kind == "bias":
        return lines + '''fill = 0.0                          # (bool masks only)
    '''
    lines += f'''mk = mk.view(torch.uint8)           # bool as bytes: 1 = True
    fill = {"float('-inf')" if fill is None else repr(float(fill))}   # what a hidden score becomes
    '''
    if p["use_exp2"]:
        lines += '''if fill != float("-inf"):    # base-2 scores; a finite fill stays finite in fp32
        fill = max(fill * 1.4426950408889634, -3.4028234663852886e38)
    '''
    return lines


_MASK_LAUNCH = ("mk, fill, mk.stride(0), mk.stride(1), mk.stride(2), mk.stride(3),\n"
                "                    ")


def _launcher(p, mask=None, fold: bool = False, ws: bool = False) -> str:
    scale = "scale * 1.4426950408889634   # log2(e): exp2 of base-2 scores" if p["use_exp2"] else "scale"
    tma = p["loads"] in ("tma", "ws")
    split = bool(p.get("split_d"))
    margs = _MASK_LAUNCH if mask else ""
    widths = "BLOCK_D=bd, BLOCK_DV=bdv, BLOCK_D2=bd2, BLOCK_DV2=bdv2," if split else "BLOCK_D=bd, BLOCK_DV=bdv,"
    parts = ""
    if split:    # the second parts' descriptors: views from dims bd and bdv on (16-byte aligned);
        # a part of width 0 passes the first part's descriptor, which the kernel never reads
        parts = ("\n        descs += [TensorDescriptor.from_tensor(t[..., w:], blk) if blk[-1] else descs[i]"
                 "\n                  for i, (t, w, blk) in enumerate(((q, bd, [1, 1, bm, bd2]), (k, bd, [1, 1, bn, bd2]),"
                 "\n                                                   (v, bdv, [1, 1, bn, bdv2]), (o, bdv, [1, 1, bm, bdv2])))]")
    # the scale folds into the exponent only where it is positive (max(c * s) = c * max(s))
    fold_arg = " FOLD=qk_scale > 0," if fold else ""
    if tma:
        launch = f'''if tma:
        descs = [TensorDescriptor.from_tensor(t, blk) for t, blk in
                 ((q, [1, 1, bm, bd]), (k, [1, 1, bn, bd]), (v, [1, 1, bn, bdv]), (o, [1, 1, bm, bdv]))]{parts}
        _attn_fwd_tma[grid](*descs, qk_scale, H, H // Hkv, SQ, SK, {margs}BLOCK_M=bm, BLOCK_N=bn,
                            {widths} CAUSAL=bool(causal), IEEE=ieee, DOT_FP32=dot_fp32,{fold_arg}
                            num_warps=NUM_WARPS, num_stages=stages)
        return o
    # no TMA on this GPU, or rows a descriptor cannot address: the pointer path
    '''
    else:
        launch = ""
    # tiles through descriptors where the GPU and the operands' rows allow (decided before the
    # tile is fitted: the two kernels keep different tiles in shared memory)
    pick = ("tma = _has_tma(q.device) and all(_rows_ok(t) for t in (q, k, v, o))\n    "
            if tma else "tma = False\n    ")
    # the operands' addresses are the one thing a plan depends on beyond shapes and strides
    aligned = ("all(t.data_ptr() % 16 == 0 for t in (q, k, v, o))" if tma else "False")
    fit = "q.element_size(), _smem_budget(q.device), bdv=bdv + bdv2)"
    if p["fp32_dot"] == "tf32x3":
        # fp32 tiles as three TF32 products: the pointer kernel keeps the q tile twice in shared
        # memory (compiled for sm_90: 2*bm*bd + stages*2*bn*bd fp32 elements at all 72 tiles
        # tried, Triton 3.9; 262,144 bytes at the two the H200 refused, Triton 3.6, where the
        # one-copy count said 204,800 and 229,376); the TMA kernel stays within one copy's count
        pick += ("q_tiles = 2 if q.dtype == torch.float32" + (" and not tma" if tma else "")
                 + " else 1\n    ")
        fit = "q.element_size(), _smem_budget(q.device), q_tiles, bdv=bdv + bdv2)"
    prep = ""
    if mask:
        # the mask's [BLOCK_M, BLOCK_N] tile (a float bias upcast to fp32) is one more score tile
        fit = fit[:-1] + ", mask_tiles=1)"
        prep = _mask_prep(p, mask)
    sig = "q, k, v, causal, scale, mask" if mask else "q, k, v, causal, scale"
    ws_pick = ws_launch = ""
    ws_tile = "None"
    if ws:    # Hopper's warp-specialized kernel where it applies (_ws_tile), worked out once
        ws_pick = ("ws = None\n    if tma and not dot_fp32 and _has_wgmma(q.device):\n"
                   "        ws = _ws_tile(D, DV, BLOCK_N, NUM_STAGES, q.element_size(), _smem_budget(q.device))\n    ")
        ws_tile = "ws"
        # the Gluon kernel's softmax is in base 2 whatever use_exp2 says of the Triton kernels'
        ws_scale = "qk_scale" if p["use_exp2"] else "qk_scale * 1.4426950408889634"
        ws_launch = ("    if ws is not None and qk_scale > 0:     # the scale rides in exp2's argument\n"
                     f"        return _ws_launch(q, k, v, o, {ws_scale}, causal, ws)\n")
    if split:    # each head dim in two power-of-2 parts where that pads less (192: 128 + 64)
        dims = "(bd, bd2), (bdv, bdv2) = _split_dim(D), _split_dim(DV)   # each head dim in two parts"
    else:        # one power-of-2 tile each, zeros past D (192 pads to 256)
        dims = "bd, bdv, bd2, bdv2 = max(16, _pow2(D)), max(16, _pow2(DV)), 0, 0"
    mdoc = ""
    if mask:
        mdoc = {"bias": "\n    mask: a float bias added to the scaled scores (in fp32)",
                "keep": "\n    mask: bool, True keeps a key",
                "hide": "\n    mask: bool, True hides a key"}[mask["kind"]] + \
            ", of any shape that broadcasts to [B, H, Sq, Sk]."
    return f'''

_PLANS = {{}}


def _plan(q, k, v, o):
    """How kernel_fn runs operands of these shapes, strides, dtype and alignment, worked out
    once: the checks, the kernel (descriptors or pointers), the tile fitted to the device's
    shared memory, the grid. A launch-bound model calls the kernel once a layer: its host work
    is then a dict lookup, the output's allocation, the descriptors and the launch."""
    B, H, SQ, D = q.shape
    Hkv, SK, DV = k.shape[1], k.shape[2], v.shape[3]
    if k.shape[0] != B or v.shape[0] != B or v.shape[1] != Hkv or v.shape[2] != SK:
        raise ValueError(f"k {{list(k.shape)}} / v {{list(v.shape)}} do not match q {{list(q.shape)}}")
    if k.shape[3] != D:
        raise ValueError("q and k must share the head dimension")
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"query heads ({{H}}) must be a multiple of key/value heads ({{Hkv}})")
    if max(D, DV) > MAX_HEAD_DIM:
        raise ValueError(f"head dimension {{max(D, DV)}} > {{MAX_HEAD_DIM}} is not supported")
    if B == 0 or H == 0 or SQ == 0 or D == 0 or DV == 0:
        return None
    # the interpreter's tl.dot cannot multiply bf16 tiles (numpy has none): upcast them there
    dot_fp32 = q.dtype == torch.bfloat16 and q.device.type == "cpu"
    ieee = q.dtype == torch.float32 or dot_fp32
    {dims}
    {pick}bm, bn, stages = _fit_attn(BLOCK_M, BLOCK_N, bd + bd2, NUM_STAGES, NUM_WARPS, SQ, SK,
                               {fit}
    {ws_pick}return (Hkv, SK, DV, dot_fp32, ieee, bd, bdv, bd2, bdv2, tma, bm, bn, stages, (_cdiv(SQ, bm), B * H),
            {ws_tile})


def kernel_fn({sig}):
    """Attention of q [B, H, Sq, D] over k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] (H % Hkv == 0,
    query head h reads head h // (H // Hkv); Dv is D but where v's head dim is its own, as in
    multi-head latent attention); causal hides key j > i; scale None means 1/sqrt(D). Returns
    o [B, H, Sq, Dv] in q's dtype, a transposed view of a contiguous [B, Sq, H, Dv]. Any
    strides.{mdoc}"""
    B, H, SQ, D = q.shape
    # o [B, SQ, H, Dv] in memory, returned as its [B, H, SQ, Dv] view: SDPA's layout, which the
    # model's transpose(1, 2) and reshape before the output projection read without a copy
    o = torch.empty((B, SQ, H, v.shape[3]), dtype=q.dtype, device=q.device).transpose(1, 2)
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, q.device,
           {aligned})
    plan = _PLANS.get(key, False)
    if plan is False:
        if len(_PLANS) > 1024:         # a bound on a long-lived process's cache
            _PLANS.clear()
        plan = _PLANS[key] = _plan(q, k, v, o)
    if plan is None:                   # an empty problem
        return o
    Hkv, SK, DV, dot_fp32, ieee, bd, bdv, bd2, bdv2, tma, bm, bn, stages, grid, ws = plan
    if scale is None:
        scale = 1.0 / D ** 0.5
    scale = float(scale)
    qk_scale = {scale}
{ws_launch}    {prep}{launch}_attn_fwd[grid](q, k, v, o, qk_scale, H, H // Hkv, SQ, SK, D, DV,
                    q.stride(0), q.stride(1), q.stride(2), q.stride(3),
                    k.stride(0), k.stride(1), k.stride(2), k.stride(3),
                    v.stride(0), v.stride(1), v.stride(2), v.stride(3),
                    {margs}BLOCK_M=bm, BLOCK_N=bn, {widths} CAUSAL=bool(causal), IEEE=ieee,
                    DOT_FP32=dot_fp32,{fold_arg} num_warps=NUM_WARPS, num_stages=stages)
    return o
'''


# ---------------------------------------------------------------------------------------------
# loads "ws": Hopper's warp-specialized kernel, written in Gluon
# ---------------------------------------------------------------------------------------------
# FlashAttention-3's schedule, which Triton's own warp specialization does not build for this
# loop (the warp_specialize axis: 0.83x SDPA, no faster than without it): a program takes 128
# query rows as two consumer warp groups of 64 rows, and a loader warp. The loader fills a ring
# of K/V tiles through TMA, or a K ring and a V ring (mbarriers: a slot is ready when its bytes
# land, empty when both groups have released it). The two groups take turns on the tensor cores (a "turn" mbarrier
# each): one issues q @ k_j^T and p_{j-1} @ v_{j-1} (async wgmma) and hands the turn over, then
# runs block j's softmax while the other group's dots run; inside a group the softmax of block j
# also runs under its own p_{j-1} @ v_{j-1}. Registers: the loader gives back down to 24 a
# thread, each consumer group gets 240 (setmaxnreg). bf16/fp16 with q, k and v's head dims
# equal and 64, 128 or 256, a positive scale (it rides in exp2's argument: fold_scale), no
# runtime mask or cap; Hopper (sm_90) only: elsewhere, and for anything else, the Triton TMA
# kernel above runs. A group gives q back after its tile's last q k^T (the loader brings the
# next tile's q under this tile's end) and sends o out by TMA through its half of the last K
# tile (registers where a K tile has 64 rows). Timed at 4 x 32 x 4096 x 128, GQA 8, bf16,
# causal (docs/benchmarks.md): H200 1.087x SDPA by do_bench (persistent grid) and 1.03x
# torch.compile and eager by the loop's own timing; H100 1.045x and 1.04x. The interpreter
# cannot run Gluon: on the CPU the TMA kernel computes. Where one shared K/V ring would hold
# only 2 blocks (head dim 256: 64 keys, 64 KB a block), K and V get rings of their own (SPLIT):
# a K block is free once its scores are read, a V block once its p @ v is done, so 3 K and 2 V
# keep the loader a block ahead where the shared ring of 2 left it none (H100: 0.89-0.96x SDPA
# against 0.70-0.74x). Shared memory at head dim 128: 2 q tiles [64, 128], 3 K and 3 V tiles [128, 128],
# 224 KB; each program moves q once, its keys and values once per 128 query rows (L2 mostly),
# and o once.
_WS_SRC = f'''
import heapq

try:     # Gluon (Triton >= 3.5): warp groups, mbarriers, TMA and async wgmma written out
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        tma as gtma, mbarrier, fence_async_shared, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    _GLUON = True
except Exception:
    _GLUON = False
try:     # the TMA copies' names: async_load / async_store from Triton 3.7 on (3.9 removed the
    _NEW_TMA = _GLUON and gtma.async_load is not None    # old ones; 3.6 has only those)
except Exception:
    _NEW_TMA = False

WS_ROWS = 64                  # query rows per consumer warp group (wgmma's M for one group)
WS_HEAD_DIMS = {WS_HEAD_DIMS!r}
WS_GROUPS = 2                 # consumer warp groups a program at head dim 64 (2 at 128 and 256)
# 3 groups, 192-row tiles, is FlashAttention-3's layout at head dim 64 (softmax-bound with two:
# two groups' dots run under each softmax). Timed on an H100 at 160 registers a consumer
# (docs/sweeps/h100_ws_rings.json) it ran 0.59x SDPA at 4 x 32 x 4096 x 64 against 0.91-0.94x with
# two groups (0.44x against 0.84x at GPT-2's 8 x 12 x 1024), so no point renders it; a sweep sets
# WS_GROUPS = 3 (GROUPS3=1). Registers a consumer thread, by groups: scores 64x128 fp32 (64 a
# thread), o 64xD fp32 (64 at D = 128), p as the dot's registers (32). The launch rounds the warps
# up to whole warp groups (4 + 4 + 1 -> 12, 4 + 4 + 4 + 1 -> 16), and warps x 32 x maxnreg must
# fit 65,536 registers (so 128 with three groups); then 2 x 128 x 240 + 128 x 24 and
# 3 x 128 x 152 + 128 x 24 fit. ptxas honours both numbers, read from the sm_90 code's stack
# (Triton 3.6): two groups compile spill-free at the causal points only at 240 / 168 (232 or 160
# spill); three groups spill 208 bytes at 160 / 128 (what was timed), 16 at 152, 72 at 144, so
# 152 is what the next sweep times. Triton 3.9's compiler spills 8-128 bytes even at 240 / 168:
# the key-column indices the mask compares, reloaded in masked blocks only (not timed: the GPU
# has 3.6).
WS_CONSUMER_REGS = {{2: 240, 3: 152}}
WS_MAXNREG = {{2: 168, 3: 128}}
WS_PERSISTENT = {{ws_persistent}}         # one program an SM walking tiles (else one program a tile)
WS_TILE_COST = 2              # a tile's start and end, in key blocks, for the persistent schedule
WS_DEALT = {{ws_dealt}}             # tiles dealt to the least-loaded program (else program p: p, p + P, ...)
_WGMMA = {{}}
_WS_ORDER = {{}}
_WS_LAYOUTS = {{}}
_SMS = {{}}


def _ws_programs(device):
    """Programs of the persistent grid: one per SM (one fits an SM: 229 KB of shared memory at
    head dim 128), read once per device."""
    if device.index not in _SMS:
        _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device.index]


def _has_wgmma(device):
    """Hopper (sm_90) has wgmma; Blackwell and others run the Triton TMA kernel."""
    if not _GLUON or device.type != "cuda" or torch.version.hip is not None:
        return False
    if device.index not in _WGMMA:
        _WGMMA[device.index] = torch.cuda.get_device_capability(device)[0] == 9
    return _WGMMA[device.index]


def _ws_groups(d):
    """Consumer warp groups at head dim d: WS_GROUPS at 64; 2 above (a third group's o
    accumulator would not fit its registers)."""
    return WS_GROUPS if d <= 64 else 2


def _ws_tile(d, dv, bn, stages, itemsize, budget):
    """(key step, K ring depth, V ring depth, split) of the warp-specialized kernel, or None
    where it does not apply: head dims equal and in WS_HEAD_DIMS, 2-byte operands, the q tiles
    [64, d] and the K and V tiles [bn, d] within shared memory. Key step 128, else 64. One ring
    of ``stages`` K/V slots (fewer where they do not fit) while it keeps 3: the loader is then
    a block ahead. Where only 2 fit (head dim 256: 64-key blocks), K and V get rings of their
    own (split): a K block frees once its scores are read, so 3 K and 2 V (224 KB) keep the
    loader ahead (H100: 0.89-0.96x SDPA against 0.70-0.74x with one ring of 2)."""
    if d != dv or d not in WS_HEAD_DIMS or itemsize != 2:
        return None
    bn = 128 if bn >= 128 else 64

    def smem(n, k, v):
        return (_ws_groups(d) * WS_ROWS * d + (k + v) * n * d) * itemsize + 1024   # + mbarriers, alignment

    while bn > 64 and smem(bn, 2, 2) > budget:
        bn //= 2
    s = max(2, stages)
    while s > 2 and smem(bn, s, s) > budget:
        s -= 1
    if s >= 3:
        return (bn, s, s, False)
    for nk, nv in ((3, 2), (2, 2)):
        if smem(bn, nk, nv) <= budget:
            return (bn, nk, nv, True)
    return None


def _ws_schedule(n_bh, n_m, SK, bn, causal, device, rows=2 * WS_ROWS):
    """The persistent grid's tiles, program by program: [starts (programs + 1) | tiles], int32
    on ``device``, cached per shape. Tiles are dealt in index order (a head's tiles together,
    heaviest first) each to the program whose work so far (key blocks, plus WS_TILE_COST for a
    tile's start and end) is least: the GPU's own scheduler, simulated, so the programs running
    at once share a few heads' K/V in L2 as with one program a tile, and the grid ends level
    (a fixed stride walk gave some programs 9% more blocks at 4 x 32 x 4096, causal)."""
    key = (n_bh, n_m, SK, bn, bool(causal), device, WS_DEALT, rows)
    if key not in _WS_ORDER:
        if len(_WS_ORDER) > 256:            # a bound on a long-lived process's cache
            _WS_ORDER.clear()
        n_tiles = n_bh * n_m
        programs = min(n_tiles, _ws_programs(device))
        blocks = [(min(SK, (n_m - u) * rows) if causal else SK) for u in range(n_m)]
        blocks = [-(-b // bn) + WS_TILE_COST for b in blocks]      # tile u of a head (row0 descending)
        work = [(0, p) for p in range(programs)]       # a heap: (key blocks so far, program)
        mine = [[] for _ in range(programs)]
        for t in range(n_tiles):
            if WS_DEALT:                                # the least loaded, the lowest on ties
                w, p = work[0]
                heapq.heapreplace(work, (w + blocks[t % n_m], p))
            else:
                p = t % programs
            mine[p].append(t)
        starts = [0]
        for m in mine:
            starts.append(starts[-1] + len(m))
        flat = starts + [t for m in mine for t in m]
        _WS_ORDER[key] = (programs, torch.tensor(flat, dtype=torch.int32, device=device))
    return _WS_ORDER[key]


def _ws_launch(q, k, v, o, qk_scale, causal, tile):
    """o = attention(q, k, v) by the warp-specialized kernel: 4-D descriptors (any strides a
    descriptor takes; rows past Sq and Sk read as zeros); o ([B, H, Sq, D], contiguous) stored
    by TMA through the last K tile, clipped at Sq (from registers, masked, where a K tile is too
    short for every group's rows)."""
    bn, nk, nv, split = tile
    B, H, SQ, D = q.shape
    key = (q.dtype, D, bn)
    if key not in _WS_LAYOUTS:
        gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
        _WS_LAYOUTS[key] = (gl.NVMMASharedLayout.get_default_for([1, 1, WS_ROWS, D], gdt),
                            gl.NVMMASharedLayout.get_default_for([1, 1, bn, D], gdt))
    lq, lk = _WS_LAYOUTS[key]
    qd = GluonDescriptor.from_tensor(q, [1, 1, WS_ROWS, D], lq)
    kd = GluonDescriptor.from_tensor(k, [1, 1, bn, D], lk)
    vd = GluonDescriptor.from_tensor(v, [1, 1, bn, D], lk)
    od = GluonDescriptor.from_tensor(o, [1, 1, WS_ROWS, D], lq)
    ng = _ws_groups(D)
    n_m = _cdiv(SQ, ng * WS_ROWS)
    if WS_PERSISTENT:
        programs, sched = _ws_schedule(B * H, n_m, k.shape[2], bn, causal, q.device, ng * WS_ROWS)
    else:
        programs, sched = B * H * n_m, o        # one program a tile: the table is not read
    _attn_fwd_ws[(programs,)](qd, kd, vd, od, o, sched, qk_scale, H, H // k.shape[1], SQ, k.shape[2],
                              n_m, BLOCK_N=bn, NUM_K=nk, NUM_V=nv, SPLIT=split, CAUSAL=bool(causal),
                              PERSISTENT=WS_PERSISTENT, NG=ng,
                              CONSUMER_REGS=WS_CONSUMER_REGS[ng], num_warps=4,
                              maxnreg=WS_MAXNREG[ng])
    return o


if _NEW_TMA:
    @gluon.jit
    def _tma_in(desc, coord, bar, dst):
        gtma.async_load(desc, coord, bar, dst)

    @gluon.jit
    def _tma_out(desc, coord, src):
        gtma.async_store(desc, coord, src)
elif _GLUON:
    @gluon.jit
    def _tma_in(desc, coord, bar, dst):
        gtma.async_copy_global_to_shared(desc, coord, bar, dst)

    @gluon.jit
    def _tma_out(desc, coord, src):
        gtma.async_copy_shared_to_global(desc, coord, src)

if _GLUON:
    _WS_M = gl.constexpr(WS_ROWS)      # the rows constant inside the kernels

    @gluon.jit
    def _ws_softmax(s, m_i, l_i, qk_scale, offs_m, kn, SK, MASK: gl.constexpr, CAUSAL: gl.constexpr):
        """One key block's online-softmax step on raw scores s [64, BLOCK_N] (fp32): the scale
        rides in exp2's argument (qk_scale = log2(e) * scale > 0); MASK hides keys past SK and,
        causal, future keys."""
        if MASK:
            visible = (kn < SK)[None, :]
            if CAUSAL:
                visible = visible & (offs_m[:, None] >= kn[None, :])
            s = gl.where(visible, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _ws_tile_of(t, n_m, SK, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, NG: gl.constexpr):
        """Tile t -> (batch * H + head, first query row, key blocks it visits). A head's query
        tiles (NG * 64 rows each) are consecutive, heaviest first, so the programs running at
        once share a few heads' keys and values in L2."""
        bh = t // n_m
        row0 = (n_m - 1 - t % n_m) * (NG * _WS_M)
        if CAUSAL:
            n_total = (gl.minimum(SK, row0 + NG * _WS_M) + BLOCK_N - 1) // BLOCK_N
        else:
            n_total = (SK + BLOCK_N - 1) // BLOCK_N
        return bh, row0, n_total

    @gluon.jit
    def _ws_tiles(sched, PERSISTENT: gl.constexpr):
        """This program's range of entries in the schedule: its tiles (persistent), or the one
        tile it is (one program a tile)."""
        pid = gl.program_id(0)
        if PERSISTENT:
            lo = gl.load(sched + pid)
            hi = gl.load(sched + pid + 1)
        else:
            lo = pid
            hi = pid + 1
        return lo, hi

    @gluon.jit
    def _ws_tile_at(sched, i, PERSISTENT: gl.constexpr):
        if PERSISTENT:
            t = gl.load(sched + gl.num_programs(0) + 1 + i)
        else:
            t = i
        return t

    @gluon.jit
    def _ws_loader(descs, bufs, bars, dims, BLOCK_N: gl.constexpr, NUM_K: gl.constexpr,
                   NUM_V: gl.constexpr, SPLIT: gl.constexpr, CAUSAL: gl.constexpr,
                   PERSISTENT: gl.constexpr, NG: gl.constexpr):
        """The loader warp, tile after tile. SPLIT: K block g (blocks so far) into K slot g % NUM_K
        once every group has read it for the last time (its q k^T done), V block g into V slot
        g % NUM_V once every group's p @ v on what was there is done; K one block ahead of V
        (both are needed together: q k_j^T goes out with p_(j-1) v_(j-1)). Else K and V block g
        share slot g % NUM_K and its barriers (k_ready, k_empty). The tile's NG q parts once
        every group has issued the last tile's last q k^T (q_empty), after the tile's first K
        block: so the next tile's q and first blocks load under this tile's end."""
        q_desc, k_desc, v_desc, o_desc = descs
        q_smem, k_smem, v_smem = bufs
        q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
        sched, qk_scale, H, GROUP, SQ, SK, n_m = dims
        k_bytes: gl.constexpr = k_desc.block_type.nbytes
        v_bytes: gl.constexpr = v_desc.block_type.nbytes
        it = 0
        tc = 0
        lo, hi = _ws_tiles(sched, PERSISTENT)
        for i in range(lo, hi):
            bh, row0, n_total = _ws_tile_of(_ws_tile_at(sched, i, PERSISTENT), n_m, SK, BLOCK_N, CAUSAL, NG)
            b = bh // H
            h = bh % H
            hk = h // GROUP                                        # the key/value head (GQA)
            if SPLIT:
                _ws_load_block(k_desc, k_smem, k_ready, k_empty, it, [b, hk, 0, 0], k_bytes, NUM_K)
            else:
                _ws_load_kv(descs, bufs, k_ready, k_empty, it, [b, hk, 0, 0], k_bytes + v_bytes, NUM_K)
            mbarrier.wait(q_empty, (tc & 1) ^ 1)
            mbarrier.expect(q_ready, NG * q_desc.block_type.nbytes)
            for g in gl.static_range(NG):
                _tma_in(q_desc, [b, h, row0 + g * _WS_M, 0], q_ready, q_smem.index(g))
            for j in range(1, n_total):
                if SPLIT:
                    _ws_load_block(k_desc, k_smem, k_ready, k_empty, it + j, [b, hk, j * BLOCK_N, 0], k_bytes, NUM_K)
                    _ws_load_block(v_desc, v_smem, v_ready, v_empty, it + j - 1, [b, hk, (j - 1) * BLOCK_N, 0],
                                   v_bytes, NUM_V)
                else:
                    _ws_load_kv(descs, bufs, k_ready, k_empty, it + j, [b, hk, j * BLOCK_N, 0], k_bytes + v_bytes, NUM_K)
            if SPLIT:
                _ws_load_block(v_desc, v_smem, v_ready, v_empty, it + n_total - 1,
                               [b, hk, (n_total - 1) * BLOCK_N, 0], v_bytes, NUM_V)
            it += n_total
            tc += 1

    @gluon.jit
    def _ws_load_block(desc, ring, ready, empty, g, coord, nbytes: gl.constexpr, NUM: gl.constexpr):
        """Block g (of this program's blocks so far) into slot g % NUM of its ring, once the slot's
        last use is released (empty's phase of the round before)."""
        st = g % NUM
        mbarrier.wait(empty.index(st), ((g // NUM) & 1) ^ 1)
        mbarrier.expect(ready.index(st), nbytes)
        _tma_in(desc, coord, ready.index(st), ring.index(st))

    @gluon.jit
    def _ws_load_kv(descs, bufs, ready, empty, g, coord, nbytes: gl.constexpr, NUM: gl.constexpr):
        """K and V block g together into slot g % NUM of one ring (SPLIT off), once every group's
        p @ v on what was there is done."""
        st = g % NUM
        mbarrier.wait(empty.index(st), ((g // NUM) & 1) ^ 1)
        mbarrier.expect(ready.index(st), nbytes)
        _tma_in(descs[1], coord, ready.index(st), bufs[1].index(st))
        _tma_in(descs[2], coord, ready.index(st), bufs[2].index(st))

    @gluon.jit
    def _ws_consumer(descs, bufs, bars, dims, o_ptr, BLOCK_N: gl.constexpr, NUM_K: gl.constexpr,
                     NUM_V: gl.constexpr, SPLIT: gl.constexpr, CAUSAL: gl.constexpr,
                     PERSISTENT: gl.constexpr, NG: gl.constexpr, G: gl.constexpr):
        """Consumer warp group G (0 .. NG - 1): query rows row0 + 64 G .. + 63 of each tile.
        The groups take the tensor cores in turn, G after G - 1 (group 0 after the last). SPLIT:
        a K block is released once its scores are read, a V block once its p @ v is done; else
        a K/V slot once its p @ v is done. A tile's last K block is released after o has gone
        out through it."""
        q_desc, k_desc, v_desc, o_desc = descs
        q_smem, k_smem, v_smem = bufs
        q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
        sched, qk_scale, H, GROUP, SQ, SK, n_m = dims
        dtype: gl.constexpr = q_desc.dtype
        D: gl.constexpr = q_desc.block_type.shape[3]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        q_s = q_smem.index(G).reshape([_WS_M, D])
        my_turn = turn.index(G)
        other = turn.index((G + 1) % NG)                           # the group whose turn is next
        if G == NG - 1:
            mbarrier.arrive(turn.index(0), count=1)                # group 0 goes first
        offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s_zero = gl.zeros([_WS_M, BLOCK_N], gl.float32, layout=s_layout)
        o_rows = gl.arange(0, _WS_M, layout=row_o)
        o_cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        it = 0                      # K/V blocks consumed so far: ring slots and phases
        turns = 0                   # turns taken so far: the turn barrier's phase
        tc = 0
        lo, hi = _ws_tiles(sched, PERSISTENT)
        for i in range(lo, hi):
            bh, row0, n_total = _ws_tile_of(_ws_tile_at(sched, i, PERSISTENT), n_m, SK, BLOCK_N, CAUSAL, NG)
            row0 = row0 + G * _WS_M
            if CAUSAL:              # blocks every row of the group sees whole: no mask there
                n_full = gl.minimum(SK // BLOCK_N, (row0 + 1) // BLOCK_N)
            else:
                n_full = SK // BLOCK_N
            offs_m = row0 + gl.arange(0, _WS_M, layout=row_s)
            m_i = gl.full([_WS_M], float("-inf"), gl.float32, layout=row_s)
            l_i = gl.zeros([_WS_M], gl.float32, layout=row_s)
            acc = gl.zeros([_WS_M, D], gl.float32, layout=o_layout)
            mbarrier.wait(q_ready, tc & 1)

            # block 0: its scores alone (key 0 is visible to every row: no row stays at -inf)
            sk = it % NUM_K
            mbarrier.wait(k_ready.index(sk), (it // NUM_K) & 1)
            mbarrier.wait(my_turn, turns & 1)
            s_tok = warpgroup_mma(q_s, k_smem.index(sk).reshape([BLOCK_N, D]).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
            mbarrier.arrive(other, count=1)
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
            if n_total == 1:
                mbarrier.arrive(q_empty, count=1)                  # q read for the last time
            elif SPLIT:
                mbarrier.arrive(k_empty.index(sk), count=1)
            if n_full > 0:
                p, alpha, m_i, l_i = _ws_softmax(s, m_i, l_i, qk_scale, offs_m, offs_n, SK, False, CAUSAL)
            else:
                p, alpha, m_i, l_i = _ws_softmax(s, m_i, l_i, qk_scale, offs_m, offs_n, SK, True, CAUSAL)

            for j in range(1, n_total):
                sk = (it + j) % NUM_K
                sv = (it + j - 1) % NUM_V                          # p_(j-1) @ v_(j-1)
                mbarrier.wait(k_ready.index(sk), ((it + j) // NUM_K) & 1)
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                pd = gl.convert_layout(p.to(dtype), p_layout)      # p rounded to v's dtype
                if SPLIT:
                    mbarrier.wait(v_ready.index(sv), ((it + j - 1) // NUM_V) & 1)
                mbarrier.wait(my_turn, (turns + j) & 1)
                s_tok = warpgroup_mma(q_s, k_smem.index(sk).reshape([BLOCK_N, D]).permute((1, 0)), s_zero,
                                      use_acc=False, is_async=True)
                acc_tok = warpgroup_mma(pd, v_smem.index(sv).reshape([BLOCK_N, D]), acc, is_async=True)
                mbarrier.arrive(other, count=1)                    # the other group's dots next
                s = warpgroup_mma_wait(1, deps=(s_tok, ))          # the scores; p @ v still runs
                if j == n_total - 1:
                    mbarrier.arrive(q_empty, count=1)              # the loader may bring the next q
                elif SPLIT:
                    mbarrier.arrive(k_empty.index(sk), count=1)    # (the last K block holds o)
                if j >= n_full:
                    p, alpha, m_i, l_i = _ws_softmax(s, m_i, l_i, qk_scale, offs_m, j * BLOCK_N + offs_n, SK, True, CAUSAL)
                else:
                    p, alpha, m_i, l_i = _ws_softmax(s, m_i, l_i, qk_scale, offs_m, j * BLOCK_N + offs_n, SK, False, CAUSAL)
                acc, pd = warpgroup_mma_wait(0, deps=(acc_tok, pd))
                if SPLIT:
                    mbarrier.arrive(v_empty.index(sv), count=1)
                else:                                              # K and V block j - 1 at once
                    mbarrier.arrive(k_empty.index(sv), count=1)

            last = it + n_total - 1
            sk = last % NUM_K
            sv = last % NUM_V
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            pd = gl.convert_layout(p.to(dtype), p_layout)
            if SPLIT:
                mbarrier.wait(v_ready.index(sv), (last // NUM_V) & 1)
            mbarrier.wait(my_turn, (turns + n_total) & 1)
            acc_tok = warpgroup_mma(pd, v_smem.index(sv).reshape([BLOCK_N, D]), acc, is_async=True)
            mbarrier.arrive(other, count=1)
            acc, pd = warpgroup_mma_wait(0, deps=(acc_tok, pd))
            if SPLIT:
                mbarrier.arrive(v_empty.index(sv), count=1)
            o = (acc / gl.convert_layout(l_i, row_o)[:, None]).to(dtype)
            if BLOCK_N >= NG * _WS_M:
                # o out through TMA from this group's rows of the last K tile (q's buffer already
                # holds the next tile's q): free once every group read q for the last time
                mbarrier.wait(q_empty, tc & 1)
                o_s = k_smem.index(sk).slice(G * _WS_M, _WS_M, dim=2)       # [1, 1, 64, D]
                o_s.store(o.reshape([1, 1, _WS_M, D]))
                fence_async_shared()
                _tma_out(o_desc, [bh // H, bh % H, row0, 0], o_s)
                gtma.store_wait(pendings=0)
            else:   # a K tile too short for every group's o: from registers, rows past SQ dropped
                rows = row0 + o_rows                  # o [B, SQ, H, D] in memory
                offs = (((bh // H).to(gl.int64) * SQ + rows) * H + bh % H)[:, None] * D + o_cols[None, :]
                gl.store(o_ptr + offs, o, mask=(rows < SQ)[:, None])
            mbarrier.arrive(k_empty.index(sk), count=1)   # (SPLIT off: V's too)
            it += n_total
            turns += n_total + 1
            tc += 1

    @gluon.jit
    def _ws_consumer1(descs, bufs, bars, dims, o_ptr, BLOCK_N: gl.constexpr, NUM_K: gl.constexpr,
                      NUM_V: gl.constexpr, SPLIT: gl.constexpr, CAUSAL: gl.constexpr,
                      PERSISTENT: gl.constexpr, NG: gl.constexpr):
        _ws_consumer(descs, bufs, bars, dims, o_ptr, BLOCK_N, NUM_K, NUM_V, SPLIT, CAUSAL, PERSISTENT, NG, 1)

    @gluon.jit
    def _ws_consumer2(descs, bufs, bars, dims, o_ptr, BLOCK_N: gl.constexpr, NUM_K: gl.constexpr,
                      NUM_V: gl.constexpr, SPLIT: gl.constexpr, CAUSAL: gl.constexpr,
                      PERSISTENT: gl.constexpr, NG: gl.constexpr):
        _ws_consumer(descs, bufs, bars, dims, o_ptr, BLOCK_N, NUM_K, NUM_V, SPLIT, CAUSAL, PERSISTENT, NG, 2)

    @gluon.jit
    def _attn_fwd_ws(q_desc, k_desc, v_desc, o_desc, o_ptr, sched, qk_scale, H, GROUP, SQ, SK, n_m,
                     BLOCK_N: gl.constexpr, NUM_K: gl.constexpr, NUM_V: gl.constexpr,
                     SPLIT: gl.constexpr, CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr, NG: gl.constexpr,
                     CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
        """Each program takes its tiles (NG * 64 query rows of one batch * H + head each; the
        schedule's, persistent, else its own): consumer group 0 (this partition's 4 warps),
        consumer groups 1 .. NG - 1 (4 warps each) and the loader (1 warp)."""
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [NG] + q_desc.block_type.shape, q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_K] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_V] + v_desc.block_type.shape, v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [NUM_K, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [NUM_K, 1], mbarrier.MBarrierLayout())
        if SPLIT:
            v_ready = gl.allocate_shared_memory(gl.int64, [NUM_V, 1], mbarrier.MBarrierLayout())
            v_empty = gl.allocate_shared_memory(gl.int64, [NUM_V, 1], mbarrier.MBarrierLayout())
        else:                                                      # one ring: K's barriers are V's
            v_ready = k_ready
            v_empty = k_empty
        turn = gl.allocate_shared_memory(gl.int64, [NG, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        mbarrier.init(q_empty, count=NG)                          # every group is done with q
        for i in gl.static_range(NUM_K):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=NG)             # every group releases a slot
        if SPLIT:
            for i in gl.static_range(NUM_V):
                mbarrier.init(v_ready.index(i), count=1)
                mbarrier.init(v_empty.index(i), count=NG)
        for g in gl.static_range(NG):
            mbarrier.init(turn.index(g), count=1)
        descs = (q_desc, k_desc, v_desc, o_desc)
        bufs = (q_smem, k_smem, v_smem)
        bars = (q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn)
        dims = (sched, qk_scale, H, GROUP, SQ, SK, n_m)
        if NG == 3:
            gl.warp_specialize([
                (_ws_consumer, (descs, bufs, bars, dims, o_ptr, BLOCK_N, NUM_K, NUM_V, SPLIT, CAUSAL, PERSISTENT, NG, 0)),
                (_ws_consumer1, (descs, bufs, bars, dims, o_ptr, BLOCK_N, NUM_K, NUM_V, SPLIT, CAUSAL, PERSISTENT, NG)),
                (_ws_consumer2, (descs, bufs, bars, dims, o_ptr, BLOCK_N, NUM_K, NUM_V, SPLIT, CAUSAL, PERSISTENT, NG)),
                (_ws_loader, (descs, bufs, bars, dims, BLOCK_N, NUM_K, NUM_V, SPLIT, CAUSAL, PERSISTENT, NG)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
        else:
            gl.warp_specialize([
                (_ws_consumer, (descs, bufs, bars, dims, o_ptr, BLOCK_N, NUM_K, NUM_V, SPLIT, CAUSAL, PERSISTENT, NG, 0)),
                (_ws_consumer1, (descs, bufs, bars, dims, o_ptr, BLOCK_N, NUM_K, NUM_V, SPLIT, CAUSAL, PERSISTENT, NG)),
                (_ws_loader, (descs, bufs, bars, dims, BLOCK_N, NUM_K, NUM_V, SPLIT, CAUSAL, PERSISTENT, NG)),
            ], [4, 1], [CONSUMER_REGS, 24])
'''


def ws_on(p, mask=None, cap=None) -> bool:
    """Whether a point renders the warp-specialized Gluon kernel (loads "ws"): not with a runtime
    mask, a soft cap or a head dim in two parts (those take the Triton TMA kernel)."""
    return p["loads"] == "ws" and not mask and cap is None and not p.get("split_d")


def render(params, mask=None, cap=None) -> str:
    """Complete candidate source for one point of SPACE (missing params take DEFAULT values);
    ``mask`` ({"kind": "bias" | "keep" | "hide", "fill": None or a number, "safe": bool}, from
    the contract's spec) gives kernel_fn its runtime mask argument."""
    p = C.resolve(NAME, SPACE, DEFAULT, params)
    ws = ws_on(p, mask, cap)
    if not ws:                       # the grid of a kernel the point does not render: inert, so
        p["ws_grid"] = DEFAULT["ws_grid"]      # such points render the same source (one experiment)
    cb = {"mask_all": "visits every key block and masks each",
          "skip": "stops at the diagonal (causal) and masks every block it visits",
          "split": "stops at the diagonal (causal); only blocks crossing it or the sequence end "
                   "are masked"}[p["causal_blocks"]]
    loop = textwrap.fill(f"The key loop {cb}. Both dots (q @ k^T, p @ v): "
                         f"{FP32_DOT_DOC[p['fp32_dot']]}; bf16/fp16 operands multiply natively "
                         "on the tensor cores.", 96)
    doc = f'''"""Attention candidate ({p["block_m"]}x{p["block_n"]} blocks, {p["causal_blocks"]}, exp2={p["use_exp2"]}): o = softmax(scale * q k^T) v.

q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] (grouped-query: head h reads
h // (H // Hkv); Dv = D unless v's head dim is its own), any strides; o [B, H, Sq, Dv]
contiguous in q's dtype. Flash attention: online softmax over key blocks, fp32 scores
and accumulators, p rounded to v's dtype for p @ v.
{loop}
Bytes the op must move: (B*H*Sq + B*Hkv*Sk)*(D + Dv)*itemsize; q is read once, each key/value
block once per query block (from L2 mostly).
Point: {C.point_line(SPACE, p)}
"""
{C.IMPORTS_SRC}
BLOCK_M = {p["block_m"]}          # query rows per program (clamped at launch)
BLOCK_N = {p["block_n"]}          # keys per step of the key loop
NUM_WARPS = {p["num_warps"]}
NUM_STAGES = {p["num_stages"]}        # software-pipelining depth of the key loop
'''
    if mask:
        doc = doc.replace("o = softmax(scale * q k^T) v.",
                          "o = softmax(scale * q k^T + mask) v.", 1)
    if cap is not None:
        doc = doc.replace("q k^T", f"{cap:g} * tanh(q k^T * scale / {cap:g})", 1)
    parts = [doc, _HELPERS_SRC + (_SPLIT_DIM_SRC if p["split_d"] else ""), "\n", _kernel(p, mask=mask, cap=cap)]
    if p["loads"] in ("tma", "ws"):      # tiles through tensor descriptors where the GPU has TMA
        parts += ["\n", C.TMA_HELPERS_SRC, C.ROWS_OK_SRC, "\n", _kernel(p, tma=True, mask=mask, cap=cap)]
    if ws:                               # Hopper: the warp-specialized kernel first
        parts += ["\n", _WS_SRC.replace("{ws_persistent}", repr(p["ws_grid"] != "tiles"))
                  .replace("{ws_dealt}", repr(p["ws_grid"] == "persistent"))]
    return C.tidy("\n".join(parts + [_launcher(p, mask, folds(p, mask, cap), ws)]))


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
    description="Scaled dot-product attention with GQA and optional causal mask (flash style).",
    notes={"shape": "(B, H, S, D, Hkv, causal)", "max_head_dim": MAX_HEAD_DIM, "bound": "compute",
           "profiled_causal": "assumed (the profiler does not record is_causal)"},
    error_bound=error_bound,
    bound_tol=BOUND_TOL,
    size=size,
    from_profile=from_profile,
    default_for=default_for,
    openers_for=openers_for,
    space_for=space_for,
)


# ---------------------------------------------------------------------------------------------
# runtime masks: the contract with a mask argument (spec "mask")
# ---------------------------------------------------------------------------------------------
# A mask the model computes from its inputs (a padding mask from attention_mask, a position bias)
# is the kernel's sixth argument, of any shape that broadcasts to [B, H, Sq, Sk]:
#   "bias": float, in q's dtype, added to the scaled scores (in fp32 in the kernels);
#   "keep": bool, True keeps a key (SDPA's bool attn_mask, torch.where(mask, s, fill));
#   "hide": bool, True hides a key (masked_fill(mask, fill)).
# "mask_dims" says which dims the mask has: four letters, each its dim's letter of "bhqk" or
# "1" where the mask broadcasts (HF's padding mask [B, 1, 1, Sk]: "b11k"; BERT's bool mask
# [B, 1, Sq, Sk]: "b1qk"; a T5-style bias [1, H, Sq, Sk]: "1hqk"). Kernels read the mask with
# its strides, broadcast dims at stride 0, and never make a [B, H, Sq, Sk] copy of it.
# What a fully masked row gives follows the model: SDPA's rows are 0 (the reference is SDPA),
# a softmax written by hand gives NaN for a row of -inf and uniform weights for a row of a
# finite fill (spec "fill": the number masked scores take, absent for -inf; the reference is
# ``by_hand_masked``, what the model computes). A runtime mask comes without causal: SDPA takes
# one or the other, and the spellings have one mask op (family shapes end in causal 0).
MASK_KINDS = ("bias", "keep", "hide")
MASK_DIM_LETTERS = "bhqk"
# input kinds of the stability stage for a masked contract, beside ADVERSARIAL (whose masks are
# the realistic ones): "one_key" keeps one key a row; "empty_rows" masks every key of some rows
# (-inf for a bias); "min_bias" pads with -1e9 and makes one row all finfo.min, as HF does for a
# batch row that is all padding
MASK_ADVERSARIAL = {"bias": ("one_key", "empty_rows", "min_bias"),
                    "keep": ("one_key", "empty_rows"), "hide": ("one_key", "empty_rows")}
# a bias this large swallows any score in fp32 and fp64 alike (s + b rounds to b): rows of it
# are uniform in the kernel and the reference, and it adds nothing to the error bound
_SWALLOWS = 1e30


def mask_dims_ok(dims) -> bool:
    return (isinstance(dims, str) and len(dims) == 4
            and all(c in (letter, "1") for c, letter in zip(dims, MASK_DIM_LETTERS)))


def mask_shape(dims: str, b: int, h: int, sq: int, sk: int) -> tuple:
    """The mask's [B|1, H|1, Sq|1, Sk|1] shape under ``dims`` ("b11k" -> (B, 1, 1, Sk))."""
    return tuple(1 if c == "1" else n for c, n in zip(dims, (b, h, sq, sk)))


def sdpa_masked(kind: str):
    """The reference of an SDPA call with a runtime mask: F.scaled_dot_product_attention with
    attn_mask (a "hide" mask inverted). Causal with a mask (no spelling makes one) joins the
    mask, as SDPA takes one or the other."""
    def reference(q, k, v, causal, scale, mask):
        attn = ~mask if kind == "hide" else mask
        if causal:
            hide = _hide_causal(q.shape[-2], k.shape[-2], q.device)
            attn = (attn & ~hide if attn.dtype == torch.bool
                    else attn.masked_fill(hide, float("-inf")))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn, scale=scale,
                                              enable_gqa=k.shape[1] != q.shape[1])
    return reference


def _masked_scores(s, kind, fill, mask):
    if kind == "bias":
        return s + mask
    fill = float("-inf") if fill is None else float(fill)
    if kind == "keep":
        return torch.where(mask, s, torch.tensor(fill, dtype=s.dtype, device=s.device))
    return s.masked_fill(mask, fill)


def by_hand_masked(kind: str, fill, cap=None):
    """Attention with a runtime mask as a model writes it out: scores scaled, then the bias
    added or the hidden scores set to ``fill`` (-inf when None), softmax in at least fp32 (a
    row of -inf gives NaN, as the model's softmax does), cast back, @ v. The reference and the
    baseline of a hand-written match with a runtime mask."""
    def fn(q, k, v, causal, scale, mask):
        return _written_out(q, k, v, causal, scale,
                            lambda s: _masked_scores(_capped(cap)(s), kind, fill, mask))
    return fn


def masked_error_bound(kind: str, fill, cap=None):
    """``error_bound`` with a mask: P the masked weights (0 on rows with none), A the scores'
    magnitude plus the bias's where it does not swallow the scores (s + b rounds at |s + b|)."""
    def bound(q, k, v, causal, scale, mask):
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        scores = _capped(cap)((q @ k.transpose(-1, -2)) * sc)
        a = (q.abs() @ k.abs().transpose(-1, -2)) * abs(sc)
        if kind == "bias":
            bm = mask.to(scores.dtype)
            a = a + torch.where(bm.abs() < _SWALLOWS, bm.abs(), torch.zeros_like(bm))
        scores = _masked_scores(scores, kind, fill, mask)
        if causal:
            scores = scores.masked_fill(_hide_causal(*scores.shape[-2:], scores.device),
                                        float("-inf"))
        p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        return (p * (1.0 + a)) @ v.abs()
    return bound


def make_mask(kind: str, dims: str, shape, dtype, device, gen, input_kind="normal"):
    """A runtime mask for the family shape ``shape``: [B|1, H|1, Sq|1, Sk|1] per ``dims``, bool
    ("keep"/"hide") or a float bias in ``dtype``. Realistic content: padding (batch row 0
    keeps every key, the others their first L >= 1 keys, as a tokenizer pads a batch), with
    random holes (20%, key 0 kept) where the mask has query or head dims; a bias is N(0, 1) with
    the padded keys at finfo.min (as HF builds it). ``input_kind`` one of MASK_ADVERSARIAL's
    kinds makes the corresponding adversarial mask (any other kind: the realistic one)."""
    dtype = C.as_dtype(dtype)
    b, h, s, _, _, _ = problem(shape)
    mb, mh, mq, mk = mask_shape(dims, b, h, s, keys_len(shape))
    keys = torch.arange(mk, device=gen.device)
    hidden = torch.zeros(mb, mh, mq, mk, dtype=torch.bool, device=gen.device)
    if input_kind == "one_key" and mk > 1:
        j = (C.rand(gen, mb, mh, mq, 1) * mk).long().clamp(max=mk - 1)
        hidden = keys != j                                             # one key left a row
    elif mk > 1:
        lens = (1 + (C.rand(gen, mb) * mk).long()).clamp(max=mk)
        lens[0] = mk if mb > 1 else max(1, mk - mk // 3)
        hidden = (keys[None, :] >= lens[:, None])[:, None, None, :].expand(mb, mh, mq, mk)
        if mh * mq > 1:
            holes = C.rand(gen, mb, mh, mq, mk) < 0.2
            holes[..., 0] = False
            hidden = hidden | holes
    empty = torch.zeros(mb, mh, mq, 1, dtype=torch.bool, device=gen.device)
    if input_kind in ("empty_rows", "min_bias"):
        if mq > 1:
            empty[:, :, :1] = True                                     # the first query of each plane
        else:
            empty[-1] = True                                           # the last batch row's queries
    hidden = hidden | empty
    if kind != "bias":
        return (~hidden if kind == "keep" else hidden).contiguous().to(device)
    lowest = torch.finfo(dtype).min
    pad = max(-1e9, lowest) if input_kind == "min_bias" else lowest
    out = C.randn(gen, mb, mh, mq, mk)
    out = torch.where(hidden, torch.full_like(out, pad), out)
    if input_kind == "one_key":
        out = torch.where(hidden, torch.full_like(out, float("-inf")), out)
    elif input_kind == "empty_rows":
        out = torch.where(empty.expand_as(out), torch.full_like(out, float("-inf")), out)
    elif input_kind == "min_bias":
        out = torch.where(empty.expand_as(out), torch.full_like(out, lowest), out)
    return out.to(dtype).to(device)


def _masked_cost(dims: str, kind: str):
    def cost_fn(shape, dtype, v_dim=None):
        byts, flops = cost(shape, dtype, v_dim)
        b, h, s, _, _, _ = problem(shape)
        n = math.prod(mask_shape(dims, b, h, s, keys_len(shape)))
        return byts + n * (1 if kind != "bias" else C.itemsize(dtype)), flops + _score_count(shape)
    return cost_fn


def _causal_as(shapes, causal: bool) -> tuple:
    """Family shapes with their causal entry set (0: a runtime mask comes without it; 1: a bias
    with the causal mask after it), an Sk entry kept, duplicates dropped."""
    return tuple(dict.fromkeys(problem(s)[:5] + (int(causal),) + tuple(s[6:7]) for s in shapes))


def _masked_family(spec: dict) -> Family:
    kind, dims, fill = spec["mask"], spec.get("mask_dims", "b1qk"), spec.get("fill")
    by = spec.get("written") == "by_hand"
    if kind not in MASK_KINDS:
        raise ValueError(f"attention's mask is one of {', '.join(MASK_KINDS)}, not {kind!r}")
    if not mask_dims_ok(dims):
        raise ValueError(f"mask_dims is four letters of 'bhqk' or '1' each ('b11k'), not {dims!r}")
    if fill is not None:
        if kind == "bias" or not by:
            raise ValueError("a fill belongs to a bool mask written by hand (masked_fill, where)")
        if not isinstance(fill, (int, float)) or not fill <= _VERY_NEGATIVE:
            raise ValueError(f"a fill is a number <= {_VERY_NEGATIVE}, not {fill!r}")
        fill = float(fill)
    mask = {"kind": kind, "fill": fill, "safe": not by}
    cap = spec.get("softcap")
    # a bias with the causal mask after it (ALiBi): the family shapes are causal, else never
    causal = bool(spec.get("causal"))
    shapes = functools.partial(_causal_as, causal=causal)
    reference_fn = by_hand_masked(kind, fill, cap) if by else sdpa_masked(kind)
    extra = MASK_ADVERSARIAL[kind]

    def make(shape, dtype, device, gen, kind="normal", v_dim=None):
        inp = make_inputs(shape, dtype, device, gen, "normal" if kind in extra else kind, v_dim)
        inp["causal"] = causal
        inp["mask"] = make_mask(mask["kind"], dims, shape, dtype, device, gen, kind)
        return inp

    what = {"bias": "a float bias added to the scaled scores",
            "keep": "a bool mask, True keeps a key", "hide": "a bool mask, True hides a key"}[kind]
    rows = ("a row with every key masked gives 0 (SDPA)" if not by else
            "a row with every key masked gives what the model's softmax gives: NaN for -inf, "
            "uniform weights for a finite fill")
    return dataclasses.replace(
        FAMILY, signature="kernel_fn(q, k, v, causal, scale, mask)",
        arg_names=ARG_NAMES + ("mask",), reference=reference_fn, make_inputs=make,
        cost=_masked_cost(dims, kind), bench_shapes=shapes(BENCH_SHAPES),
        sweep_shapes=shapes(SWEEP_SHAPES), edge_shapes=shapes(EDGE_SHAPES),
        adversarial=ADVERSARIAL + extra, render=lambda params: render(params, mask=mask, cap=cap),
        space_for=_without_ws,
        description=f"Scaled dot-product attention with GQA and a runtime mask: {what}, shape "
                    f"{list(mask_shape(dims, 'B', 'H', 'Sq', 'Sk'))} broadcast to "
                    f"[B, H, Sq, Sk]; {rows}" + (f"; hidden scores take {fill}" if fill else "")
                    + " (flash style).",
        notes=dict(FAMILY.notes, mask=kind, mask_dims=dims, fill=fill,
                   causal="after the bias" if causal else "never with a mask"),
        error_bound=masked_error_bound(kind, fill, cap),
        op_schema="(Tensor q, Tensor k, Tensor v, bool causal, float scale, Tensor mask) -> Tensor",
        spec=dict(spec), baseline=None)


# ---------------------------------------------------------------------------------------------
# spellings: how model code writes it (kernels/patterns.py)
# ---------------------------------------------------------------------------------------------

def _scores(q, kt, scale_kind, scale, div):
    if scale_kind == "qmul":
        return (q * scale) @ kt
    s = q @ kt
    if scale_kind == "mul":
        return s * scale
    if scale_kind == "div":
        return s / div
    return s


def _masked(s, kind, mask, fill, bias=None):
    if kind.startswith("add&"):           # a bias (ALiBi: MPT), then a mask (the causal one)
        return _masked(s + bias, kind[4:], mask, fill)
    if kind == "masked_fill":
        return s.masked_fill(mask, fill)
    if kind == "where":
        return torch.where(mask, s, fill)
    if kind == "add":
        return s + mask
    return s


def _by_hand(scale_kind, mask_kind, capped=False):
    def fn(q, kt, v, mask, scale, div, fill, cap_in, cap_out, bias):
        s = _scores(q, kt, scale_kind, scale, div)
        if capped:                          # Gemma 2's logit soft cap: cap * tanh(s / cap)
            s = torch.tanh(s / cap_in) * cap_out
        p = torch.softmax(_masked(s, mask_kind, mask, fill, bias), -1)
        return p @ v
    last = mask_kind.split("&")[-1]
    mask = {"masked_fill": T((8, 8), "bool"), "where": T((8, 8), "bool"), "add": T((8, 8))}.get(last)
    args = (("q", T((2, 4, 8, 16))), ("kt", T((2, 4, 16, 8))), ("v", T((2, 4, 8, 16))),
            ("mask", mask), ("scale", Scalar("scale") if scale_kind in ("mul", "qmul") else None),
            ("div", Scalar("div") if scale_kind == "div" else None),
            ("fill", Scalar("fill") if last in ("masked_fill", "where") else None),
            ("cap_in", Scalar("cap_in") if capped else None),
            ("cap_out", Scalar("cap_out") if capped else None),
            ("bias", T((1, 4, 1, 8)) if mask_kind.startswith("add&") else None))
    return Spelling(f"{scale_kind}_{mask_kind}" + ("+cap" if capped else ""), fn, args)


_SCALES = ("none", "mul", "div", "qmul")
_MASKS = ("none", "masked_fill", "where", "add", "add&masked_fill", "add&where")
SPELLINGS = tuple(_by_hand(a, b, c) for c in (False, True) for a in _SCALES for b in _MASKS) + (
    # F.scaled_dot_product_attention: mask, dropout, causal flag, scale and GQA captured as given
    Spelling("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
             (("q", T((2, 4, 8, 16))), ("k", T((2, 4, 8, 16))), ("v", T((2, 4, 8, 16)))),
             loose=("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")),
)
_VERY_NEGATIVE = -1e4       # a fill or bias at or below this gives exp(...) == 0 in fp32 and bf16


class _NoHideMask(NoFit):
    """A constant mask that is no plain hide-or-keep mask: a float bias (T5's relative-position
    bias, folded from the model's weights) or one that differs by batch or head."""


def _hidden(m, kind, sq, sk):
    """The positions a constant mask hides, as a bool [Sq, Sk] the same for every (batch, head);
    None when it cannot be read as one (a masked_fill mask that is not bool, one that does not
    broadcast to [Sq, Sk]); raises NoFit for a mask that is not a plain hide-or-keep one. A mask
    that is no constant of the model is a runtime mask (``_runtime_mask``)."""
    mask = m.const("mask") if kind != "sdpa" else m.const("attn_mask")
    if mask is None:
        return None
    mask = mask.detach().to("cpu")
    if kind in ("masked_fill", "where"):
        fill = m.scalar("fill")
        if fill is None or fill > _VERY_NEGATIVE:
            raise NoFit(f"masked scores set to {fill}: the contract hides them (-inf)")
        if mask.dtype != torch.bool:
            return None
        hide = mask if kind == "masked_fill" else ~mask
    elif mask.dtype == torch.bool:                                     # SDPA: True takes part
        hide = ~mask
    else:                                                              # an additive bias
        very = mask <= _VERY_NEGATIVE
        if not bool(((mask == 0) | very).all()):
            raise _NoHideMask("a float attention bias other than 0 / -inf")
        hide = very
    try:
        hide = hide.expand(*hide.shape[:-2], sq, sk).reshape(-1, sq, sk)
    except RuntimeError:
        return None
    if not bool((hide == hide[:1]).all()):
        raise _NoHideMask("the mask differs between batches or heads")
    return hide[0]


def _runtime_mask(m, kind, sdpa, dims4, rank, qdtype, name=None):
    """(spec keys, Ref) of a mask the model computes when it runs (from its inputs): the mask
    node itself, viewed as 4-D (leading 1s) with dims it broadcasts by stride 0 sliced to one
    (the kernel expands them again, as it does every size-1 dim); NoFit where the contract has
    no such mask."""
    name = name or ("attn_mask" if sdpa else "mask")
    node = m.node(name)
    if node in m.folder.tainted:
        raise NoFit("the mask is not a constant of the model and is written in place after it "
                    "is made: the contract reads no mask that changes under it")
    meta = m.meta(name)
    if meta is None:
        return None
    shape, stride, dt = tuple(meta["shape"]), tuple(meta["stride"]), meta["dtype"]
    if len(shape) > rank:
        raise NoFit(f"a mask of rank {len(shape)} over q of rank {rank}: it broadcasts the output")
    if sdpa:
        kind = "keep" if dt == torch.bool else "bias"
    else:
        kind = {"masked_fill": "hide", "where": "keep", "add": "bias"}[kind]
    if kind == "bias" and dt != qdtype:
        raise NoFit(f"a float mask in {dt} over q in {qdtype}: the contract takes it in q's dtype")
    if kind != "bias" and dt != torch.bool:
        raise NoFit(f"a {dt} mask where a bool one is read")
    spec = {"mask": kind}
    if not sdpa and kind != "bias":
        fill = m.scalar("fill")
        if fill is None or fill > _VERY_NEGATIVE:
            raise NoFit(f"masked scores set to {fill}: the contract hides them (a fill <= "
                        f"{_VERY_NEGATIVE:g})")
        if not math.isinf(fill):
            spec["fill"] = float(fill)
    pad = 4 - len(shape)
    views = (("unsqueeze", 0),) * pad
    shape, stride = (1,) * pad + shape, (0,) * pad + stride
    letters = ""
    for i, (n, want, st) in enumerate(zip(shape, dims4, stride)):
        if n == 1 or (st == 0 and n == want):
            letters += "1"
            if n != 1:
                views += (("slice", i, 0, 1),)         # an expanded dim: one row, read at stride 0
        elif n == want:
            letters += MASK_DIM_LETTERS[i]
        else:
            raise NoFit(f"a mask of shape {list(meta['shape'])} over scores "
                        f"{list(dims4)}: it does not broadcast to them")
    spec["mask_dims"] = letters
    return spec, Ref(name, views)


def from_match(m):
    """Attention as the family computes it: q [B, H, S, D], k/v with Hkv heads (a repeat of
    the heads looked through), no mask or a causal one, a constant scale."""
    name = m.pattern.split("/")[1]
    sdpa = name == "sdpa"
    capped = name.endswith("+cap")          # Gemma 2's logit soft cap (spec "softcap")
    q = m.meta("q")
    if q is None or not q["dtype"].is_floating_point:
        return None
    if sdpa:
        if (m.scalar("dropout_p") or 0.0) != 0.0:
            raise NoFit(f"dropout p={m.scalar('dropout_p')}: the contract has none")
        k_views = ()
    else:
        src = m.swapped_last("kt")
        if src is not None:
            m.rebind("k", src, [m.node("kt")])
            k_views = ()
        else:
            m.inputs["k"] = m.node("kt")
            k_views = (("transpose", -2, -1),)
    rank = len(q["shape"])
    if rank not in (3, 4):
        raise NoFit(f"q of rank {rank}: the contract takes [B, H, S, D]")
    reps = []
    for name_kv in ("k", "v"):
        if k_views and name_kv == "k":
            reps.append(1)
            continue
        src, rep, thr = m.head_repeat(m.node(name_kv))
        if rep > 1:
            m.rebind(name_kv, src, thr)
        reps.append(rep)
    k, v = m.meta("k"), m.meta("v")
    if k is None or v is None:
        return None
    kshape = tuple(k["shape"])
    if k_views:
        kshape = kshape[:-2] + (kshape[-1], kshape[-2])
    if rank == 3:
        q4, k4, v4 = (1,) + tuple(q["shape"]), (1,) + kshape, (1,) + tuple(v["shape"])
    else:
        q4, k4, v4 = tuple(q["shape"]), kshape, tuple(v["shape"])
    b, h, sq, d = q4
    # v's head dim may be its own: multi-head latent attention (DeepSeek-V2/V3, Kimi K2: q and
    # k 192 wide, their rotary part included, v 128) is spec "v_head_dim"
    if (reps[0] != reps[1] or len(k4) != 4 or len(v4) != 4 or k4[:3] != v4[:3] or k4[0] != b
            or k4[3] != d):
        return None
    hkv, sk = k4[1], k4[2]
    if sdpa and reps[0] == 1 and m.scalar("enable_gqa") is not True and hkv != h:
        return None                          # SDPA would refuse these heads
    if h % hkv:
        return None
    if q["dtype"] != k["dtype"] or q["dtype"] != v["dtype"] or m.out_meta()["dtype"] != q["dtype"]:
        raise NoFit("q, k, v and the output in different dtypes: the contract takes one")
    if max(d, v4[3]) > MAX_HEAD_DIM:
        raise NoFit(f"head dim {max(d, v4[3])} > {MAX_HEAD_DIM}: the kernels hold a [BLOCK_M, D] tile")
    # the mask: none, or a constant one; causal when it hides exactly the future keys
    if sdpa:
        causal = bool(m.scalar("is_causal"))
        kind = "sdpa" if m.node("attn_mask") is not None else "none"
        scale = m.scalar("scale")
        if m.captures.get("scale") is not None and scale is None:
            raise NoFit("the scale is not a number known when the graph is captured")
    else:
        causal = False
        base = name.split("+")[0]
        kind = base.split("_", 1)[1]
        sk_name = base.split("_", 1)[0]
        if sk_name in ("mul", "qmul"):
            scale = m.scalar("scale")
        elif sk_name == "div":
            div = m.scalar("div")
            scale = None if not div else 1.0 / div
        else:
            scale = 1.0
        if scale is None:
            raise NoFit("the scale is not a number known when the graph is captured")
    runtime = None
    if kind.startswith("add&"):
        # a bias (ALiBi, MPT's position bias), then a constant mask that must be the causal one
        hide = _hidden(m, kind[4:], sq, sk)
        if hide is None or not torch.equal(hide, _hide_causal(sq, sk, "cpu")):
            raise NoFit("a bias and then a mask other than the causal one: the contract takes "
                        "a bias with the causal mask only")
        causal = True
        runtime = _runtime_mask(m, "add", False, (b, h, sq, sk), rank, q["dtype"], name="bias")
        if runtime is None:
            return None
        runtime = (dict(runtime[0], causal=True), runtime[1])
    elif kind != "none" and m.const("attn_mask" if sdpa else "mask") is None:
        if causal:
            raise NoFit("a causal flag and a runtime mask together: the contract takes one")
        runtime = _runtime_mask(m, kind, sdpa, (b, h, sq, sk), rank, q["dtype"])
        if runtime is None:
            return None
    elif kind != "none":
        try:
            hide = _hidden(m, kind, sq, sk)
        except _NoHideMask:
            # a constant bias, or a mask per batch or head: the kernel reads it as it reads a
            # runtime mask (the node is a tensor of the graph, folded or not)
            if causal:
                raise NoFit("a causal flag and a mask together: the contract takes one") from None
            runtime = _runtime_mask(m, kind, sdpa, (b, h, sq, sk), rank, q["dtype"])
            if runtime is None:
                return None
        else:
            if hide is None:
                return None
            if torch.equal(hide, _hide_causal(sq, sk, "cpu")):
                causal = True
            elif bool(hide.any()):
                # any other constant mask (a sliding window: Gemma 3's local layers, Mistral's
                # past its window; a prefix; blocks): the kernel reads it as a runtime mask
                if causal:
                    raise NoFit("a causal flag and a mask together: the contract takes one")
                runtime = _runtime_mask(m, kind, sdpa, (b, h, sq, sk), rank, q["dtype"])
                if runtime is None:
                    return None
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    views = ((("unsqueeze", 0),) if rank == 3 else ())
    args = {"q": Ref("q", views), "k": Ref("k", k_views + views), "v": Ref("v", views),
            "causal": Ref.lit(bool(causal)), "scale": Ref.lit(float(scale))}
    # a hand-written match is timed against the model's own way of computing it (by_hand)
    spec = {} if sdpa else {"written": "by_hand"}
    if v4[3] != d:
        spec["v_head_dim"] = int(v4[3])
    if not sdpa and capped:
        cap_in, cap_out = m.scalar("cap_in"), m.scalar("cap_out")
        if cap_in is None or cap_in != cap_out or not cap_in > 0:
            raise NoFit(f"a soft cap tanh(s / {cap_in}) * {cap_out}: the contract takes one "
                        f"positive cap known when the graph is captured")
        spec["softcap"] = float(cap_in)
    if runtime is not None:
        spec.update(runtime[0])
        args["mask"] = runtime[1]
    if causal and sq != sk:
        raise NoFit(f"a causal mask over {sq} queries and {sk} keys: the contract's causal shapes "
                    f"have equal lengths")
    return Fit(spec, (b, h, sq, d, hkv, int(causal)) + ((sk,) if sk != sq else ()), args,
               post=((("squeeze", 0),) if rank == 3 else ()))


def configure(spec: dict):
    """The contract under ``spec``: {"written": "by_hand"} is the plain contract, judged against
    ``reference`` as ever, whose baselines time ``by_hand`` (the computation the model wrote).
    "mask" (with "mask_dims", and "fill" for a bool mask written by hand) adds the runtime mask
    argument (see "runtime masks" above); "v_head_dim" gives v (and o) their own head dim, bound
    into any of those contracts' inputs and cost."""
    unknown = set(spec) - {"written", "mask", "mask_dims", "fill", "softcap", "causal", "v_head_dim"}
    if unknown or spec.get("written", "by_hand") != "by_hand":
        raise ValueError(f"attention takes the spec keys written ('by_hand'), mask, mask_dims, "
                         f"fill, softcap, causal and v_head_dim, not {spec!r}")
    dv = spec.get("v_head_dim")
    if dv is not None and (isinstance(dv, bool) or not isinstance(dv, int)
                           or not 1 <= dv <= MAX_HEAD_DIM):
        raise ValueError(f"v_head_dim is v's head dim, an integer from 1 to {MAX_HEAD_DIM}: {spec!r}")
    family = _configure(spec)
    if dv is None:
        return family
    return dataclasses.replace(
        family, make_inputs=functools.partial(family.make_inputs, v_dim=dv),
        cost=functools.partial(family.cost, v_dim=dv),
        description=family.description + f" v's head dim is {dv}, its own (multi-head latent "
                    f"attention): o is [B, H, Sq, {dv}].",
        notes=dict(family.notes, v_head_dim=dv))


def _configure(spec: dict):
    """``configure``'s family before v's own head dim (spec checked there)."""
    if "causal" in spec and (spec["causal"] is not True or spec.get("mask") != "bias"
                             or spec.get("written") != "by_hand"):
        raise ValueError(f"causal (true) comes with a bias mask on an attention written by hand: {spec!r}")
    cap = spec.get("softcap")
    if cap is not None:
        if spec.get("written") != "by_hand" or isinstance(cap, bool) or not isinstance(cap, (int, float)) \
                or not cap > 0:
            raise ValueError(f"softcap is a positive number, on an attention written by hand: {spec!r}")
    if "mask" in spec:
        return _masked_family(spec)
    if "mask_dims" in spec or "fill" in spec:
        raise ValueError(f"mask_dims and fill come with a mask: {spec!r}")
    if cap is not None:
        capped = by_hand_capped(float(cap))
        return dataclasses.replace(
            FAMILY, spec=dict(spec), reference=capped, baseline=capped,
            error_bound=functools.partial(error_bound, cap=float(cap)),
            render=lambda params: render(params, cap=float(cap)), space_for=_without_ws,
            description=FAMILY.description + f" Scores soft-capped: {cap:g} * tanh(s / {cap:g}).")
    written = spec.get("written") == "by_hand"      # else an SDPA call: SDPA is its baseline
    return dataclasses.replace(FAMILY, spec=dict(spec), baseline=by_hand if written else None)


FAMILY = dataclasses.replace(
    FAMILY, spellings=SPELLINGS, from_match=from_match,
    op_schema="(Tensor q, Tensor k, Tensor v, bool causal, float scale) -> Tensor",
    profile_ops=("aten::scaled_dot_product_attention", "aten::_flash_attention_forward",
                 "aten::_efficient_attention_forward", "aten::_scaled_dot_product_flash_attention",
                 "aten::_scaled_dot_product_efficient_attention",
                 "aten::_scaled_dot_product_cudnn_attention",
                 "aten::_scaled_dot_product_flash_attention_for_cpu"),
    out_order=(0, 2, 1, 3))     # o written [B, Sq, H, Dv]-major, SDPA's layout (kernel_fn)
