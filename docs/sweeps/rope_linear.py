"""Exploratory sweep behind docs/benchmarks.md's "RoPE in the q/k projection" section: the rotary
{"linear": true} kernel's TMA points (one or two heads a tile, warp-specialized or not) against
what the model runs, the projection then the rotation (eager: cuBLAS and two elementwise passes;
torch.compile default and max-autotune-no-cudagraphs), cuBLAS's projection alone (the floor an
unfused rotation adds to) and the matmul family's opener on it. LLaMA-3-8B's q and k at 1 x 2048 and 8 x 2048, bf16.

    OUT=dir [SHAPES=BxSxKxHxDh,...] [STYLE=interleaved] python docs/sweeps/rope_linear.py SECONDS

STYLE=interleaved times the interleaved pairs (Meta's LLaMA, gpt-fast, GPT-J) instead of
rotate-half, its JSON rope_linear_interleaved.json.

triton.testing.do_bench medians (L2 flushed by do_bench), not the judge's timing; every point's
values checked against the fp32 reference first. Writes $OUT/rope_linear.json.
"""
import os, sys, time
import torch
import torch.nn.functional as F
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels
from kernels import matmul as MM
from kernels import rotary as R
from sweeplib import bencher, load, recorder
budget = float(sys.argv[1])
t0 = time.time()
STYLE = os.environ.get("STYLE", "half")
emit = recorder("rope_linear.json" if STYLE == "half" else f"rope_linear_{STYLE}.json")
bench = bencher(10, 100)
fam = kernels.get("rotary", {"linear": True, **({"style": STYLE} if STYLE != "half" else {})})
T = dict(R.LINEAR_DEFAULT, loads="tma_ws", block_m=128, block_k=64, num_warps=8, num_stages=3)
POINTS = [("tma_ws 128 x 2 heads k64 w8 s3", dict(T, heads=2)),
          ("tma 128 x 2 heads k64 w8 s3", dict(T, heads=2, loads="tma")),
          ("tma_ws 128 x 1 head k64 w8 s4", dict(T, heads=1, num_stages=4)),
          ("tma 128 x 1 head k64 w8 s4", dict(T, heads=1, num_stages=4, loads="tma")),
          ("tma_ws 128 x 2 heads k32 w8 s4", dict(T, heads=2, block_k=32, num_stages=4))]
mods = {name: load(fam.render(p), f"rope_lin_{i}") for i, (name, p) in enumerate(POINTS)}


# the matmul family's bf16 opener (persistent, warp-specialized TMA, 128 x 256 x 64) on the
# projection alone: where our GEMM stands against cuBLAS at this shape
mm = load(kernels.get("matmul").render(MM.HALF_PERSISTENT), "rope_lin_mm")


def model(h, w, cos, sin):
    return R.linear_reference(h, w, cos, sin, style=STYLE)


compiled = {m: torch.compile(model, mode=m, dynamic=False) for m in ("default", "max-autotune-no-cudagraphs")}
SHAPES = ((1, 2048, 4096, 32, 128), (1, 2048, 4096, 8, 128), (8, 2048, 4096, 32, 128),
          (8, 2048, 4096, 8, 128))
if os.environ.get("SHAPES"):           # SHAPES=1x2048x4096x8x128,...: these alone
    SHAPES = [tuple(int(v) for v in s.split("x")) for s in os.environ["SHAPES"].split(",")]
for B, S, K, H, Dh in SHAPES:
    if time.time() - t0 > budget:
        break
    shape = f"{B}x{S}x{K}x{H}x{Dh}"
    g = torch.Generator(device="cuda").manual_seed(0)
    inp = fam.make_inputs((B, S, K, H, Dh), "bfloat16", "cuda", g)
    h, w, cos, sin = inp["hidden"], inp["weight"], inp["cos"], inp["sin"]
    ref = R.linear_reference(h.float(), w.float(), cos.float(), sin.float(), style=STYLE)
    eager = bench(lambda: model(h, w, cos, sin))
    proj = bench(lambda: F.linear(h, w))
    emit(shape=shape, point="eager (cuBLAS + rotation)", us=eager * 1e3)
    emit(shape=shape, point="cuBLAS projection alone", us=proj * 1e3)
    try:
        wt = w.t(); mm.kernel_fn(h.reshape(-1, K), wt); ms = bench(lambda: mm.kernel_fn(h.reshape(-1, K), wt))
        emit(shape=shape, point="matmul family's opener, projection alone", us=ms * 1e3, vs_cublas=proj / ms)
    except Exception as e:
        emit(shape=shape, point="matmul family's opener, projection alone", error=repr(e)[:300])
    base = eager
    for mode, fn in compiled.items():
        try:
            fn(h, w, cos, sin); ms = bench(lambda: fn(h, w, cos, sin)); base = min(base, ms)
            emit(shape=shape, point=f"compile {mode}", us=ms * 1e3)
        except Exception as e:
            emit(shape=shape, point=f"compile {mode}", error=repr(e)[:300])
    for name, m in mods.items():
        if time.time() - t0 > budget:
            break
        try:
            y = m.kernel_fn(h, w, cos, sin); torch.cuda.synchronize()
            err = ((y.float() - ref).norm() / ref.norm()).item()
            ms = bench(lambda: m.kernel_fn(h, w, cos, sin))
            emit(shape=shape, point=name, us=ms * 1e3, vs_faster_baseline=base / ms,
                 vs_projection_alone=proj / ms, relerr=err, stride=list(y.stride()))
        except Exception as e:
            emit(shape=shape, point=name, error=repr(e)[:400])
