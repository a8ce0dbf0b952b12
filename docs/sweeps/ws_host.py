"""Host time of the warp-specialized attention launcher (docs/benchmarks.md, "the launcher's
host time, profiled"): 300 back-to-back calls without a sync (launches queue while the GPU
runs) at LLaMA-3-8B's 1 x 2048 and GPT-2's 8 x 12 x 1024 x 64, against SDPA; BASE=<a rendered
source> adds that launcher's rows; then cProfile of the persistent launcher by own time and by
cumulative time. Writes $OUT/ws_host.txt."""
import cProfile, io, os, pstats, sys, time
sys.path.insert(0, os.getcwd()); sys.path.insert(0, "docs/sweeps")
import torch
import torch.nn.functional as F
from kernels import attention as A
from sweeplib import OUT, load

ws = load(A.render(A.WS_OPENER), "ws_point")
base = load(open(os.environ["BASE"]).read(), "ws_base") if os.environ.get("BASE") else None
out = open(os.path.join(OUT, "ws_host.txt"), "w")


def host_us(name, f, n=300):
    for _ in range(20):
        f()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n):
        f()
    us = (time.perf_counter() - t0) / n * 1e6; torch.cuda.synchronize()
    print(name, "host us", round(us, 1), file=out, flush=True)


q = torch.randn(1, 32, 2048, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 8, 2048, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
x = [torch.randn(8, 12, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
print(torch.cuda.get_device_name(), file=out)
for pers in (True, False):
    for label, m in (("ws", ws), ("base", base)):
        if m is not None:
            m.WS_PERSISTENT = pers
            host_us(f"{label} 1x32x2048x128 persistent={pers}", lambda: m.kernel_fn(q, k, v, True, None))
            host_us(f"{label} 8x12x1024x64 persistent={pers}", lambda: m.kernel_fn(*x, True, None))
host_us("sdpa 1x32x2048x128", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
host_us("sdpa 8x12x1024x64", lambda: F.scaled_dot_product_attention(*x, is_causal=True))
ws.WS_PERSISTENT = True
for sort in ("tottime", "cumulative"):
    pr = cProfile.Profile(); pr.enable()
    for _ in range(300):
        ws.kernel_fn(q, k, v, True, None)
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats(sort).print_stats(30)
    print(s.getvalue()[:9000], file=out)
out.close()
