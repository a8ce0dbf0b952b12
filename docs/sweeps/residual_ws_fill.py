"""Exploratory sweep behind docs/benchmarks.md's "Residual norms, warp-specialized attention, the
fill axis, launcher host time (H100, 2026-12-05, night)".

    OUT=dir python docs/sweeps/residual_ws_fill.py res|gemm|attn|host SECONDS

triton.testing.do_bench medians (L2 flushed by do_bench), bf16, not the judge's timing:
- res: the fused residual add + RMSNorm / LayerNorm (rmsnorm / layernorm ``residual: true``)
  at three points against the model's add then norm, eager and torch.compile (default mode);
- gemm: the matmul family's persistent opener with and without ``fill``, the odd-N LM head
  with the TMA store through masked pointers (C_PTRS) and the issue's four shapes, against
  torch.matmul (cuBLAS);
- attn: attention points with and without ``warp_specialize`` against SDPA;
- host: host time a call of tiny problems (back-to-back calls, wall time / call).
Writes $OUT/x1_<part>.json (docs/sweeps/h100_x1_<part>.json are this run's).
"""
import os, sys, time
import torch, triton
import torch.nn.functional as F
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import attention as at, matmul as mm
from sweeplib import bencher, gemm_point, gemm_shape, load, recorder
part = sys.argv[1]; budget = float(sys.argv[2])
t0 = time.time()
emit = recorder(f"x1_{part}.json")
bench = bencher(25, 150)
if part == "attn":
    P = lambda **k: dict(at.DEFAULT, **{**dict(use_exp2=True, loads="tma", causal_blocks="split", m_order="reverse"), **k})
    POINTS = [
     ("op0 64x64 w4 s3", P(block_m=64, block_n=64, num_stages=3)),
     ("op1 128x64 w8 s4 fwd", P(block_m=128, block_n=64, num_warps=8, num_stages=4, m_order="forward")),
     ("128x64 w8 s4 fold", P(block_m=128, block_n=64, num_warps=8, num_stages=4, fold_scale=True)),
     ("64x64 w4 s3 fold", P(block_m=64, block_n=64, num_stages=3, fold_scale=True)),
     ("WS 128x64 w4 s3", P(block_m=128, block_n=64, num_warps=4, num_stages=3, warp_specialize=True)),
     ("WS 128x128 w8 s2 fold", P(block_m=128, block_n=128, num_warps=8, num_stages=2, fold_scale=True, warp_specialize=True)),
     ("WS 128x64 w8 s3 fold", P(block_m=128, block_n=64, num_warps=8, num_stages=3, fold_scale=True, warp_specialize=True)),
     ("WS 128x128 w4 s3 fold", P(block_m=128, block_n=128, num_warps=4, num_stages=3, fold_scale=True, warp_specialize=True)),
     ("WS 64x64 w4 s3 fold", P(block_m=64, block_n=64, num_stages=3, fold_scale=True, warp_specialize=True)),
     ("128x128 w8 s3 fold", P(block_m=128, block_n=128, num_warps=8, num_stages=3, fold_scale=True)),
    ]
    SHAPES = [(4, 32, 4096, 128, 8), (8, 12, 1024, 64, 12), (4, 32, 4096, 64, 8), (4, 16, 4096, 256, 8)]
    for (B, H, S, D, Hkv) in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        sd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hkv != H)
        ref = sd(); ms0 = bench(sd); fl = 4 * B * H * S * S * D / 2
        shp = f"{B}x{H}x{S}x{D} gqa{H // Hkv} causal"
        emit(shape=shp, point="SDPA", us=ms0 * 1e3, tflops=fl / ms0 / 1e9, vs_sdpa=1.0)
        for i, (name, params) in enumerate(POINTS):
            if time.time() - t0 > budget: break
            if D == 256 and params["block_n"] == 128 and params["block_m"] == 128: continue
            try:
                src = at.render(params)
                m = load(src, f"a{i}_{D}_{S}")
                out = m.kernel_fn(q, k, v, True, None); torch.cuda.synchronize()
                err = (out.float() - ref.float()).abs().max().item()
                ms = bench(lambda: m.kernel_fn(q, k, v, True, None))
                emit(shape=shp, point=name, us=ms * 1e3, tflops=fl / ms / 1e9, vs_sdpa=ms0 / ms, maxerr=err)
            except Exception as e:
                emit(shape=shp, point=name, error=repr(e)[:400])
