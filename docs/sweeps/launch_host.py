"""Host time a call, Triton's launch path against the compiled kernel launched directly
(engine/kernel_runtime.py ``fast_launches``, which the judge and the runtime apply to every
loaded kernel), for each family's kernels at a tiny shape (the device work a few us, so the
wall time a call is the host's): back-to-back calls, wall time / call. Each row also checks
that the two launch paths give bitwise-equal outputs on three fresh input sets, and at one
real shape.

    OUT=dir python docs/sweeps/launch_host.py

Writes $OUT/launch_host.json.
"""
import os, sys, time
import torch
import torch.nn.functional as F
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels
from kernels import attention as at, matmul as mm
from engine.kernel_runtime import fast_launches
from sweeplib import load, recorder
emit = recorder("launch_host.json")


def per_call(f, n=2000):
    for _ in range(50): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): f()
    w = (time.perf_counter() - t) / n; torch.cuda.synchronize(); return w * 1e6


# (row name, family, spec, point, tiny shape, real shape, the op's torch call or None)
CASES = [
    ("attention TMA opener", "attention", {}, dict(at.DEFAULT, **at.HALF_OPENERS[0]), (1, 12, 128, 64, 12, 1), (4, 32, 2048, 128, 8, 1),
     lambda i: F.scaled_dot_product_attention(i["q"], i["k"], i["v"], is_causal=True)),
    ("attention pointers", "attention", {}, dict(at.DEFAULT), (1, 12, 128, 64, 12, 1), (1, 12, 1024, 64, 12, 1), None),
    ("attention MLA split_d TMA", "attention", {"v_head_dim": 128}, dict(at.DEFAULT, **at.HALF_OPENERS[1], split_d=True),
     (1, 16, 128, 192, 16, 1), (1, 16, 2048, 192, 16, 1), None),
    ("matmul persistent TMA ws", "matmul", {}, dict(mm.DEFAULT, **mm.HALF_PERSISTENT), (64, 256, 256), (2048, 4096, 4096),
     lambda i: torch.matmul(i["a"], i["b"])),
    ("matmul tiles TMA", "matmul", {}, dict(mm.DEFAULT, block_k=64, loads="tma"), (64, 256, 256), (2048, 4096, 1024), None),
    ("matmul pointers", "matmul", {}, dict(mm.DEFAULT), (64, 256, 256), (1024, 1024, 1024), None),
    ("rmsnorm", "rmsnorm", {}, {}, (64, 768), (8192, 4096), None),
    ("rmsnorm residual", "rmsnorm", {"residual": True}, {}, (64, 768), (8192, 4096), None),
    ("layernorm", "layernorm", {}, {}, (64, 768), (8192, 768),
     lambda i: F.layer_norm(i["x"], i["x"].shape[-1:], i["weight"], i["bias"], i["eps"])),
    ("softmax", "softmax", {}, {}, (64, 512), (8192, 4096), lambda i: torch.softmax(i["x"], -1)),
    ("rotary", "rotary", {}, {}, (1, 12, 128, 64), (4, 32, 2048, 128), None),
    ("cross_entropy", "cross_entropy", {}, {}, (64, 1024), (4096, 32000), None),
]
for name, fam_name, spec, point, tiny, real, torch_op in CASES:
    try:
        fam = kernels.get(fam_name, spec)
        src = fam.render(dict(fam.default, **point))
        plain = load(src, "lh_plain_" + name.replace(" ", "_"))
        fast = load(src, "lh_fast_" + name.replace(" ", "_"))
        wrapped = fast_launches(fast)
        same = True
        for shape in (tiny, real):
            for seed in range(3):
                inp = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator(device="cuda").manual_seed(seed))
                a, b = plain.kernel_fn(**inp), fast.kernel_fn(**inp)
                same &= all(torch.equal(x, y) for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)))
        inp = fam.make_inputs(tiny, "bfloat16", "cuda", torch.Generator(device="cuda").manual_seed(0))
        row = dict(op=name, wrapped=wrapped, equal=bool(same),
                   triton_path_us=per_call(lambda: plain.kernel_fn(**inp)),
                   compiled_kernel_us=per_call(lambda: fast.kernel_fn(**inp)))
        if torch_op is not None:
            row["torch_us"] = per_call(lambda: torch_op(inp))
        emit(**row)
    except Exception as e:
        emit(op=name, error=repr(e)[:400])
