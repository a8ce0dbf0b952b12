"""What the exploratory sweeps in this folder share: rows written to $OUT as they come, a
candidate source loaded as a module, do_bench medians and the memory a call allocates."""
import importlib.util, json, os, tempfile
import torch, triton

OUT = os.environ.get("OUT", tempfile.gettempdir())


def recorder(filename):
    """emit(**row): prints the row and rewrites $OUT/filename with every row so far (a sweep
    cut off by its time limit keeps what it measured)."""
    rows = []
    def emit(**r):
        rows.append(r); print(r, flush=True)
        json.dump(rows, open(os.path.join(OUT, filename), "w"), indent=1)
    return emit


def load(src, name):
    """The candidate source ``src`` written to a temporary file and imported as ``name``, after
    the loop's own static check (engine/allowlist.py): a sweep times only what the loop could
    run. (A launcher that used vars() ran in a sweep and failed every experiment in the loop.)"""
    import ast
    from engine.verify import static_check
    fn = next((n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "kernel_fn"), None)
    why = static_check(src, tuple(a.arg for a in fn.args.args) if fn else ())
    if why:
        raise ValueError(f"{name}: the loop's static check rejects this source: {why}")
    path = os.path.join(tempfile.gettempdir(), f"sweep_{name}.py"); open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m); return m


def bencher(warmup, rep):
    """f -> median ms of triton.testing.do_bench (the L2 flushed between calls)."""
    return lambda f: triton.testing.do_bench(f, warmup=warmup, rep=rep, return_mode="median")


def peak_mb(f):
    """Memory a call allocates beyond what is live before it (MB): the logits and their copies."""
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); before = torch.cuda.memory_allocated()
    f(); torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def gemm_shape(emit, bench, M, K, N):
    """bf16 a [M, K] and b a weight's transpose [K, N]; cuBLAS timed and its row written.
    Returns (a, b, a @ b, cuBLAS ms, flops)."""
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t()
    ref = a @ b; cub = bench(lambda: torch.matmul(a, b)); fl = 2 * M * N * K
    emit(shape=f"{M}x{K}x{N}", point="cuBLAS", us=cub * 1e3, tflops=fl / cub / 1e9, vs_cublas=1.0)
    return a, b, ref, cub, fl


def gemm_point(emit, bench, name, make, a, b, ref, cub, fl):
    """One candidate's row at gemm_shape's operands: ``make()`` gives its kernel_fn (loading it
    may fail too); its relative error against cuBLAS's product and its time, or the error."""
    shape = f"{a.shape[0]}x{a.shape[1]}x{b.shape[1]}"
    try:
        fn = make()
        out = fn(a, b); torch.cuda.synchronize()
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        ms = bench(lambda: fn(a, b))
        emit(shape=shape, point=name, us=ms * 1e3, tflops=fl / ms / 1e9, vs_cublas=cub / ms, relerr=err)
    except Exception as e:
        emit(shape=shape, point=name, error=repr(e)[:400])


def spy(module, name):
    """Wraps module.name (a launcher) to record each call; returns the list it appends to."""
    taken, orig = [], getattr(module, name)
    setattr(module, name, lambda *a, **k: (taken.append(1), orig(*a, **k))[1])
    return taken


def ws_cases():
    """The ragged and strided attention cases the Gluon path is checked at: ((B, H, S, D, Hkv,
    causal), Sk or None, dtype, v as a transposed view): lengths 64-4000, keys longer than
    queries, 1-8 KV heads, head dims 64/128/256, fp16 and bf16."""
    bf, fp = torch.bfloat16, torch.float16
    return [((2, 8, 1000, 128, 2, True), None, bf, False), ((1, 4, 300, 64, 4, False), 517, bf, False),
            ((2, 4, 777, 256, 1, True), None, bf, False), ((2, 8, 640, 128, 2, True), None, fp, True),
            ((1, 4, 200, 128, 2, True), 300, bf, False), ((3, 6, 129, 64, 3, False), None, fp, True),
            ((1, 2, 64, 128, 1, True), None, bf, False), ((5, 8, 4000, 128, 2, True), None, bf, False)]


def attention_values(kernel_fn, taken, emit, cases, **tags):
    """Each case ((B, H, S, D, Hkv, causal), Sk or None, dtype, v as a transposed view): the
    kernel's largest error against float64 SDPA beside SDPA's own, and whether ``taken`` (a spy
    on the path under test) grew."""
    import torch.nn.functional as F
    for (B, H, S, D, Hkv, causal), sk, dt, vt in cases:
        sk = sk or S
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(B, H, S, D, device="cuda", dtype=dt, generator=g)
        k = torch.randn(B, Hkv, sk, D, device="cuda", dtype=dt, generator=g)
        if vt:   # v as a fused projection leaves it: [B, S, Hkv, D] viewed [B, Hkv, S, D]
            v = torch.randn(B, sk, Hkv, D, device="cuda", dtype=dt, generator=g).transpose(1, 2)
        else:
            v = torch.randn(B, Hkv, sk, D, device="cuda", dtype=dt, generator=g)
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                             enable_gqa=True)
        taken.clear()
        o = kernel_fn(q, k, v, causal, None); torch.cuda.synchronize()
        e_sdpa = (F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True).double()
                  - ref).abs().max().item()
        emit(**tags, case=f"{B}x{H}x{S}x{D} kv{Hkv} sk{sk} causal={causal} {dt} vT={vt}",
             gluon_path=bool(taken), maxerr=(o.double() - ref).abs().max().item(), sdpa_maxerr=e_sdpa)
