"""Where the interleaved rotary+linear kernel spends its time against rotate-half's (docs/
benchmarks.md, "Declared layouts on a GPU"): LLaMA-3-8B's q at 8 x 2048, the TMA point with one
head a tile (k 64, 4 stages), rotate-half and interleaved as rendered, then interleaved variants:
the tables read lane by lane, 2jj and 2jj + 1 apart (the kernel before its table rows were read
whole and split), and that with the accumulator's even/odd split skipped too (wrong values on
purpose: timed only to find the cost, never judged or kept).

Its first run, on the kernel before the fix, with the tables read at rotate-half's lanes as the
variant (H100; docs/sweeps/h100_rope_interleaved_probe.json): rotate-half 842.9 us, interleaved
1,820.0, tables at rotate-half's lanes 861.1, the split skipped 1,851.5.

    OUT=dir python docs/sweeps/rope_interleaved_probe.py

triton.testing.do_bench medians (L2 flushed by do_bench). Writes $OUT/rope_interleaved_probe.json.
"""
import os, sys
import torch
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels
from kernels import rotary as R
from sweeplib import bencher, load, recorder
emit = recorder("rope_interleaved_probe.json")
bench = bencher(5, 40)
SHAPE = (8, 2048, 4096, 32, 128)
POINT = dict(R.LINEAR_DEFAULT, loads="tma", block_m=128, block_k=64, num_warps=8, num_stages=4, heads=1)
SPLIT = ("        if STEP == 2:\n"
         "            acc1, acc2 = tl.split(tl.reshape(acc, (BLOCK_M * HEADS, HALF, 2)))")
ROWS = "        if STEP == 2:\n            dd = tl.arange(0, 2 * HALF)"
for style in ("half", "interleaved"):
    fam = kernels.get("rotary", {"linear": True, **({"style": style} if style != "half" else {})})
    inp = fam.make_inputs(SHAPE, "bfloat16", "cuda", torch.Generator(device="cuda").manual_seed(0))
    src = fam.render(POINT)
    variants = {"as rendered": src}
    if style == "interleaved":
        lane_by_lane = src.replace(ROWS, ROWS.replace("STEP == 2", "STEP == 3"))
        variants["tables lane by lane"] = lane_by_lane
        variants["tables lane by lane, no even/odd split"] = lane_by_lane.replace(
            SPLIT, SPLIT.replace("STEP == 2", "STEP == 3"))
    for i, (name, v) in enumerate(variants.items()):
        if name != "as rendered" and v == src:
            emit(style=style, variant=name, error="the replacement found nothing")
            continue
        try:
            m = load(v, f"ilp_{style}_{i}")
            m.kernel_fn(**inp); torch.cuda.synchronize()
            emit(style=style, variant=name, us=bench(lambda: m.kernel_fn(**inp)) * 1e3)
        except Exception as e:
            emit(style=style, variant=name, error=repr(e)[:300])
