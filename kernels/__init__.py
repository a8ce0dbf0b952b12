"""Kernel families: the fixed contract every candidate kernel is judged against.

A family is one operation (rmsnorm, softmax, ...). Its file in this folder holds everything the
engine needs to optimize it, and nothing that runs the optimization:

- ``reference(**inputs)``: the PyTorch computation models really run (eager). It is the timing
  baseline, and, called on float64 copies of the inputs, the ground truth for correctness.
- ``make_inputs(shape, dtype, device, gen, kind)``: fresh random inputs for one call, as a dict of
  keyword arguments for ``kernel_fn``. ``shape`` is the shape of the main (first) input, with any
  number of leading dims; ``kind`` is "normal" or one of ``adversarial`` (numerical stability).
- ``bench_shapes``: shapes the benchmark times, including the large LLM shapes; ``sweep_shapes``:
  odd, tiny and large extras the verifier checks beside the model's real shapes.
- ``tolerance[dtype] = (atol, rtol)``: |out - expected| <= atol + rtol * |expected|, elementwise.
- ``cost(shape, dtype) -> (bytes, flops)``: the fewest bytes the op must move through device memory
  (each input read once, each output written once) and its flops: the speed of light.
- ``space``/``default``/``render``: the search space of real variants, and the function that turns
  one point of it into a complete, self-contained candidate source defining ``kernel_fn``.

The family name is the join key everywhere: file name, database column, test and benchmark ids.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

FAMILY_NAMES = ("rmsnorm", "softmax", "layernorm", "cross_entropy")


@dataclass(frozen=True)
class Family:
    name: str
    signature: str                    # e.g. "kernel_fn(x, weight, eps)"; argument names are the contract
    arg_names: tuple[str, ...]        # keyword names kernel_fn receives, in order
    reference: Callable               # eager PyTorch op, (**inputs) -> Tensor
    make_inputs: Callable             # (shape, dtype, device, gen, kind="normal") -> dict
    tolerance: dict                   # {torch.dtype: (atol, rtol)} keyed by input dtype
    cost: Callable                    # (shape, dtype) -> (bytes: int, flops: int)
    bench_shapes: tuple               # shapes of the main input timed by the benchmark
    sweep_shapes: tuple               # odd / tiny / large extras for the verifier's shape sweep
    edge_shapes: tuple                # size-1, prime, very many rows
    adversarial: tuple                # input kinds for the stability stage, e.g. ("huge", "tiny")
    space: dict                       # {param: [values...]}: the search space
    default: dict                     # the starter's point in the space
    render: Callable                  # (params: dict) -> complete candidate source
    dtypes: tuple = ("float32", "float16", "bfloat16")
    # aten ops (besides allocation, views and copies) a candidate may call on the host, e.g.
    # a final division; everything else inside kernel_fn must be the candidate's own Triton.
    allowed_host_ops: tuple = ()
    description: str = ""
    notes: dict = field(default_factory=dict)

    def starter(self) -> str:
        return self.render(dict(self.default))


def get(name: str) -> Family:
    """The family called ``name``; raises UnknownFamily with the valid names."""
    if name not in FAMILY_NAMES:
        raise UnknownFamily(f"unknown family {name!r}; known families: {', '.join(FAMILY_NAMES)}")
    return importlib.import_module(f"kernels.{name}").FAMILY


def all_families() -> list[Family]:
    return [get(n) for n in FAMILY_NAMES]


class UnknownFamily(ValueError):
    pass
