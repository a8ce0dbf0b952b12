"""Exploratory sweep behind docs/benchmarks.md's LM-head transform rows: the cross_entropy
{"linear": true} kernel with what real models do to their logits before the loss, in the tiles'
epilogue (a bias: Phi-2; a scale: Command-R; a soft cap: Gemma 2), at those models' head widths,
against what the model runs (the head's GEMM and bias, the scale and cap in bf16, the fp32 upcast,
the loss: eager and torch.compile default) and the same kernel without the transform; with the
memory each call allocates beyond its inputs (peak_mb).

    OUT=dir python docs/sweeps/lm_head_transforms.py SECONDS

triton.testing.do_bench medians (L2 flushed by do_bench), bf16, not the judge's timing.
Writes $OUT/lm_head_transforms.json.
"""
import os, sys, time
import torch
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels
from sweeplib import bencher, load, peak_mb, recorder
budget = float(sys.argv[1])
t0 = time.time()
emit = recorder("lm_head_transforms.json")
bench = bencher(10, 100)
POINT = dict(loads="tma", block_n=256, block_k=64, num_warps=8, num_stages=3)   # the kept LLaMA point
CASES = [  # name, head spec, (tokens, K, V)
    ("Gemma-2-2B soft cap 30", {"softcap": 30.0}, (4096, 2304, 256000)),
    ("Phi-2 head bias", {"bias": True}, (4096, 2560, 51200)),
    ("Command-R scale 0.0625", {"scale": 0.0625}, (2048, 8192, 256000)),
]
for i, (name, head, shape) in enumerate(CASES):
    if time.time() - t0 > budget: break
    spec = dict(head, linear=True, upcast=True)
    fam = kernels.get("cross_entropy", spec)
    plain = kernels.get("cross_entropy", {"linear": True, "upcast": True})
    kw = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator(device="cuda").manual_seed(0))
    args = [kw[a] for a in fam.arg_names]
    n, k, v = shape; fl = 2 * n * k * v
    ref = fam.reference(**kw).item()
    base = fam.baseline_op()
    sh = "x".join(map(str, shape))
    ms_e = bench(lambda: base(*args)); emit(case=name, shape=sh, point="eager", us=ms_e * 1e3, peak_mb=peak_mb(lambda: base(*args)))
    ms_c = None
    try:
        torch._dynamo.reset()
        f = torch.compile(base); f(*args); torch.cuda.synchronize()
        ms_c = bench(lambda: f(*args)); emit(case=name, shape=sh, point="compile default", us=ms_c * 1e3, peak_mb=peak_mb(lambda: f(*args)))
    except Exception as e:
        emit(case=name, shape=sh, point="compile default", error=repr(e)[:300])
    for label, fm, a in (("fused, transform in the epilogue", fam, args), ("fused, no transform", plain, args[:3])):
        try:
            fn = load(fm.render(POINT), f"c{i}{label[:8].replace(' ', '').replace(',', '')}").kernel_fn
            out = fn(*a).item(); torch.cuda.synchronize()
            ms = bench(lambda: fn(*a))
            emit(case=name, shape=sh, point=label, us=ms * 1e3, tflops=fl / ms / 1e9, vs_compile=(ms_c / ms) if ms_c else None,
                 vs_eager=ms_e / ms, rel_err=abs(out - ref) / abs(ref) if fm is fam else None, peak_mb=peak_mb(lambda: fn(*a)))
        except Exception as e:
            emit(case=name, shape=sh, point=label, error=repr(e)[:400])
