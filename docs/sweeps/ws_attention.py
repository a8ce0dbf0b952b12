"""The rendered "ws" point on a Hopper GPU: values at ragged and strided shapes (the Gluon path
taken), then do_bench against SDPA and the Triton opener."""
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, "docs/sweeps")
import torch, triton
import torch.nn.functional as F
from kernels import attention as A
from sweeplib import attention_values, bencher, load, recorder, spy
emit = recorder("h100_ws_attention.json")
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
ws = load(A.render(A.WS_OPENER), "ws_point")
tp = load(A.render(A.HALF_OPENERS[0]), "tma_point")
taken = spy(ws, "_ws_launch")
CASES = [((2, 8, 1000, 128, 2, True), None, torch.bfloat16, False), ((1, 4, 300, 64, 4, False), 517, torch.bfloat16, False),
         ((2, 4, 777, 256, 1, True), None, torch.bfloat16, False), ((1, 8, 512, 128, 8, True), None, torch.float16, False),
         ((2, 8, 640, 128, 2, True), None, torch.bfloat16, True), ((1, 4, 200, 128, 2, True), 300, torch.bfloat16, False),
         ((3, 6, 129, 64, 3, False), None, torch.float16, True), ((1, 2, 64, 128, 1, True), None, torch.bfloat16, False)]
attention_values(ws.kernel_fn, taken, emit, CASES)
bench = bencher(20, 80)
for B, H, S, D, Hkv in [(4, 32, 4096, 128, 8), (4, 32, 4096, 64, 8), (4, 16, 4096, 256, 8), (8, 12, 1024, 64, 12),
                        (1, 32, 2048, 128, 8), (8, 32, 2048, 128, 8)]:
    for causal in ((True, False) if (B, S, D) == (4, 4096, 128) else (True,)):
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
        fl = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        t_s = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != H))
        t_w = bench(lambda: ws.kernel_fn(q, k, v, causal, None))
        t_t = bench(lambda: tp.kernel_fn(q, k, v, causal, None))
        emit(shape=f"{B}x{H}x{S}x{D} kv{Hkv} {'causal' if causal else 'full'}", sdpa_us=t_s * 1e3, ws_us=t_w * 1e3,
             tma_us=t_t * 1e3, ws_vs_sdpa=t_s / t_w, tma_vs_sdpa=t_s / t_t, ws_tflops=fl / t_w / 1e9)
