"""``python -m engine.regionbench FILE... [--points JSON]``: a model file's regions (a KernelBench
problem: ``Model``, ``get_inputs``, ``get_init_inputs``) captured at its own shapes, and each
region's generated kernel timed at several points of its space against the region's eager
reference, with the largest error against the float64 reference. One line per point.

Timing is engine/bench.py's (device events, L2 flushed, two input sets rotated, medians of
three rounds). It loads our own generated kernels in this process, so it is a tool for reading
a space, not a judge: the loop's verdicts come from engine/judge.py. Without a GPU the figures
are interpreter timings and say nothing about speed."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

# the points a convolution's implicit GEMM was read at (kernels/region.py: WINDOW_MIN_CI)
CONV_POINTS = [
    {"conv_loop": "dot"},
    {"conv_loop": "window"},
    {"conv_loop": "window", "conv_layout": "channels"},
    {"conv_loop": "window", "conv_layout": "channels", "block_k": 64},
    {"conv_loop": "window", "conv_layout": "channels", "num_stages": 4},
    {"conv_loop": "window", "conv_layout": "channels", "block_m": 128, "block_n": 64,
     "num_warps": 4, "num_stages": 4},
    {"conv_loop": "window", "conv_layout": "channels", "block_m": 256, "block_n": 128,
     "num_warps": 8},
    {"conv_loop": "window", "block_k": 64},
    {"conv_loop": "dot", "conv_layout": "channels"},
]


def _problem(path: str):
    if not os.path.isfile(path):
        raise SystemExit(f"regionbench: no such file: {path}")
    spec = importlib.util.spec_from_file_location("problem", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"regionbench: {path} is not a Python file")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, name):
            raise SystemExit(f"regionbench: {path} has no {name}")
    return mod


def main(argv=None, log=print) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.regionbench", description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--points", help="JSON list of points (default: the convolution points, "
                                    "tried on convolution regions only)")
    p.add_argument("--dtype", default="float32")
    a = p.parse_args(argv)
    import torch
    import kernels
    from engine import capture, match, regions
    from engine.benchfamilies import _Loader, _time
    from kernels import region as R
    gpu = torch.cuda.is_available()
    dev = "cuda" if gpu else "cpu"
    dtype = getattr(torch, a.dtype)
    points = json.loads(a.points) if a.points else None
    base = {"fp32_dot": "tf32"} if a.dtype == "float32" else {}
    loader = _Loader()
    for path in a.files:
        mod = _problem(path)
        torch.manual_seed(0)
        model = mod.Model(*mod.get_init_inputs()).to(dev).eval()
        inputs = [x.to(dev) if torch.is_tensor(x) else x for x in mod.get_inputs()]
        t0 = time.time()
        g = capture.capture(model, inputs).graphs[0]
        found = regions.find(g, match.find(g))
        del model, inputs
        for r in found.regions:
            if points is None and not R.conv_dot_ok(r.spec):
                continue
            fam = kernels.get("region", r.spec)
            gen = torch.Generator(device=dev).manual_seed(1)
            sets = [fam.make_inputs(r.shape, dtype, dev, gen) for _ in range(2)]
            eager = _time(fam.reference, sets, gpu)
            want = fam.reference(**sets[0]).double()
            _, flops = fam.cost(r.shape, dtype)
            log(f"{path.rsplit('/', 1)[-1]} {r.name} shape={list(r.shape)} flops={flops:.3g} "
                f"eager {eager['us']:.1f} us (capture {time.time() - t0:.0f} s)"
                + ("" if gpu else " [interpreter timings]"))
            for pt in points if points is not None else CONV_POINTS:
                try:
                    fn = loader.load(fam.render({**base, **pt}), fam.arg_names)
                    res = _time(fn, sets, gpu)
                    err = (fn(**sets[0]).double() - want).abs().max().item()
                    log(f"  {json.dumps(pt)}: {res['us']:.1f} us  {flops / res['us'] / 1e6:.0f} "
                        f"TFLOP/s  vs eager {eager['us'] / res['us']:.2f}x  max err {err:.2e}")
                except Exception as e:          # one point failing is one line
                    log(f"  {json.dumps(pt)}: failed {type(e).__name__}: {str(e)[:200]}")
            del sets
            if gpu:
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
