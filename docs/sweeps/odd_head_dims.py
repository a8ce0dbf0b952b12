"""Exploratory sweep behind docs/benchmarks.md's rows on head dims that are no power of 2: the
attention family with v's own head dim (spec "v_head_dim"; multi-head latent attention,
DeepSeek-V2/V3, Kimi K2: q and k 192 wide, the rotary part included, v 128) and Phi-2's 80 and
Phi-3's 96, each point with one zero-padded tile and with the head dim in two parts (split_d),
against what the model runs: SDPA called with those operands (the backend torch picks, and
each backend that takes them), for MLA SDPA with v zero-padded to q's width (what libraries
that hold one head dim do) and, as the floor a 192-wide q/k costs, the kernel at q/k 128 wide.

    OUT=dir python docs/sweeps/odd_head_dims.py SECONDS

triton.testing.do_bench medians (L2 flushed by do_bench), bf16, causal, not the judge's timing.
Writes $OUT/odd_head_dims.json.
"""
import os, sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import attention as at
from sweeplib import bencher, load, recorder
budget = float(sys.argv[1])
t0 = time.time()
emit = recorder("odd_head_dims.json")
bench = bencher(25, 150)
P = lambda **k: dict(at.DEFAULT, **dict(dict(use_exp2=True, loads="tma", causal_blocks="split"), **k))
POINTS = [
    ("opener 1: 128x64 w8 s4", dict(at.DEFAULT, **at.HALF_OPENERS[1])),
    ("opener 1 split_d", dict(at.DEFAULT, **at.HALF_OPENERS[1], split_d=True)),
    ("128x64 w8 s3 rev fold", P(block_m=128, block_n=64, num_warps=8, num_stages=3, m_order="reverse", fold_scale=True)),
    ("128x64 w8 s3 rev fold split_d", P(block_m=128, block_n=64, num_warps=8, num_stages=3, m_order="reverse", fold_scale=True, split_d=True)),
    ("opener 0: 64x64 w4 s3 rev", dict(at.DEFAULT, **at.HALF_OPENERS[0])),
    ("opener 0 split_d", dict(at.DEFAULT, **at.HALF_OPENERS[0], split_d=True)),
    ("128x128 w8 s2 rev fold split_d", P(block_m=128, block_n=128, num_warps=8, num_stages=2, m_order="reverse", fold_scale=True, split_d=True)),
    ("128x64 w8 s4 split_d ws", dict(at.DEFAULT, **at.HALF_OPENERS[1], split_d=True, warp_specialize=True)),
]
# (name, B, H, S, D (q, k), Dv): DeepSeek-V2-Lite (16 heads) and DeepSeek-V3 (128 heads) prefill
SHAPES = [("DeepSeek-V2-Lite 4x16x4096", 4, 16, 4096, 192, 128),
          ("DeepSeek-V3 1x128x2048", 1, 128, 2048, 192, 128),
          ("Phi-2 4x32x2048 D80", 4, 32, 2048, 80, 80),
          ("Phi-3-mini 4x32x4096 D96", 4, 32, 4096, 96, 96)]
mods = {}
for shp, B, H, S, D, Dv in SHAPES:
    if time.time() - t0 > budget: break
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, S, H, Dv, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
    scale = D ** -0.5
    fl = 2 * B * H * S * S * (D + Dv) / 2
    sd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    ref = sd(); base = bench(sd)
    emit(shape=shp, point="SDPA (torch's pick)", us=base * 1e3, tflops=fl / base / 1e9, vs_sdpa=1.0)
    for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel([be]):
                out = sd(); torch.cuda.synchronize(); ms = bench(sd)
            emit(shape=shp, point=f"SDPA {be.name}", us=ms * 1e3, tflops=fl / ms / 1e9, vs_sdpa=base / ms,
                 maxerr=(out.float() - ref.float()).abs().max().item())
        except Exception as e:
            emit(shape=shp, point=f"SDPA {be.name}", error=repr(e)[:200])
    if Dv != D:
        vp = F.pad(v, (0, D - Dv))
        padded = lambda: F.scaled_dot_product_attention(q, k, vp, is_causal=True, scale=scale)[..., :Dv]
        ms = bench(padded)
        emit(shape=shp, point="SDPA, v padded to D", us=ms * 1e3, tflops=fl / ms / 1e9, vs_sdpa=base / ms)
    q128, k128 = q[..., :128].contiguous(), k[..., :128].contiguous()
    for i, (name, params) in enumerate(POINTS):
        if time.time() - t0 > budget: break
        try:
            m = mods.get(i) or mods.setdefault(i, load(at.render(params), f"mla{i}"))
            out = m.kernel_fn(q, k, v, True, scale); torch.cuda.synchronize()
            err = (out.float() - ref.float()).abs().max().item()
            ms = bench(lambda: m.kernel_fn(q, k, v, True, scale))
            emit(shape=shp, point=name, us=ms * 1e3, tflops=fl / ms / 1e9, vs_sdpa=base / ms, maxerr=err)
            if i == 0 and D == 192:   # the floor: q and k 128 wide, v as it is
                ms128 = bench(lambda: m.kernel_fn(q128, k128, v, True, scale))
                emit(shape=shp, point=name + ", q/k at 128", us=ms128 * 1e3, vs_sdpa=base / ms128)
        except Exception as e:
            emit(shape=shp, point=name, error=repr(e)[:400])
