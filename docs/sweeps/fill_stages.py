"""Exploratory sweep behind docs/benchmarks.md's fill-stages rows: the matmul family's
persistent opener (``HALF_PERSISTENT``: 128 x 256 tiles, warp-specialized TMA, fill on), whose
fill now gives a halved tile the pipeline stages its freed shared memory holds, against
torch.matmul (cuBLAS), at LLaMA-3-8B's projection shapes for 2048 tokens (the K/V projection's
narrow 1024-wide output is the one fill halves) and at 16384 tokens; with the same point
through plain (not warp-specialized) TMA, and the old rule (fill at 3 stages) beside it.

    OUT=dir python docs/sweeps/fill_stages.py SECONDS

triton.testing.do_bench medians (L2 flushed by do_bench), bf16, b a weight's transpose.
Writes $OUT/fill_stages.json.
"""
import os, sys, time
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import matmul as mm
from sweeplib import bencher, gemm_point, gemm_shape, load, recorder
budget = float(sys.argv[1])
t0 = time.time()
emit = recorder("fill_stages.json")
bench = bencher(25, 150)
HP = dict(mm.DEFAULT, **mm.HALF_PERSISTENT)
POINTS = {"opener (fill, stages raised)": mm.render(HP),
          "opener through plain TMA": mm.render(dict(HP, loads="tma")),
          "opener, fill at its 3 stages (the old rule)":
              mm.render(HP).replace("stages = max(stages, min(MAX_FILL_STAGES, fits))", "pass"),
          "opener without fill": mm.render(dict(HP, fill=False))}
assert POINTS["opener, fill at its 3 stages (the old rule)"] != POINTS["opener (fill, stages raised)"]
mods = {n: load(src, f"fs{i}") for i, (n, src) in enumerate(POINTS.items())}
for (M, K, N) in ((2048, 4096, 1024), (2048, 4096, 4096), (2048, 4096, 14336), (2048, 14336, 4096),
                  (16384, 4096, 1024), (4096, 4096, 4096)):
    if time.time() - t0 > budget: break
    a, b, ref, cub, fl = gemm_shape(emit, bench, M, K, N)
    for name, m in mods.items():
        gemm_point(emit, bench, name, lambda: m.kernel_fn, a, b, ref, cub, fl)
