"""Time chosen points of a family's search space at one shape: where is the fast region?

Exploration for whoever designs a family's space and starter, not the loop: each point is checked
against the reference at this one shape only (relative L2 error under ``--max-rel``) and timed with
the loop's own protocol (engine.bench.time_call: events, L2 flushed, rotated inputs, median). A
point found fast here is not a result: a kernel counts only when the loop keeps it after all five
verifier stages. Run one family per process: a point that corrupts the GPU context ends only it.

    python -m engine.probe --family matmul --shape 4096x4096x4096 \\
        --grid "block_n=128,256 loads=pointers,tma,tma_ws" --out probe.json

``--grid`` takes "axis=v1,v2 axis=v1" (the product, laid over the family's default point); give
it several times for a union. Prints one line per point, fastest last; ``--out`` gets JSON lines.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time


def _value(text: str, like):
    if isinstance(like, bool):
        return text.lower() in ("1", "true", "yes")
    if isinstance(like, int):
        return int(text)
    if isinstance(like, float):
        return float(text)
    return text


def points(fam, grids: list[str]) -> list[dict]:
    """The union of the products each grid spec names, over ``fam.default``, unique, in order."""
    out, seen = [], set()
    for spec in grids or [""]:
        axes = []
        for item in spec.split():
            key, _, vals = item.partition("=")
            if key not in fam.space:
                raise SystemExit(f"{fam.name} has no axis {key!r}; axes: {', '.join(fam.space)}")
            like = fam.default[key]
            axes.append([(key, _value(v, like)) for v in vals.split(",")])
        for combo in itertools.product(*axes):
            p = dict(fam.default)
            p.update(combo)
            k = json.dumps(p, sort_keys=True)
            if k not in seen:
                seen.add(k)
                out.append(p)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.probe", description=__doc__.split("\n")[0])
    ap.add_argument("--family", required=True)
    ap.add_argument("--shape", required=True, help="e.g. 4096x4096x4096")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--grid", action="append", default=[])
    ap.add_argument("--max-rel", type=float, default=2e-2, help="relative L2 error allowed")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch
    import kernels
    from engine import bench, verify

    fam = kernels.get(a.family)
    shape = tuple(int(s) for s in a.shape.split("x"))
    dtype = getattr(torch, a.dtype)
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if gpu else 0
    nbytes, flops = fam.cost(shape, dtype)
    gen = torch.Generator(device=device).manual_seed(7)
    sets = [fam.make_inputs(shape, dtype, device, gen)
            for _ in range(bench.input_set_count(nbytes, l2, gpu))]
    ref = fam.reference(**sets[0]).float()
    out = open(a.out, "a") if a.out else None
    workdir = tempfile.mkdtemp(prefix="nightshift-probe-")
    if not gpu:
        print("no GPU: interpreter timings, not GPU performance", file=sys.stderr)

    def record(name, params, res, err=None):
        row = {"family": fam.name, "shape": list(shape), "dtype": a.dtype, "name": name,
               "params": params, "us": res and res["us"], "noise": res and res["noise"],
               "tflops": res and flops / res["us"] / 1e6, "error": err}
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
        return row

    rows = [record("reference", None, bench.time_call(fam.reference, sets, gpu))]
    print(f"{fam.name} {a.shape} {a.dtype}: reference {rows[0]['us']:.1f} us "
          f"({rows[0]['tflops']:.0f} TFLOP/s)", flush=True)
    for p in points(fam, a.grid):
        t0 = time.perf_counter()
        try:
            fn = verify.load_candidate(fam.render(p), workdir)
            got = fn(**sets[0]).float()
            rel = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
            if not rel <= a.max_rel:
                raise ValueError(f"relative error {rel:.3g}")
            row = record("point", p, bench.time_call(fn, sets, gpu))
        except Exception as e:                              # one bad point is one line
            msg = (str(e).strip().splitlines() or [""])[0][:160]
            row = record("point", p, None, f"{type(e).__name__}: {msg}")
        rows.append(row)
        diff = {k: v for k, v in p.items() if v != fam.default[k]}
        what = f"{row['us']:.1f} us {row['us'] and rows[0]['us'] / row['us']:.3f}x ref" \
            if row["us"] else row["error"]
        print(f"  {diff or 'default'}: {what} ({time.perf_counter() - t0:.1f} s)", flush=True)
    ok = sorted((r for r in rows[1:] if r["us"]), key=lambda r: -r["us"])
    for r in ok[-5:]:
        print(f"fast: {r['us']:.1f} us ({rows[0]['us'] / r['us']:.3f}x ref) {r['params']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
