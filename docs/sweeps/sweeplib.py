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
    """The candidate source ``src`` written to a temporary file and imported as ``name``."""
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
