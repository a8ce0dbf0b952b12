"""Exploratory sweeps of the matmul and attention families' points against the vendor kernels.

    python docs/sweeps/points.py gemm [SECONDS] [--points "NAME;NAME;..."] [--shapes "MxKxN;..."] > log
    python docs/sweeps/points.py attention [SECONDS] [--points "NAME;..."]

Each point is rendered from its name, loaded, checked against torch's result and timed with
triton.testing.do_bench (median, L2 flushed by do_bench, 50/25 warm-up and 300/200 ms of
repetitions) beside torch.matmul (cuBLAS) or F.scaled_dot_product_attention at the same shapes,
bf16. This is not the judge's timing (no verifier, no rounds, no rotated inputs): it chooses
which points become a family's openers; the loop then times them properly. It is the script
that produced docs/sweeps/h100_*.json; `python -m engine.probe` asks the same question one shape
at a time with the loop's own timing (events, rotated inputs) and is the tool for new sweeps. Writes
$OUT/<what>_sweep.json (one row per shape and point: us, TFLOP/s, ratio to the vendor kernel,
max error).

A GEMM point's name: grid ("tiles", "pers" or "splitkN", pointers), loads ("tma", "tma_ws",
"ptr"), tile "BMxBNxBK", stages "sS", warps "wW", then optional "sub" (subtiled store), "gG"
(group_m), "ppsP" (programs an SM). An attention point's: "BMxBN", "wW", "sS", then optional
"exp2", "tma"/"ptr", "rev"/"fwd", "split"; "default" alone is the family's starter.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.getcwd())
from engine.verify import load_candidate    # noqa: E402
from kernels import attention as at          # noqa: E402
from kernels import matmul as mm             # noqa: E402

GEMM_SHAPES = [(4096, 4096, 4096), (4096, 11008, 4096), (8192, 4096, 14336), (16, 4096, 4096),
               (4096, 4096, 11008), (16, 4096, 14336)]          # (M, K, N); b is W^T, K-major
ATTN_SHAPES = [(4, 32, 4096, 128, 8), (4, 32, 4096, 64, 8), (4, 16, 4096, 256, 8)]  # causal
GEMM_POINTS = ("tiles tma 128x128x64 s3 w4;pers tma_ws 128x256x64 s3 w8 sub g16;"
               "pers tma_ws 128x256x64 s4 w8 sub g16;pers tma 128x256x64 s3 w8 sub g16")
DECODE_POINTS = "tiles tma 16x32x128 s5 w4;splitk4 ptr 64x64x64 s3 w4;tiles tma 16x16x128 s5 w2"
ATTN_POINTS = ("default;64x64 w4 s3 exp2 tma rev split;128x64 w8 s4 exp2 tma fwd split;"
               "128x128 w8 s2 exp2 tma rev split")


def gemm_point(name: str) -> dict:
    w = name.split()
    p = dict(mm.DEFAULT)
    if w[0] == "pers":
        p["grid"] = "persistent"
    elif w[0].startswith("splitk"):
        p["split_k"] = int(w[0][6:])
    p["loads"] = {"tma": "tma", "tma_ws": "tma_ws", "ptr": "pointers"}[w[1]]
    p["block_m"], p["block_n"], p["block_k"] = (int(x) for x in w[2].split("x"))
    for t in w[3:]:
        if t == "sub":
            p["subtile"] = True
        elif t.startswith("pps"):
            p["progs_per_sm"] = int(t[3:])
        elif t[0] in "swg":
            p[{"s": "num_stages", "w": "num_warps", "g": "group_m"}[t[0]]] = int(t[1:])
    return p


def attn_point(name: str) -> dict:
    p = dict(at.DEFAULT)
    if name == "default":
        return p
    w = name.split()
    p["block_m"], p["block_n"] = (int(x) for x in w[0].split("x"))
    flags = {"exp2": ("use_exp2", True), "tma": ("loads", "tma"), "ptr": ("loads", "pointers"),
             "rev": ("m_order", "reverse"), "fwd": ("m_order", "forward"),
             "split": ("causal_blocks", "split")}
    for t in w[1:]:
        if t in flags:
            p[flags[t][0]] = flags[t][1]
        else:
            p[{"s": "num_stages", "w": "num_warps"}[t[0]]] = int(t[1:])
    return p


def main() -> None:
    import triton
    import torch.nn.functional as F
    what = sys.argv[1]
    budget = float(sys.argv[2]) if len(sys.argv) > 2 and not sys.argv[2].startswith("-") else 500
    chosen = sys.argv[sys.argv.index("--points") + 1] if "--points" in sys.argv else None
    rows, t0 = [], time.time()
    workdir = tempfile.mkdtemp(prefix="points-")

    def bench(fn, ref, fl, shp, name, base_ms):
        try:
            out = fn()
            torch.cuda.synchronize()
            err = (out.float() - ref.float()).abs().max().item()
            ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
            rows.append(dict(shape=shp, point=name, us=ms * 1e3, tflops=fl / ms / 1e9,
                             vs_vendor=base_ms / ms, maxerr=err))
        except Exception as e:                   # a point that does not build or run here
            rows.append(dict(shape=shp, point=name, error=repr(e)[:300]))
        print(rows[-1], flush=True)

    shapes = GEMM_SHAPES
    if "--shapes" in sys.argv:
        shapes = [tuple(int(x) for x in t.split("x")) for t in sys.argv[sys.argv.index("--shapes") + 1].split(";")]
    if what == "gemm":
        for (M, K, N) in shapes:
            a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t()
            ref = torch.matmul(a, b)
            base = triton.testing.do_bench(lambda: torch.matmul(a, b), warmup=50, rep=300,
                                           return_mode="median")
            fl, shp = 2 * M * N * K, f"{M}x{K}x{N}"
            rows.append(dict(shape=shp, point="cuBLAS (torch.matmul)", us=base * 1e3,
                             tflops=fl / base / 1e9, vs_vendor=1.0))
            names = chosen or (DECODE_POINTS if M <= mm.DECODE_M else GEMM_POINTS)
            for name in names.split(";"):
                if time.time() - t0 > budget:
                    break
                fn = load_candidate(mm.render(gemm_point(name)), workdir)
                bench(lambda: fn(a, b), ref, fl, shp, name, base)
    else:
        for (B, H, S, D, Hkv) in ATTN_SHAPES:
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
                       for h in (H, Hkv, Hkv))

            def sdpa():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            ref = sdpa()
            base = triton.testing.do_bench(sdpa, warmup=25, rep=200, return_mode="median")
            fl, shp = 2 * B * H * S * S * D, f"{B}x{H}x{S}x{D} gqa{H // Hkv} causal"
            rows.append(dict(shape=shp, point="SDPA", us=base * 1e3, tflops=fl / base / 1e9,
                             vs_vendor=1.0))
            for name in (chosen or ATTN_POINTS).split(";"):
                if time.time() - t0 > budget:
                    break
                fn = load_candidate(at.render(attn_point(name)), workdir)
                bench(lambda: fn(q, k, v, True, None), ref, fl, shp, name, base)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), f"{what}_sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
