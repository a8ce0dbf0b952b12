"""Sweep of the first Gluon prototype (attn_fwd: one program, softmax under its own p @ v)
against SDPA and Triton TMA points; docs/sweeps/h100_gluon_prototype.json."""
import os, sys, traceback
sys.path.insert(0, os.path.dirname(__file__)); sys.path.insert(0, os.getcwd())
import torch, triton
import torch.nn.functional as F
from kernels import attention as A
sys.path.insert(0, "docs/sweeps")
from sweeplib import recorder, load, bencher
import gluon_prototype as gattn
emit = recorder("h100_gluon_prototype.json")
bench = bencher(25, 100)
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)

def triton_point(bm, bn, w, s):
    p = dict(A.DEFAULT); p.update(block_m=bm, block_n=bn, num_warps=w, num_stages=s, causal_blocks="split",
                                  use_exp2=True, fold_scale=True, loads="tma", m_order="reverse")
    return load(A.render(p), f"tp_{bm}_{bn}_{w}_{s}").kernel_fn

SHAPES = [(4, 32, 4096, 128, 8, True), (4, 32, 4096, 64, 8, True), (4, 16, 4096, 256, 8, True),
          (8, 12, 1024, 64, 12, True), (4, 32, 4096, 128, 8, False)]
GL = {128: [(128, 128, 8, 2, True), (128, 128, 8, 2, False), (128, 64, 8, 3, True), (64, 128, 4, 2, True),
            (64, 64, 4, 3, True), (64, 64, 4, 2, True), (128, 128, 8, 3, True)],
      64: [(128, 128, 8, 2, True), (128, 64, 8, 3, True), (64, 128, 4, 2, True), (64, 64, 4, 3, True), (64, 64, 4, 2, True), (128, 128, 8, 3, True)],
      256: [(128, 64, 8, 2, True), (64, 64, 4, 2, True), (64, 128, 4, 1, True)]}
TP = [(64, 64, 4, 3), (128, 64, 8, 4), (128, 128, 8, 3)]
for B, H, S, D, Hkv, causal in SHAPES:
    name = f"{B}x{H}x{S}x{D} kv{Hkv} {'causal' if causal else 'full'}"
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    fl = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != H)
    t_sdpa = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != H))
    emit(shape=name, point="SDPA", us=t_sdpa * 1e3, tflops=fl / t_sdpa / 1e9, vs_sdpa=1.0)
    for cfg in TP:
        try:
            fn = triton_point(*cfg)
            o = fn(q, k, v, causal, None); err = (o.float() - ref.float()).abs().max().item()
            t = bench(lambda: fn(q, k, v, causal, None))
            emit(shape=name, point="triton %dx%d w%d s%d" % cfg, us=t * 1e3, tflops=fl / t / 1e9, vs_sdpa=t_sdpa / t, maxerr=err)
        except Exception as e:
            emit(shape=name, point="triton %dx%d w%d s%d" % cfg, error=repr(e)[:400])
    for bm, bn, w, nb, ov in GL[D]:
        pt = f"gluon {bm}x{bn} w{w} buf{nb}{'' if ov else ' no-overlap'}"
        try:
            f = lambda: gattn.attention(q, k, v, causal, None, bm, bn, w, nb, ov)
            o = f(); torch.cuda.synchronize(); err = (o.float() - ref.float()).abs().max().item()
            t = bench(f)
            emit(shape=name, point=pt, us=t * 1e3, tflops=fl / t / 1e9, vs_sdpa=t_sdpa / t, maxerr=err)
        except Exception as e:
            emit(shape=name, point=pt, error=(repr(e) + traceback.format_exc()[-600:])[:1500])
