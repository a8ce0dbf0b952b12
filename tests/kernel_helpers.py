"""Helpers shared by the kernel family tests: load a rendered candidate, make seeded inputs."""
from __future__ import annotations

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


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def inputs_for(fam, shape, dtype, seed, kind="normal"):
    return fam.make_inputs(shape, dtype, DEVICE, gen(seed), kind)


def as_f64(inputs: dict) -> dict:
    return {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
            for k, v in inputs.items()}
