"""Kernel families: the fixed contract every candidate kernel is judged against.

A family is one operation (rmsnorm, softmax, ...). Its file in this folder holds everything the
engine needs to optimize it, and nothing that runs the optimization:

- ``reference(**inputs)``: the PyTorch computation models really run (eager). It is the timing
  baseline, and, called on float64 copies of the inputs, the ground truth for correctness.
- ``make_inputs(shape, dtype, device, gen, kind)``: fresh random inputs for one call, as a dict of
  keyword arguments for ``kernel_fn``. ``shape`` is the shape of the main (first) input, with any
  number of leading dims; ``kind`` is "normal" or one of ``adversarial`` (numerical stability).
- ``bench_shapes``: shapes the benchmark times, including the large LLM shapes, the headline one
  first (the shape its targets name; ``op:FAMILY``'s default on a GPU); ``sweep_shapes``:
  odd, tiny and large extras the verifier checks beside the model's real shapes.
- ``tolerance[dtype] = (atol, rtol)``: |out - expected| <= atol + rtol * |expected|, elementwise.
  Families whose outputs are sums of many terms (matmul, attention, ...) cancel: an output near 0
  can carry the rounding error of its large terms. They give ``error_bound(**inputs)``, a tensor
  like the output (computed on the float64 inputs, e.g. |A| @ |B| for a GEMM: the classic
  gamma_K |A||B| bound), and ``bound_tol[dtype] = stol``: the comparison adds stol * bound.
- ``cost(shape, dtype) -> (bytes, flops)``: the fewest bytes the op must move through device memory
  (each input read once, each output written once) and its flops: the speed of light.
- ``space``/``default``/``render``: the search space of real variants, and the function that turns
  one point of it into a complete, self-contained candidate source defining ``kernel_fn``.

Shapes that are not one tensor's shape (a GEMM's (M, K, N), attention's (B, H, S, D, Hkv, causal))
are documented in the family's file; such a family gives ``size(shape)`` (how big a problem it is,
for the verifier's interpreter cap; default: the product of the shape) and ``from_profile(record)``
(the shape of a profiled call, from the profiler's {"shape", "kv_heads", "ffn_dim", ...} record;
default: record["shape"]).

The family name is the join key everywhere: file name, database column, test and benchmark ids.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import dataclass, field
from typing import Callable

FAMILY_NAMES = ("rmsnorm", "softmax", "layernorm", "cross_entropy",
                "matmul", "attention", "fused_mlp", "rotary", "reduce")
# Families whose contract is generated from the graph: always configured from a spec, never
# matched by spellings (kernels/region.py: any fusible region of a model, named by its ops).
GENERATED_NAMES = ("region",)


# Axes that change the kernel only for fp32 operands (the dot's precision, K-contiguous copies of
# fp32 operands): a bf16/fp16 target's search keeps them at the default, where a move of theirs
# renders other source for the same kernel (a LLaMA-1B bf16 run on the H200 spent 3 of its 20
# matmul experiments on them, each a compile and a timing)
FP32_ONLY_AXES = ("fp32_dot", "k_major")


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
    # (**inputs) -> per-output-element error scale, allowed stol = bound_tol[dtype] times over
    error_bound: Callable | None = None
    bound_tol: dict = field(default_factory=dict)
    # (shape) -> int: problem size for the verifier's interpreter cap; None: product of the shape
    size: Callable | None = None
    # (profiler shape record: dict) -> shape tuple; None: tuple(record["shape"])
    from_profile: Callable | None = None
    # How the family is found in a model's graph and placed there (kernels/patterns.py):
    # the spellings that compute it, and what a match of one means under this contract.
    spellings: tuple = ()
    from_match: Callable | None = None       # (engine.match.Match) -> Fit | None; raises NoFit
    # The custom op a placed kernel becomes: its arguments in arg_names order, as a
    # torch.library schema ("(Tensor x, Tensor? weight, float eps) -> Tensor").
    op_schema: str = ""
    # aten ops that alone compute the family's plain contract, as the profiler names them
    # ("aten::softmax"): the interception road's profile (when a model's graph cannot be
    # captured) reads them.
    profile_ops: tuple = ()
    spec: dict = field(default_factory=dict)  # the contract spec this Family was configured with
    # Whether a shape with fewer rows in dim 0 is the same problem (the verifier checks values
    # on such a shape when the real one is over its size cap); false where dim 0 is tied to
    # other dims (a convolution region's generated layout).
    shrink_lead: bool = True
    # Changes to the current best the built-in search tries first, after the starter, in this
    # order: the structural choices an expert tries before tuning (matmul: fp32 operands on
    # tensor cores)
    openers: tuple = ()
    # (shape, dtype) -> the openers for one target, where the first moves worth trying depend
    # on its shape (matmul: split-K where the output has fewer tiles than the GPU has SMs);
    # None: ``openers`` for every target
    openers_for: Callable | None = None
    # (shape, dtype) -> changes to ``default`` for the starter of one target, where the generic
    # starter would serve its shape pathologically (matmul: an output of 4 or 16 tiles on a GPU
    # of 132 SMs, unsplit, took seconds a call at KernelBench's long-K shapes); None: none
    default_for: Callable | None = None
    # (shape, dtype) -> {axis: values} narrowing ``space`` for one target, where a value can
    # never change its kernel (attention's Hopper-only "ws" loads at a head dim or dtype that
    # kernel does not take: a move there renders other source for the same TMA kernel); None:
    # the space as it is (beside FP32_ONLY_AXES)
    space_for: Callable | None = None

    # The op a target's eager and torch.compile baselines time, where the model computes the
    # contract another way than ``reference`` (attention written out by hand: bmm, mask,
    # softmax, bmm, against the reference's SDPA): the baseline is the model's own computation
    # and its compiled form; verification keeps ``reference``. None: ``reference``.
    baseline: Callable | None = None

    # {arg name: strides}: arguments the model passes in a layout of its own (a transposed
    # view, a slice of a wider buffer, channels-last, an expanded bias), as its graph recorded
    # them at the target's shape; the edge cases run the real shape so. {}: contiguous alone.
    model_strides: dict = field(default_factory=dict)

    # The output's dims, outermost first, as the family's kernels lay it out in memory, where
    # that is not contiguous: RoPE fused into its projection and attention write [B, S, H, D]
    # and return the [B, H, S, D] view, (0, 2, 1, 3), the layout the model's own rotation and
    # SDPA return. A placed site declares those strides and hands the result on as it is (a
    # kernel that returns another layout is copied into them). None: contiguous.
    out_order: tuple | None = None

    def baseline_op(self) -> Callable:
        return self.baseline or self.reference

    def for_target(self, shape, dtype: str) -> "Family":
        """This family with its starter, openers and search space for a target of this (most
        called) shape and dtype."""
        dtype = str(dtype).removeprefix("torch.")
        space = self.space
        if dtype != "float32" and any(k in space for k in FP32_ONLY_AXES):
            space = {k: ([self.default[k]] if k in FP32_ONLY_AXES and k in self.default else v)
                     for k, v in space.items()}
        if shape and self.space_for is not None:
            narrowed = self.space_for(tuple(shape), dtype)
            if narrowed:
                space = dict(space, **narrowed)
        if not shape or (self.openers_for is None and self.default_for is None):
            return self if space is self.space else dataclasses.replace(self, space=space)
        shape = tuple(shape)
        default = dict(self.default, **(self.default_for(shape, dtype) if self.default_for else {}))
        openers = tuple(self.openers_for(shape, dtype)) if self.openers_for else self.openers
        return dataclasses.replace(self, default=default, openers=openers, space=space)

    def starter(self) -> str:
        return self.render(dict(self.default))

    def problem_size(self, shape) -> int:
        if self.size is not None:
            return int(self.size(tuple(shape)))
        n = 1
        for s in shape:
            n *= int(s)
        return n

    def profile_shape(self, record: dict) -> tuple:
        if self.from_profile is not None:
            return tuple(int(s) for s in self.from_profile(record))
        return tuple(int(s) for s in record["shape"])


def parse_families(text: str | None) -> list | None:
    """A --families value: comma-separated names, "all" for the nine and the generated ones
    (regions); None or "" for the default (the nine, as found)."""
    if not text:
        return None
    names = []
    for f in (x.strip() for x in text.split(",")):
        for n in (FAMILY_NAMES + GENERATED_NAMES if f == "all" else (f,)):
            if n and n not in names:
                names.append(n)
    return names


def get(name: str, spec: dict | None = None) -> Family:
    """The family called ``name`` under the contract ``spec`` (None or {}: its plain contract);
    raises UnknownFamily with the valid names.

    ``spec`` is what a graph match fixed that the plain contract leaves open (an RMSNorm over
    dims [1] without weight, say): a family that can be widened so defines
    ``configure(spec) -> Family`` in its file, and the result is judged on exactly those
    semantics. The spec is JSON, stored with the target and sent to the worker, so engine and
    worker rebuild the same Family from it."""
    if name not in FAMILY_NAMES and name not in GENERATED_NAMES:
        raise UnknownFamily(f"unknown family {name!r}; known families: "
                            f"{', '.join(FAMILY_NAMES + GENERATED_NAMES)}")
    mod = importlib.import_module(f"kernels.{name}")
    if not spec:
        return mod.FAMILY
    configure = getattr(mod, "configure", None)
    if configure is None:
        raise UnknownFamily(f"family {name!r} has one contract; it takes no spec (got {spec!r})")
    key = (name, json.dumps(spec, sort_keys=True))
    if key not in _CONFIGURED:         # the engine asks for the same contract on every probe
        _CONFIGURED[key] = configure(dict(spec))
    return _CONFIGURED[key]


_CONFIGURED: dict = {}


def all_families() -> list[Family]:
    return [get(n) for n in FAMILY_NAMES]


class UnknownFamily(ValueError):
    pass


# ---- the name "kernels" ----------------------------------------------------------------------
# Hugging Face publishes a package named ``kernels`` too, and transformers >= 5.25 depends on it:
# when its distribution is installed, transformers imports ``kernels`` at import time for its
# hub kernels and finds this package instead (ImportError: cannot import name 'CUDAProperties'),
# so no transformers model could be built in a process that runs the engine. Here transformers
# is told that its hub kernels are unavailable (what it does when they are not installed), once
# its import_utils module loads or, if it has loaded already, now.

_HF_UTILS = "transformers.utils.import_utils"


def _hub_kernels_off(module) -> None:
    module.is_kernels_available = lambda *a, **k: False
    module.is_kernels_available.cache_clear = lambda: None     # transformers' lru_cache API


class _HubKernelsOff:
    """A meta-path finder for transformers' import_utils alone: its loader runs the module,
    then _hub_kernels_off, before any transformers module can import the name from it."""

    def find_spec(self, name, path=None, target=None):
        if name != _HF_UTILS:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real = spec.loader.exec_module

        def exec_module(module):
            real(module)
            _hub_kernels_off(module)
        spec.loader.exec_module = exec_module
        return spec


def _guard_hub_kernels() -> None:
    import sys
    if _HF_UTILS in sys.modules:
        _hub_kernels_off(sys.modules[_HF_UTILS])
        if "transformers.utils" in sys.modules:          # it re-exports the name
            _hub_kernels_off(sys.modules["transformers.utils"])
    elif not any(isinstance(f, _HubKernelsOff) for f in sys.meta_path):
        sys.meta_path.insert(0, _HubKernelsOff())


_guard_hub_kernels()
