"""Sweep behind docs/benchmarks.md's ws_grid rows: the "ws" point's two grids (a program a tile;
one program an SM walking tiles) on an H100: values at ragged and strided shapes, then do_bench
against SDPA; docs/sweeps/h100_ws_persistent.json."""
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, "docs/sweeps")
import torch, triton
import torch.nn.functional as F
from kernels import attention as A
from sweeplib import attention_values, bencher, load, recorder, spy
emit = recorder("h100_ws_persistent.json")
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
ws = load(A.render(A.WS_OPENER), "ws_point")
taken = spy(ws, "_ws_launch")
CASES = [((2, 8, 1000, 128, 2, True), None, torch.bfloat16, False), ((1, 4, 300, 64, 4, False), 517, torch.bfloat16, False),
         ((2, 4, 777, 256, 1, True), None, torch.bfloat16, False), ((2, 8, 640, 128, 2, True), None, torch.float16, True),
         ((1, 4, 200, 128, 2, True), 300, torch.bfloat16, False), ((3, 6, 129, 64, 3, False), None, torch.float16, True)]
for pers in (True, False):
    ws.WS_PERSISTENT = pers
    attention_values(ws.kernel_fn, taken, emit, CASES, persistent=pers)
bench = bencher(15, 60)
for B, H, S, D, Hkv in [(4, 32, 4096, 128, 8), (8, 32, 2048, 128, 8), (1, 32, 2048, 128, 8), (8, 12, 1024, 64, 12),
                        (4, 32, 4096, 64, 8), (4, 16, 4096, 256, 8)]:
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
    t_s = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hkv != H))
    row = dict(shape=f"{B}x{H}x{S}x{D} kv{Hkv} causal", sdpa_us=t_s * 1e3)
    for pers in (True, False):
        ws.WS_PERSISTENT = pers
        t = bench(lambda: ws.kernel_fn(q, k, v, True, None))
        row["persistent_us" if pers else "per_tile_us"] = t * 1e3
        row["persistent_vs_sdpa" if pers else "per_tile_vs_sdpa"] = t_s / t
    emit(**row)