elif part == "gemm":
    HP = dict(mm.DEFAULT, **mm.HALF_PERSISTENT)
    SETS = [
     ((2048, 4096, 1024), {"pers ws fill": HP, "pers ws nofill": dict(HP, fill=False), "tiles tma 128x128x64": dict(mm.DEFAULT, block_k=64, loads="tma")}),
     ((16384, 4096, 1024), {"pers ws fill": HP, "pers ws nofill": dict(HP, fill=False)}),
     ((8192, 768, 50257), {"pers tma fill (C_PTRS)": dict(HP, loads="tma"), "pers ws (pointer c)": HP, "tiles tma 128x128x64": dict(mm.DEFAULT, block_k=64, loads="tma")}),
     ((8192, 768, 2304), {"pers ws fill": HP, "tiles tma 128x128x64": dict(mm.DEFAULT, block_k=64, loads="tma")}),
     ((4096, 4096, 4096), {"pers ws fill": HP, "pers tma 256x64 s4": dict(mm.DEFAULT, block_n=256, block_k=64, num_warps=8, num_stages=4, loads="tma")}),
     ((4096, 4096, 11008), {"pers ws fill": HP}),
     ((8192, 14336, 4096), {"pers ws fill": HP}),
     ((16, 4096, 4096), {"HALF_DECODE": dict(mm.DEFAULT, **mm.HALF_DECODE)}),
    ]
    for (M, K, N), pts in SETS:
        a, b, ref, cub, fl = gemm_shape(emit, bench, M, K, N)
        for i, (name, params) in enumerate(pts.items()):
            if time.time() - t0 > budget: break
            gemm_point(emit, bench, name, lambda: load(mm.render(params), f"g{i}_{M}_{K}_{N}").kernel_fn,
                       a, b, ref, cub, fl)
elif part == "res":
    # fused residual add + norm vs the model's add then norm, eager and torch.compile
    import kernels
    for fam_name, shape in (("rmsnorm", (16384, 4096)), ("rmsnorm", (2048, 4096)), ("layernorm", (8192, 768)), ("layernorm", (4096, 768))):
        fam = kernels.get(fam_name, {"residual": True})
        kw = fam.make_inputs(shape, torch.bfloat16, "cuda", torch.Generator(device="cuda").manual_seed(0))
        base = fam.baseline_op()
        comp = torch.compile(base)
        nbytes, _ = fam.cost(shape, torch.bfloat16)
        e = bench(lambda: base(**kw)); c = bench(lambda: comp(**kw))
        emit(shape=f"{fam_name} {shape}", point="eager add+norm", us=e * 1e3, gbps=nbytes / e / 1e6)
        emit(shape=f"{fam_name} {shape}", point="compile add+norm", us=c * 1e3, gbps=nbytes / c / 1e6)
        for name, p in (("default", {}), ("rows4 w8", {"rows_per_prog": 4, "num_warps": 8}), ("persistent", {"grid": "persistent", "rows_per_prog": 2, "num_warps": 8})):
            try:
                m = load(fam.render(p), f"r_{fam_name}_{shape[0]}_{name.replace(' ', '_')}")
                out = m.kernel_fn(**kw); torch.cuda.synchronize()
                ref = fam.reference(**kw)
                err = (out.float() - ref.float()).abs().max().item()
                ms = bench(lambda: m.kernel_fn(**kw))
                emit(shape=f"{fam_name} {shape}", point=name, us=ms * 1e3, gbps=nbytes / ms / 1e6, vs_best=min(e, c) / ms, maxerr=err)
            except Exception as ex:
                emit(shape=f"{fam_name} {shape}", point=name, error=repr(ex)[:300])
elif part == "host":
    # Host time a call: back-to-back calls of a tiny problem (device work ~ a few us), wall / call.
    def per_call(f, n=3000):
        for _ in range(50): f()
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(n): f()
        w = (time.perf_counter() - t) / n; torch.cuda.synchronize(); return w * 1e6
    q = torch.randn(1, 12, 128, 64, device="cuda", dtype=torch.bfloat16); k = torch.randn_like(q); v = torch.randn_like(q)
    m = load(at.render(dict(at.DEFAULT, **at.HALF_OPENERS[0])), "h_attn")
    emit(op="attention 1x12x128x64", ours_us=per_call(lambda: m.kernel_fn(q, k, v, True, None)),
         sdpa_us=per_call(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)))
    a = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16); b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16).t()
    for nm, p in (("tiles tma", dict(mm.DEFAULT, block_k=64, loads="tma")), ("pointers", mm.DEFAULT), ("pers ws", dict(mm.DEFAULT, **mm.HALF_PERSISTENT))):
        g = load(mm.render(p), "h_mm" + nm.replace(" ", "_"))
        emit(op=f"matmul 64x256x256 {nm}", ours_us=per_call(lambda: g.kernel_fn(a, b)), aten_us=per_call(lambda: torch.matmul(a, b)))
    @triton.jit
    def _noop(x_ptr, n):
        pass
    emit(op="empty triton kernel, 2 args", us=per_call(lambda: _noop[(1,)](a, 1)))
