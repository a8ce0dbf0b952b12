"""Helpers shared by the kernel family tests: load a rendered candidate, make seeded inputs."""
from __future__ import annotations

import random

import torch

from engine import verify

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

_LOADED: dict[str, object] = {}


def load_candidate(src: str, tmp_dir):
    """kernel_fn of a rendered source (imported from a file: triton.jit reads the source), once."""
    key = verify.source_hash(src)
    if key not in _LOADED:
        _LOADED[key] = verify.load_candidate(src, str(tmp_dir))
    return _LOADED[key]


def passes_every_stage(fam, fn, shape, dtype: str, seed: int = 5) -> verify.Verifier:
    """Run ``fn`` through the five verifier stages at one target shape (under the interpreter on
    a machine without a GPU), asserting each passes; the Verifier, for what a test reads after."""
    verify.install_launch_counter()
    v = verify.Verifier(fam, {"dtype": dtype, "shapes": [{"shape": list(shape), "count": 1}],
                              "seed": seed}, DEVICE, interpret=DEVICE == "cpu")
    for stage in verify.STAGES:
        r = v.run_stage(fn, stage)
        assert r.status == "passed", (stage, r.detail)
    return v


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def inputs_for(fam, shape, dtype, seed, kind="normal"):
    return fam.make_inputs(shape, dtype, DEVICE, gen(seed), kind)


def as_f64(inputs: dict) -> dict:
    return {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
            for k, v in inputs.items()}


def sample_points(fam, k: int | None = None) -> list[dict]:
    """The default plus k points in which every value of every parameter appears at least once:
    each parameter gets its own shuffled sequence of its values, repeated to length k (default:
    the largest number of values), so parameters with equally many values do not move in lockstep."""
    rng = random.Random(f"points-{fam.name}")
    k = k or max(len(v) for v in fam.space.values())
    assert k >= max(len(v) for v in fam.space.values())
    seqs = {}
    for name, values in fam.space.items():
        seq = (list(values) * k)[:k]
        rng.shuffle(seq)
        seqs[name] = seq
    return [dict(fam.default)] + [{name: seq[i] for name, seq in seqs.items()} for i in range(k)]


def point_id(p: dict) -> str:
    return ",".join(f"{v}" for v in p.values())
