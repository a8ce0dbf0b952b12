"""Sweep of the warp-specialized Gluon prototype (attn_fwd_ws) against SDPA, a Triton TMA point
and attn_fwd; docs/sweeps/h200_gluon_prototype.json."""
import os, sys, traceback
sys.path.insert(0, os.path.dirname(__file__)); sys.path.insert(0, os.getcwd())
import torch, triton
import torch.nn.functional as F
from kernels import attention as A
sys.path.insert(0, "docs/sweeps")
from sweeplib import recorder, load, bencher
import gluon_prototype as gattn
emit = recorder("h200_gluon_prototype.json")
bench = bencher(20, 60)
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
p = dict(A.DEFAULT); p.update(block_m=64, block_n=64, num_warps=4, num_stages=3, causal_blocks="split",
                              use_exp2=True, fold_scale=True, loads="tma", m_order="reverse")
tfn = load(A.render(p), "tp").kernel_fn
SHAPES = [((4, 32, 4096, 128, 8, True), [(128, 128, 2), (128, 128, 3), (128, 64, 3)]),
          ((4, 32, 4096, 128, 8, False), [(128, 128, 2), (128, 128, 3)]),
          ((4, 32, 4096, 64, 8, True), [(128, 128, 3), (128, 64, 3)]),
          ((4, 16, 4096, 256, 8, True), [(128, 64, 2)]),
          ((8, 12, 1024, 64, 12, True), [(128, 128, 3), (128, 64, 3)])]
for (B, H, S, D, Hkv, causal), ws in SHAPES:
    name = f"{B}x{H}x{S}x{D} kv{Hkv} {'causal' if causal else 'full'}"
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    fl = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != H)
    t_sdpa = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != H))
    emit(shape=name, point="SDPA", us=t_sdpa * 1e3, tflops=fl / t_sdpa / 1e9, vs_sdpa=1.0)
    cands = [("triton 64x64 w4 s3", lambda: tfn(q, k, v, causal, None))]
    if D <= 128:
        cands.append(("gluon 128x128 w8 buf3", lambda: gattn.attention(q, k, v, causal, None, 128, 128, 8, 3, True)))
    for bm, bn, nb in ws:
        cands.append((f"gluon-ws {bm}x{bn} buf{nb}", lambda bm=bm, bn=bn, nb=nb: gattn.attention_ws(q, k, v, causal, None, bm, bn, nb)))
    for pt, f in cands:
        try:
            o = f(); torch.cuda.synchronize(); err = (o.float() - ref.float()).abs().max().item()
            t = bench(f)
            emit(shape=name, point=pt, us=t * 1e3, tflops=fl / t / 1e9, vs_sdpa=t_sdpa / t, maxerr=err)
        except Exception as e:
            emit(shape=name, point=pt, error=(repr(e) + traceback.format_exc()[-600:])[:1500])
