"""Region family: any fusible region of a model's graph, its contract rebuilt from a JSON spec.

A region (engine/regions.py finds them) is a small DAG of aten ops with one output: pointwise
chains, reductions over any set of dims with their pointwise prologue and epilogue (softmax,
logsumexp, var, norms, group norm written as one aten op or by hand), scans (cumsum,
cumprod), and a convolution, pooling or GEMM as its first op with its epilogue fused (a GEMM
region's kernel is the matmul family's tile loop, the epilogue applied to its accumulator). Nothing of a region is written by hand: ``configure(spec)`` builds its whole contract
from the spec the graph fixed:

- ``reference``: the region's own ops replayed eagerly (``torch.ops.aten.<op>``), as the model
  runs them: the timing baseline and, on float64 copies, the ground truth;
- ``make_inputs``: every input from the domain shape through its dim map, in value ranges that
  keep each op inside its domain (log and rsqrt of positive values, no zero divisor), found by
  interval arithmetic over the region's ops; ``adversarial`` kinds ("tiny", "large") only where
  the ops stay defined and finite there;
- ``tolerance`` per dtype growing with the region's depth, plus an error bound: the region run
  in fp32 against fp64 (what cancellation does to any fp32 kernel), elementwise plus a quarter
  of its worst anywhere, 16 times over;
- ``cost``: every input read once, the output written once (bytes); one flop per element per
  elementary op;
- shapes: the domain shape (the shape every input broadcasts to; for a reduction, its input's
  shape) is the family shape; sweeps and edges keep its rank and shrink or bend its dims;
- ``render``: one generated, self-contained Triton candidate for any point of ``space``.

The spec (plain JSON; stored with the target, sent to the worker):

    {"name": "mul+leaky_relu",            # the region named by its ops
     "rank": 2,                           # rank of the domain D
     "split": null | [dim, groups],       # a domain dim seen as [groups, dim/groups] (group norm)
     "red": [1],                          # reduced / scanned dims, in split coordinates; []: pointwise
     "inputs": [{"map": [0, 1], "dtype": "float32"}],   # per input dim: the domain dim, or null (size 1)
     "ops": [{"op": "aten.mul.Tensor", "args": [{"in": 0}, 0.5], "kwargs": {},
              "map": [0, 1], "dtype": "float32"}, ...],  # values v0, v1, ...: {"v": j}
     "out_dtype": null | "float32"}       # the output's dtype when it is not the inputs'

The generated kernel (one program per ROWS rows): the domain (in split coordinates) is viewed
as rows (the kept dims) x cols (the reduced dims; for a pointwise region, the trailing
``col_dims`` dims); every input is addressed through its own strides (0 where it broadcasts),
so any layout is read in place. When a row fits one tile (next_pow2(cols) <= max_block) the
"one_pass" kernel holds it in registers: inputs read once, output written once. Otherwise the
"looped" kernel makes one pass over the row per reduction (recomputing the pointwise prologue
from the inputs: each pass re-reads them) and a last pass for a row-shaped output or a scan
(scans carry their running total across chunks). All arithmetic is fp32; a cast to a narrower
float inside the region is rounded where the model rounds; the output is rounded once.
"""
from __future__ import annotations

import dataclasses
import json
import math

import torch

from kernels import Family
from kernels import _common as C
from kernels import matmul as _mm

NAME = "region"

# ---------------------------------------------------------------------------------------------
# the op table: what a region may hold
# ---------------------------------------------------------------------------------------------
# Each entry: kind ("pw" pointwise | "red" reduction | "scan"), the schema names of its tensor
# arguments, and flops per element. Casts and copies are pointwise identities. Ops written in
# place (relu_, add_) are their functional form when nothing else reads the written tensor
# (engine/regions.py checks).

_PW1 = ("self",)
OPS = {
    # arithmetic
    "add": ("pw", ("self", "other"), 1), "sub": ("pw", ("self", "other"), 1),
    "rsub": ("pw", ("self", "other"), 1), "mul": ("pw", ("self", "other"), 1),
    "multiply": ("pw", ("self", "other"), 1),
    "div": ("pw", ("self", "other"), 1), "neg": ("pw", _PW1, 1), "abs": ("pw", _PW1, 1),
    "reciprocal": ("pw", _PW1, 1), "square": ("pw", _PW1, 1), "pow": ("pw", ("self",), 2),
    "maximum": ("pw", ("self", "other"), 1), "minimum": ("pw", ("self", "other"), 1),
    "sign": ("pw", _PW1, 1), "floor": ("pw", _PW1, 1), "ceil": ("pw", _PW1, 1),
    "trunc": ("pw", _PW1, 1), "frac": ("pw", _PW1, 2),
    # transcendental
    "exp": ("pw", _PW1, 4), "exp2": ("pw", _PW1, 4), "expm1": ("pw", _PW1, 6),
    "log": ("pw", _PW1, 4), "log2": ("pw", _PW1, 4), "log10": ("pw", _PW1, 5),
    "log1p": ("pw", _PW1, 6), "sqrt": ("pw", _PW1, 2), "rsqrt": ("pw", _PW1, 2),
    "sin": ("pw", _PW1, 4), "cos": ("pw", _PW1, 4), "erf": ("pw", _PW1, 6),
    "tanh": ("pw", _PW1, 6), "sigmoid": ("pw", _PW1, 5), "log_sigmoid": ("pw", _PW1, 8),
    "logaddexp": ("pw", ("self", "other"), 8),
    # activations
    "relu": ("pw", _PW1, 1), "leaky_relu": ("pw", _PW1, 2), "gelu": ("pw", _PW1, 10),
    "silu": ("pw", _PW1, 6), "mish": ("pw", _PW1, 14), "softplus": ("pw", _PW1, 8),
    "elu": ("pw", _PW1, 6), "selu": ("pw", _PW1, 6), "celu": ("pw", _PW1, 6),
    "hardtanh": ("pw", _PW1, 2), "hardsigmoid": ("pw", _PW1, 3), "hardswish": ("pw", _PW1, 4),
    "clamp": ("pw", _PW1, 2), "clamp_min": ("pw", _PW1, 1), "clamp_max": ("pw", _PW1, 1),
    "threshold": ("pw", _PW1, 1), "softshrink": ("pw", _PW1, 2), "hardshrink": ("pw", _PW1, 1),
    # selection and comparison
    "where": ("pw", ("condition", "self", "other"), 1), "masked_fill": ("pw", ("self", "mask"), 1),
    "gt": ("pw", ("self", "other"), 1), "lt": ("pw", ("self", "other"), 1),
    "ge": ("pw", ("self", "other"), 1), "le": ("pw", ("self", "other"), 1),
    "eq": ("pw", ("self", "other"), 1), "ne": ("pw", ("self", "other"), 1),
    "logical_not": ("pw", _PW1, 1), "logical_and": ("pw", ("self", "other"), 1),
    "isnan": ("pw", _PW1, 1), "isinf": ("pw", _PW1, 1), "isposinf": ("pw", _PW1, 1),
    "isneginf": ("pw", _PW1, 1),
    "logical_or": ("pw", ("self", "other"), 1),
    # casts, copies, no-op dropout
    "_to_copy": ("pw", _PW1, 0), "to": ("pw", _PW1, 0), "clone": ("pw", _PW1, 0),
    "contiguous": ("pw", _PW1, 0), "alias": ("pw", _PW1, 0), "detach": ("pw", _PW1, 0),
    "lift_fresh_copy": ("pw", _PW1, 0), "dropout": ("pw", ("input",), 0),
    "type_as": ("pw", _PW1, 0),
    # per-channel normalization with running statistics (eval mode): pointwise
    "batch_norm": ("pw", ("input", "weight", "bias", "running_mean", "running_var"), 4),
    "_native_batch_norm_legit_no_training":
        ("pw", ("input", "weight", "bias", "running_mean", "running_var"), 4),
    # reductions (over the region's reduced dims, all of them)
    "sum": ("red", _PW1, 1), "mean": ("red", _PW1, 1), "amax": ("red", _PW1, 1),
    "amin": ("red", _PW1, 1), "prod": ("red", _PW1, 1), "max": ("red", _PW1, 1),
    "min": ("red", _PW1, 1), "var": ("red", _PW1, 3), "std": ("red", _PW1, 3),
    "logsumexp": ("red", _PW1, 6), "linalg_vector_norm": ("red", _PW1, 2),
    "norm": ("red", _PW1, 2), "softmax": ("red", _PW1, 5), "_softmax": ("red", _PW1, 5),
    "log_softmax": ("red", _PW1, 6), "_log_softmax": ("red", _PW1, 6),
    "layer_norm": ("red", ("input", "weight", "bias"), 7),
    "group_norm": ("red", ("input", "weight", "bias"), 7),
    "instance_norm": ("red", ("input", "weight", "bias"), 7),
    # a flip of an input or of the output (engine/regions.py folds it into the spec's input
    # "flip" / "out_flip": read or written with the index reversed)
    "flip": ("pw", _PW1, 0),
    # the index of the max / min (the region's output, of one of its inputs: int64)
    "argmax": ("red", _PW1, 1), "argmin": ("red", _PW1, 1),
    # losses with reduction mean or sum (over every dim): a pointwise term, then the reduction
    "l1_loss": ("red", ("self", "target"), 3), "mse_loss": ("red", ("self", "target"), 3),
    "smooth_l1_loss": ("red", ("self", "target"), 6), "huber_loss": ("red", ("self", "target"), 6),
    "kl_div": ("red", ("self", "target"), 6),
    # scans
    "cumsum": ("scan", _PW1, 1), "cumprod": ("scan", _PW1, 1),
    # convolutions: the region's first op, its epilogue fused (flops per output element and tap)
    "conv1d": ("conv", ("input", "weight", "bias"), 2), "conv2d": ("conv", ("input", "weight", "bias"), 2),
    "conv3d": ("conv", ("input", "weight", "bias"), 2),
    "conv_transpose1d": ("conv", ("input", "weight", "bias"), 2),
    "conv_transpose2d": ("conv", ("input", "weight", "bias"), 2),
    "conv_transpose3d": ("conv", ("input", "weight", "bias"), 2),
    # GEMMs: the region's first op, its epilogue applied to the fp32 accumulator (flops per
    # output element and K step)
    "linear": ("gemm", ("input", "weight", "bias"), 2), "mm": ("gemm", ("self", "mat2"), 2),
    "addmm": ("gemm", ("self", "mat1", "mat2"), 2), "bmm": ("gemm", ("self", "mat2"), 2),
    "matmul": ("gemm", ("self", "other"), 2),
    # pooling: a depthwise window over the input, as a convolution with no weights (max or mean
    # of the taps instead of their weighted sum)
    "max_pool1d": ("conv", ("self",), 1), "max_pool2d": ("conv", ("self",), 1),
    "max_pool3d": ("conv", ("self",), 1), "avg_pool1d": ("conv", ("self",), 1),
    "avg_pool2d": ("conv", ("self",), 1), "avg_pool3d": ("conv", ("self",), 1),
}
POOLS = {"max_pool1d": "max", "max_pool2d": "max", "max_pool3d": "max",
         "avg_pool1d": "avg", "avg_pool2d": "avg", "avg_pool3d": "avg"}


def pool_conv(name: str, a: dict, xshape) -> dict:
    """A pooling op's window as the region's "conv" record: depthwise (groups = channels),
    virtual weights [C, 1, *kernel]; raises ValueError for what the generator does not take."""
    S = len(xshape) - 2

    def dims(v, default):
        v = default if v is None or (isinstance(v, (list, tuple)) and len(v) == 0) else v
        v = [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
        if len(v) == 1:
            v = v * S
        if len(v) != S:
            raise ValueError(f"{name}: a window for {len(v)} of {S} dims")
        return v
    k = dims(a["kernel_size"], None)
    if a.get("ceil_mode"):
        raise ValueError(f"{name} with ceil_mode")
    if a.get("divisor_override") is not None and int(a["divisor_override"]) <= 0:
        raise ValueError(f"{name}: divisor_override {a['divisor_override']}")
    c = int(xshape[1])
    return {"transposed": False, "stride": dims(a.get("stride"), k), "padding": dims(a.get("padding"), 0),
            "dilation": dims(a.get("dilation"), 1), "groups": c, "output_padding": [0] * S,
            "w_shape": [c, 1] + k, "pool": POOLS[name],
            "count_include_pad": bool(a.get("count_include_pad", True)),
            "divisor": None if a.get("divisor_override") is None else int(a["divisor_override"])}
IN_PLACE = {"relu_": "relu", "add_": "add", "mul_": "mul", "sub_": "sub", "div_": "div",
            "hardtanh_": "hardtanh", "leaky_relu_": "leaky_relu", "sigmoid_": "sigmoid",
            "tanh_": "tanh", "clamp_": "clamp", "clamp_min_": "clamp_min", "gelu_": "gelu",
            "silu_": "silu", "elu_": "elu", "exp_": "exp", "hardswish_": "hardswish",
            "hardsigmoid_": "hardsigmoid", "masked_fill_": "masked_fill", "abs_": "abs",
            "neg_": "neg", "sqrt_": "sqrt", "threshold_": "threshold", "mish_": "mish"}
# short names for region names (gemm+mul+leaky_relu)
SHORT = {"_to_copy": "to", "conv1d": "conv", "conv2d": "conv", "conv3d": "conv",
         "conv_transpose1d": "conv_t", "conv_transpose2d": "conv_t", "conv_transpose3d": "conv_t", "_softmax": "softmax", "_log_softmax": "log_softmax",
         "linalg_vector_norm": "norm", "_native_batch_norm_legit_no_training": "batch_norm",
         "multiply": "mul", "amax": "max", "amin": "min", "linear": "gemm", "mm": "gemm",
         "addmm": "gemm", "bmm": "gemm", "matmul": "gemm"}
_NOOPS = {"_to_copy", "to", "clone", "contiguous", "alias", "detach", "lift_fresh_copy",
          "dropout", "type_as"}


def op_parts(qualname: str) -> tuple[str, str]:
    """("add", "Tensor") of "aten.add.Tensor"; "aten.relu.default" -> ("relu", "default")."""
    parts = qualname.split(".")
    return parts[1], (parts[2] if len(parts) > 2 else "default")


def aten_op(qualname: str):
    name, overload = op_parts(qualname)
    return getattr(getattr(torch.ops.aten, name), overload)


def named_args(qualname: str, args: list, kwargs: dict) -> dict:
    """Schema name -> value for an op's (decoded or encoded) arguments, defaults filled in."""
    schema = aten_op(qualname)._schema
    out = {}
    for i, a in enumerate(schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


def reduced_dims(name: str, a: dict, rank: int):
    """The dims (non-negative, sorted) a reduction or scan op of the table works over, on an
    input of ``rank``; None when the op's arguments are outside what the generator handles."""
    def norm(ds):
        if ds is None or ds == []:
            return list(range(rank))
        if isinstance(ds, int):
            ds = [ds]
        return sorted({d % rank for d in ds}) if rank else []
    if name in ("softmax", "_softmax", "log_softmax", "_log_softmax", "cumsum", "cumprod"):
        return norm(a.get("dim"))
    if name in ("layer_norm",):
        k = len(a["normalized_shape"])
        return list(range(rank - k, rank))
    if name == "instance_norm":
        return list(range(2, rank))
    if name == "group_norm":
        return None                  # the split's dims: engine/regions.py builds them
    if name in ("max", "min") and a.get("dim") is not None and not isinstance(a.get("dim"), list):
        return norm(a["dim"])
    if name in ("linalg_vector_norm", "norm"):
        return norm(a.get("dim"))
    if name in _LOSSES:
        # reduction 1 (mean) or 2 (sum) over every dim; 0 (none) is a pointwise loss the
        # generator does not take as one
        return list(range(rank)) if int(a.get("reduction", 1)) in (1, 2) else None
    return norm(a.get("dim"))


_LOSSES = ("l1_loss", "mse_loss", "smooth_l1_loss", "huber_loss", "kl_div")


# ---------------------------------------------------------------------------------------------
# spec encoding (JSON) and the reference
# ---------------------------------------------------------------------------------------------

def encode(v):
    """A Python / torch argument value as JSON (node references are encoded by the caller)."""
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, float) and not math.isfinite(v):
        return {"f": repr(v)}
    if isinstance(v, (list, tuple)):
        return [encode(x) for x in v]
    if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
        return None
    return v


def decode(v, inputs: list, values: list):
    if isinstance(v, dict):
        if "in" in v:
            return inputs[v["in"]]
        if "v" in v:
            return values[v["v"]]
        if "dtype" in v:
            return getattr(torch, v["dtype"])
        if "f" in v:
            return float(v["f"])
    if isinstance(v, list):
        return [decode(x, inputs, values) for x in v]
    return v


_DROP_KWARGS = {"device", "layout", "pin_memory", "memory_format", "non_blocking"}


def _flipped(spec: dict, inputs: list) -> list:
    return [torch.flip(t, inp["flip"]) if inp.get("flip") else t
            for t, inp in zip(inputs, spec["inputs"])]


def _replay(spec: dict, inputs: list, fp32_scans: bool = False, first=None):
    out = _replay_ops(spec, _flipped(spec, inputs), fp32_scans, first)
    return torch.flip(out, spec["out_flip"]) if spec.get("out_flip") else out


def _seq_cumsum32(x: torch.Tensor, dim: int) -> torch.Tensor:
    """cumsum accumulated in float32, element after element (numpy's float32 cumsum): what a
    float32 kernel's rounding costs at worst. torch's CPU cumsum of float32 accumulates in
    float64, so eager's own error says nothing about a float32 scan."""
    import numpy as np
    a = x.detach().to("cpu", torch.float32).numpy()
    return torch.from_numpy(np.cumsum(a, axis=dim, dtype=np.float32)).to(x.device)


def _replay_ops(spec: dict, inputs: list, fp32_scans: bool = False, first=None):
    """The spec's ops one after another; ``first``, when given, stands for the first op's
    result (the GEMM error bound perturbs it)."""
    values = []
    for j, op in enumerate(spec["ops"]):
        if j == 0 and first is not None:
            values.append(first)
            continue
        name, _ = op_parts(op["op"])
        args = [decode(a, inputs, values) for a in op["args"]]
        kwargs = {k: decode(v, inputs, values) for k, v in op["kwargs"].items()
                  if k not in _DROP_KWARGS}
        src = args[0] if args else None
        if name in ("_to_copy", "to") and isinstance(src, torch.Tensor):
            want = kwargs.get("dtype") or next((a for a in args[1:] if isinstance(a, torch.dtype)),
                                               None)
            # an upcast of the model (x.float()) keeps a float64 reference in float64
            if (want is not None and src.dtype == torch.float64 and want.is_floating_point
                    and torch.finfo(want).bits >= _bits(op.get("src_dtype"))):
                values.append(src)
                continue
            # a cast is its dtype alone: the spec keeps no device (to.device's is None), the
            # reference runs where its inputs are
            values.append(src.to(want) if want is not None else src.clone())
            continue
        if (fp32_scans and name == "cumsum" and isinstance(src, torch.Tensor)
                and src.dtype == torch.float32 and kwargs.get("dtype") in (None, torch.float32)):
            values.append(_seq_cumsum32(src, int(args[1]) % max(src.dim(), 1)))
            continue
        if (spec.get("conv") or {}).get("tf32") is False and OPS[name][0] == "conv":
            # the model turned TF32 convolutions off: eager's convolution, replayed so
            cd = torch.backends.cudnn
            with cd.flags(enabled=cd.enabled, benchmark=cd.benchmark,
                          deterministic=cd.deterministic, allow_tf32=False):
                out = aten_op(op["op"])(*args, **kwargs)
        else:
            out = aten_op(op["op"])(*args, **kwargs)
        if isinstance(out, (tuple, list)):          # max.dim, batch norm: the values
            out = out[0]
        values.append(out)
    return values[-1]


def reference_source(spec: dict) -> str:
    """The region as the PyTorch it replays, one aten call a line: the contract a person or the
    LLM proposer reads (the reference itself is ``_replay`` of the spec)."""
    def src(v):
        if isinstance(v, dict):
            if "in" in v:
                return f"in{v['in']}"
            if "v" in v:
                return f"v{v['v']}"
            if "dtype" in v:
                return f"torch.{v['dtype']}"
            if "f" in v:
                return src(float(v["f"]))
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(src(x) for x in v) + "]"
        if isinstance(v, float) and (v != v or v in (float("inf"), -float("inf"))):
            return f"float('{v}')"
        return repr(v)
    n = len(spec["inputs"])
    lines = [f"def reference({', '.join(f'in{i}' for i in range(n))}):"]
    for i, inp in enumerate(spec["inputs"]):
        if inp.get("role"):
            lines.append(f"    # in{i}: {inp['dtype']}, the {inp['role'].replace('_', ' ')} operand")
        else:
            lines.append(f"    # in{i}: {inp['dtype']}, its dims are dims {inp['map']} of the domain")
    for j, op in enumerate(spec["ops"]):
        args = [src(a) for a in op["args"]] + [f"{k}={src(v)}" for k, v in op["kwargs"].items()
                                              if k not in _DROP_KWARGS]
        call = f"torch.ops.{op['op']}({', '.join(args)})"
        try:
            if len(aten_op(op["op"])._schema.returns) > 1:
                call += "[0]"                       # max.dim, batch norm: the values
        except Exception:
            pass
        lines.append(f"    v{j} = {call}")
    lines.append(f"    return v{len(spec['ops']) - 1}")
    return "\n".join(lines)


def _bits(dtype_name) -> int:
    if not dtype_name:
        return 0
    dt = getattr(torch, dtype_name)
    return torch.finfo(dt).bits if dt.is_floating_point else 0


def _reference_for(spec):
    n = len(spec["inputs"])

    def reference(**kw):
        return _replay(spec, [kw[f"in{i}"] for i in range(n)])
    return reference


# ---------------------------------------------------------------------------------------------
# domains: value ranges that keep every op defined (interval arithmetic)
# ---------------------------------------------------------------------------------------------

# value ranges of inputs: normal-ish, positive, negative, big positive, near one (products)
RANGES = {"N": (-2.0, 2.0), "P": (0.5, 2.0), "M": (-2.0, -0.5), "B": (3.0, 4.0), "S": (0.9, 1.1)}
_BIG_N = 1e6          # elements a reduction may add up (intervals stay shape-free)
_INF = float("inf")


def _iv(a):
    """An argument as an interval: intervals pass, numbers are points, None is unknown."""
    if isinstance(a, tuple) and len(a) == 2:
        return a
    if isinstance(a, bool):
        return (float(a), float(a))
    if isinstance(a, (int, float)):
        return (float(a), float(a))
    return (-_INF, _INF)


def _corners(f, a, b):
    vals = []
    for x in a:
        for y in b:
            try:
                v = f(x, y)
            except (ZeroDivisionError, OverflowError, ValueError):
                return (-_INF, _INF)
            if v != v:
                return (-_INF, _INF)
            vals.append(v)
    return (min(vals), max(vals))


def _mono(f, a, inc=True):
    try:
        lo, hi = f(a[0]), f(a[1])
    except (OverflowError, ValueError, ZeroDivisionError):
        return (-_INF, _INF)
    return (lo, hi) if inc else (hi, lo)


def _safe(f):
    def g(x):
        try:
            return f(x)
        except OverflowError:
            return _INF
    return g


def _mul_iv(a, b):
    return _corners(lambda x, y: 0.0 if (x == 0 or y == 0) else x * y, a, b)


def _div_iv(a, b):
    if b[0] <= 0 <= b[1]:
        return (-_INF, _INF)
    return _corners(lambda x, y: x / y, a, b)


def _abs_iv(a):
    if a[0] >= 0:
        return a
    if a[1] <= 0:
        return (-a[1], -a[0])
    return (0.0, max(-a[0], a[1]))


def _sq_iv(a):
    m = _abs_iv(a)
    return (m[0] * m[0], m[1] * m[1]) if m[1] < 1e150 else (m[0] * m[0], _INF)


def _clamp_iv(a, lo, hi):
    lo = -_INF if lo is None else lo
    hi = _INF if hi is None else hi
    return (min(max(a[0], lo), hi), max(min(a[1], hi), lo))


_exp = _safe(math.exp)


def _interval(name: str, a: dict, t: list) -> tuple:
    """The interval of an op's value from its arguments' intervals (``t``: tensor args in
    table order, as intervals) and its named arguments ``a``."""
    x = t[0] if t else (-_INF, _INF)
    o = t[1] if len(t) > 1 else _iv(a.get("other"))
    if name in _NOOPS:
        return x
    if name in ("add", "sub", "rsub"):
        alpha = a.get("alpha", 1) or 1
        o = _mul_iv(o, (alpha, alpha))
        if name == "add":
            return (x[0] + o[0], x[1] + o[1])
        if name == "sub":
            return (x[0] - o[1], x[1] - o[0])
        return (o[0] - x[1], o[1] - x[0])
    if name in ("mul", "multiply"):
        return _mul_iv(x, o)
    if name == "div":
        return _div_iv(x, o)
    if name == "neg":
        return (-x[1], -x[0])
    if name == "abs":
        return _abs_iv(x)
    if name == "square":
        return _sq_iv(x)
    if name == "reciprocal":
        return _div_iv((1.0, 1.0), x)
    if name == "pow":
        e = a.get("exponent")
        if not isinstance(e, (int, float)):
            return (-_INF, _INF)
        if e == 2:
            return _sq_iv(x)
        if x[0] >= 0:
            return _mono(_safe(lambda v: v ** e if v > 0 else (0.0 if e > 0 else _INF)), x, e >= 0)
        if float(e).is_integer():
            m = _abs_iv(x)
            r = max(m[1] ** e if e >= 0 else _INF, 0.0)
            return (-r, r) if int(e) % 2 else (0.0, r)
        return (-_INF, _INF)
    if name in ("maximum", "minimum"):
        f = max if name == "maximum" else min
        return (f(x[0], o[0]), f(x[1], o[1]))
    if name in ("exp", "exp2"):
        b = math.e if name == "exp" else 2.0
        return _mono(_safe(lambda v: b ** v), x)
    if name == "expm1":
        return _mono(_safe(lambda v: math.expm1(v)), x)
    if name in ("log", "log2", "log10", "log1p"):
        f = {"log": math.log, "log2": math.log2, "log10": math.log10, "log1p": math.log1p}[name]
        return _mono(lambda v: f(v) if v > (-1 if name == "log1p" else 0) else -_INF, x)
    if name == "sqrt":
        return _mono(lambda v: math.sqrt(max(v, 0.0)), x)
    if name == "rsqrt":
        return _mono(lambda v: 1 / math.sqrt(v) if v > 0 else _INF, x, inc=False)
    if name in ("sin", "cos", "tanh", "erf"):
        return (-1.0, 1.0)
    if name in ("sigmoid", "hardsigmoid"):
        return (0.0, 1.0)
    if name in ("relu",):
        return (max(x[0], 0.0), max(x[1], 0.0))
    if name in ("leaky_relu", "elu", "selu", "celu", "gelu", "silu", "mish", "softplus", "hardswish"):
        lo = min(x[0], 0.0) * (1.7581 if name == "selu" else 1.0) - (1.7581 if name in ("elu", "selu", "celu") else 0.3)
        hi = max(x[1], 0.0) * (1.0508 if name == "selu" else 1.0) + (1.0 if name == "softplus" else 0.0)
        return (lo, hi)
    if name == "hardtanh":
        return _clamp_iv(x, a.get("min_val", -1.0), a.get("max_val", 1.0))
    if name == "clamp":
        return _clamp_iv(x, a.get("min"), a.get("max"))
    if name == "clamp_min":
        return _clamp_iv(x, a.get("min"), None)
    if name == "clamp_max":
        return _clamp_iv(x, None, a.get("max"))
    if name == "threshold":
        v = float(a.get("value", 0.0))
        return (min(x[0], v), max(x[1], v))
    if name in ("sign",):
        return (-1.0, 1.0)
    if name == "frac":
        return (-1.0, 1.0)
    if name == "log_sigmoid":
        return (min(x[0], 0.0) - math.log(2.0), 0.0)
    if name == "logaddexp":
        return (max(x[0], o[0]), max(x[1], o[1]) + math.log(2.0))
    if name in ("softshrink", "hardshrink"):
        return (min(x[0], 0.0), max(x[1], 0.0))
    if name in ("floor", "ceil", "trunc"):
        return (math.floor(x[0]) if math.isfinite(x[0]) else x[0], math.ceil(x[1]) if math.isfinite(x[1]) else x[1])
    if name in ("gt", "lt", "ge", "le", "eq", "ne", "logical_not", "logical_and", "logical_or",
                "isnan", "isinf", "isposinf", "isneginf"):
        return (0.0, 1.0)
    if name == "where":
        s, o2 = t[1] if len(t) > 1 else _iv(a.get("self")), t[2] if len(t) > 2 else _iv(a.get("other"))
        return (min(s[0], o2[0]), max(s[1], o2[1]))
    if name == "masked_fill":
        v = _iv(a.get("value"))
        return (min(x[0], v[0]), max(x[1], v[1]))
    if name in ("batch_norm", "_native_batch_norm_legit_no_training"):
        w = t[1] if a.get("weight") is not None else (1.0, 1.0)
        b = t[2] if a.get("bias") is not None else (0.0, 0.0)
        rm, rv = t[3], t[4]
        eps = float(a.get("eps", 1e-5))
        c = (x[0] - rm[1], x[1] - rm[0])
        r = _interval("rsqrt", {}, [(rv[0] + eps, rv[1] + eps)])
        y = _mul_iv(_mul_iv(c, r), w)
        return (y[0] + b[0], y[1] + b[1])
    if name in POOLS:          # a max or mean of the window (padding counted as zeros)
        return x if name.startswith("max") else (min(x[0], 0.0), max(x[1], 0.0))
    if name.startswith("conv"):
        m = max(abs(x[0]), abs(x[1])) * max(abs(o[0]), abs(o[1])) * _BIG_N
        return (-m, m)
    if name in GEMMS:
        # make_inputs divides b by K: every output is a mean of K products, inside the
        # interval of one product whatever K
        if name == "addmm":
            alpha, beta = float(a.get("alpha", 1) or 0), float(a.get("beta", 1) or 0)
            prod = _mul_iv(_mul_iv(t[1], t[2]), (alpha, alpha))
            add = _mul_iv(t[0], (beta, beta)) if beta else (0.0, 0.0)
        else:
            prod = _mul_iv(x, o)
            add = t[2] if name == "linear" and a.get("bias") is not None else (0.0, 0.0)
        return (prod[0] + add[0], prod[1] + add[1])
    if name in _LOSSES:
        d = (x[0] - o[1], x[1] - o[0])
        m = _abs_iv(d)[1]
        if name == "kl_div":
            lt = _mono(_safe(lambda v: v * math.log(v) if v > 0 else 0.0), (max(o[0], 0.0), o[1]))
            m = max(abs(lt[0]), abs(lt[1])) + max(abs(o[0]), abs(o[1])) * max(abs(x[0]), abs(x[1]))
            if a.get("log_target"):
                m = math.exp(min(o[1], 80.0)) * (max(abs(o[0]), abs(o[1])) + max(abs(x[0]), abs(x[1])))
        elif name in ("mse_loss", "smooth_l1_loss", "huber_loss"):
            m = m * m
        if int(a.get("reduction", 1)) == 2:
            m = m * _BIG_N                       # a sum of up to _BIG_N terms
        return (-m, m) if name == "kl_div" else (0.0, m)
    # reductions and scans: shape-free bounds
    if name in ("sum", "cumsum"):
        return (min(x[0] * _BIG_N, x[0]), max(x[1] * _BIG_N, x[1]))
    if name in ("mean", "amax", "amin", "max", "min"):
        return x
    if name in ("prod", "cumprod"):
        m = _abs_iv(x)
        if 0.9 <= m[0] and m[1] <= 1.1:
            # factors near one: a product of n of them is a random walk in log space (a few
            # e-folds over the rows checked), not the worst case 1.1^n
            return (-_LIMIT32, _LIMIT32) if x[0] < 0 else (0.0, _LIMIT32)
        if m[1] <= 1.0:
            return (-m[1], m[1]) if x[0] < 0 else (0.0, m[1])
        return (-_INF, _INF) if x[0] < 0 else (0.0, _INF)
    if name in ("var", "std"):
        v = (0.0, (x[1] - x[0]) ** 2)
        return v if name == "var" else (0.0, math.sqrt(v[1]) if math.isfinite(v[1]) else _INF)
    if name == "logsumexp":
        return (x[0], x[1] + math.log(_BIG_N))
    if name in ("linalg_vector_norm", "norm"):
        m = _abs_iv(x)             # at least the largest |x_i|, which is at least min |x|
        return (m[0], m[1] * _BIG_N)
    if name in ("softmax", "_softmax"):
        return (0.0, 1.0)
    if name in ("log_softmax", "_log_softmax"):
        return (-(x[1] - x[0]) - math.log(_BIG_N), 0.0)
    if name in ("layer_norm", "group_norm", "instance_norm"):
        w = _abs_iv(t[1]) if len(t) > 1 and a.get("weight") is not None else (1.0, 1.0)
        b = t[2] if len(t) > 2 and a.get("bias") is not None else (0.0, 0.0)
        s = math.sqrt(_BIG_N) * w[1]
        return (b[0] - s, b[1] + s)
    return (-_INF, _INF)


def _domain_ok(name: str, a: dict, t: list) -> bool:
    """Is the op defined (finite, no NaN) on its arguments' intervals?"""
    x = t[0] if t else (-_INF, _INF)
    if name in ("log", "log2", "log10", "rsqrt"):
        return x[0] > 0
    if name == "log1p":
        return x[0] > -1
    if name == "sqrt":
        return x[0] >= 0
    if name == "div":
        o = t[1] if len(t) > 1 else _iv(a.get("other"))
        return o[0] > 0 or o[1] < 0
    if name == "reciprocal":
        return x[0] > 0 or x[1] < 0
    if name == "pow":
        e = a.get("exponent")
        if not isinstance(e, (int, float)):
            return False
        if not float(e).is_integer():
            return x[0] > 0 if e < 0 else x[0] >= 0
        return e >= 0 or x[0] > 0 or x[1] < 0
    if name in ("batch_norm", "_native_batch_norm_legit_no_training"):
        return t[4][0] + float(a.get("eps", 1e-5)) > 0
    if name in ("var", "std") or name in ("layer_norm", "group_norm", "instance_norm"):
        return True
    if name == "kl_div" and not a.get("log_target"):
        o = t[1] if len(t) > 1 else (-_INF, _INF)
        return o[0] >= 0                     # target * log(target): probabilities
    return True


_LIMIT32 = 1e30       # |value| an fp32 kernel holds with room to spare (fp32 max 3.4e38)


def _tensor_slots(spec_op: dict) -> list:
    """The encoded tensor arguments of an op, in its table order (None where absent)."""
    name, _ = op_parts(spec_op["op"])
    a = named_args(spec_op["op"], spec_op["args"], spec_op["kwargs"])
    return [a.get(s) for s in OPS[name][1]], a


def check_ranges(spec: dict, ranges: list, scale: float) -> tuple[bool, str]:
    """(every op defined and every value within fp32's comfortable range, the first op that is
    not) for inputs uniform in ``ranges`` times ``scale``."""
    ins = []
    for inp, r in zip(spec["inputs"], ranges):
        ins.append((0.0, 1.0) if inp["dtype"] == "bool" else (r[0] * scale, r[1] * scale))
    vals = []
    for op in spec["ops"]:
        name, _ = op_parts(op["op"])
        slots, a = _tensor_slots(op)
        t = []
        for s in slots:
            if isinstance(s, dict) and "in" in s:
                t.append(ins[s["in"]])
            elif isinstance(s, dict) and "v" in s:
                t.append(vals[s["v"]])
            else:
                t.append(_iv(decode(s, [], [])) if s is not None else (0.0, 0.0))
        plain = {k: (decode(v, [None] * len(ins), [None] * len(vals)) if not isinstance(v, dict)
                     or "f" in v else v) for k, v in a.items()}
        if not _domain_ok(name, plain, t):
            return False, name
        iv = _interval(name, plain, t)
        if not (abs(iv[0]) <= _LIMIT32 and abs(iv[1]) <= _LIMIT32) and name not in ("sum", "cumsum",
                                                                                   "linalg_vector_norm", "norm", "logsumexp", "log_softmax", "_log_softmax"):
            return False, name
        vals.append(iv)
    return True, ""


def choose_ranges(spec: dict, scale: float = 1.0) -> list | None:
    """One value range per input (RANGES' names) under which every op is defined at ``scale``:
    all "N" first, then coordinate descent over the other ranges; None when none is found."""
    n = len(spec["inputs"])
    names = ["N"] * n
    ok, _ = check_ranges(spec, [RANGES[k] for k in names], scale)
    if ok:
        return names
    for _round in range(3):
        for i in range(n):
            if spec["inputs"][i]["dtype"] == "bool":
                continue
            best = None
            for k in ("N", "P", "B", "M", "S"):
                trial = names[:i] + [k] + names[i + 1:]
                ok, _ = check_ranges(spec, [RANGES[x] for x in trial], scale)
                if ok:
                    best = trial
                    break
            if best is not None:
                return best
        # no single switch fixes it: make every float input positive, then try again
        names = ["P" if spec["inputs"][i]["dtype"] != "bool" else "N" for i in range(n)]
        ok, _ = check_ranges(spec, [RANGES[k] for k in names], scale)
        if ok:
            return names
        for i in range(n):
            for k in ("B", "M", "N", "S"):
                trial = names[:i] + [k] + names[i + 1:]
                if check_ranges(spec, [RANGES[x] for x in trial], scale)[0]:
                    names = trial
                    break
            if check_ranges(spec, [RANGES[x] for x in names], scale)[0]:
                return names
    return None


# stability kinds: the same ranges scaled; "large" takes the largest scale the ops hold
_KIND_SCALES = {"tiny": (1e-4,), "large": (1e3, 1e2, 30.0, 8.0)}


def _kinds(spec: dict, ranges: list) -> dict:
    """{kind: scale} of the stability kinds where every op stays defined and finite."""
    out = {}
    for kind, scales in _KIND_SCALES.items():
        for s in scales:
            if check_ranges(spec, [RANGES[k] for k in ranges], s)[0]:
                out[kind] = s
                break
    return out


# ---------------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------------

def input_shape(domain, m) -> tuple:
    return tuple(int(domain[d]) if d is not None else 1 for d in m)


# ---- convolutions: the family shape is the input x's, the domain the output's -----------------

def conv_out(cv: dict, xshape) -> tuple:
    """The output shape [N, Co, *O] of the region's convolution on an input of ``xshape``."""
    w = cv["w_shape"]
    k = w[2:]
    co = w[1] * cv["groups"] if cv["transposed"] else w[0]
    o = []
    for s, i in enumerate(xshape[2:]):
        st, pd, dl = cv["stride"][s], cv["padding"][s], cv["dilation"][s]
        if cv["transposed"]:
            o.append((i - 1) * st - 2 * pd + dl * (k[s] - 1) + cv["output_padding"][s] + 1)
        else:
            o.append((i + 2 * pd - dl * (k[s] - 1) - 1) // st + 1)
    return (int(xshape[0]), int(co)) + tuple(int(v) for v in o)


def domain_of(spec, shape) -> tuple:
    """The domain of a family shape: the shape itself, a convolution's output, or a GEMM's
    output [*lead, M, N] of its family shape (*lead, M, K, N)."""
    if spec.get("conv"):
        return conv_out(spec["conv"], shape)
    shape = tuple(int(v) for v in shape)
    return shape[:-2] + shape[-1:] if spec.get("gemm") else shape


# ---- GEMMs: the family shape is (*lead, M, K, N), the domain the output [*lead, M, N] -----------
GEMMS = ("linear", "mm", "addmm", "bmm", "matmul")


def gemm_operand_shape(spec, role, shape) -> tuple:
    """a [*lead, M, K]; b [K, N], a linear layer's weight [N, K], or batched [*lead, K, N]."""
    g = spec["gemm"]
    shape = tuple(int(v) for v in shape)
    if role == "gemm_a":
        return shape[:-1]
    k, n = shape[-2], shape[-1]
    if g["layout"] == "nk":
        return (n, k)
    return shape[:g["batch"]] + (k, n)


def _conv_taps(cv) -> int:
    """Products one output element of the convolution adds: Ci/groups * kernel volume."""
    w = cv["w_shape"]
    cig = w[0] // cv["groups"] if cv["transposed"] else w[1]
    return int(cig * math.prod(w[2:]))


def _role_shape(spec, inp, shape) -> tuple:
    """An input's shape at family shape ``shape``: a convolution's input, weight, bias, or the
    domain through its map."""
    role = inp.get("role")
    if role in ("gemm_a", "gemm_b"):
        return gemm_operand_shape(spec, role, shape)
    if role == "conv_x":
        return tuple(int(v) for v in shape)
    if role == "conv_w":
        return tuple(spec["conv"]["w_shape"])
    if role == "conv_b":
        return (conv_out(spec["conv"], shape)[1],)
    return input_shape(domain_of(spec, shape), inp["map"])


def _fit_split(spec, shape):
    """``shape`` with the split dim rounded to a multiple of the groups."""
    shape = list(shape)
    if spec.get("split"):
        d, g = spec["split"]
        shape[d] = max(g, (shape[d] // g) * g)
    return tuple(shape)


def _sweeps(spec, real: tuple) -> tuple[tuple, tuple]:
    """(sweep shapes, edge shapes) of the domain's rank: the real shape shrunk, odd and prime
    sizes along the reduced (or last) dims, size-1 dims, one long row."""
    r = spec["rank"]
    if r == 0:
        return ((),), ((),)
    red = _red_domain(spec)
    col = red or [r - 1]
    base = [2] * r
    sweep, edge = [], []

    def add(lst, s):
        s = _fit_split(spec, s)
        if s not in lst:
            lst.append(s)
    small = [max(1, min(int(s), 8)) for s in real]
    add(sweep, small)
    for n in (1, 7, 33, 130, 1000, 2500):
        s = list(base)
        for c in col:
            s[c] = 1
        s[col[-1]] = n
        add(sweep, s)
    s = [3] * r
    add(sweep, s)
    shrunk = list(real)
    while math.prod(shrunk) > 1 << 14:
        i = max(range(r), key=lambda k: shrunk[k])
        shrunk[i] = max(1, shrunk[i] // 2 + (1 if shrunk[i] % 2 else 0))
    add(sweep, shrunk)
    add(edge, [1] * r)
    for i in range(r):
        s = list(shrunk)
        s[i] = 1
        add(edge, s)
    s = [1] * r
    s[col[-1]] = 4099
    add(edge, s)
    add(edge, [5] * (r - 1) + [13] if r > 1 else [97])
    s = [1] * r
    s[(set(range(r)) - set(col)).pop() if set(range(r)) - set(col) else 0] = 3001
    add(edge, s)
    return tuple(sweep), tuple(edge)


def _conv_sweeps(spec) -> tuple[tuple, tuple]:
    """Input shapes [N, Ci, *I] of a convolution region: the smallest input with an output,
    odd and prime sizes, a batch of three; channels are the weights' (fixed)."""
    cv = spec["conv"]
    w = cv["w_shape"]
    ci = w[0] if cv["transposed"] else w[1] * cv["groups"]
    S = spec["rank"] - 2
    lo = []
    for s in range(S):
        if cv["transposed"]:
            lo.append(1)
        elif cv.get("pool"):
            # torch's 3-D average pooling refuses an input smaller than its window, padding
            # or not ("input image (T: 1 H: 1 W: 1) smaller than kernel size")
            lo.append(cv["dilation"][s] * (w[2 + s] - 1) + 1)
        else:
            lo.append(max(1, cv["dilation"][s] * (w[2 + s] - 1) + 1 - 2 * cv["padding"][s]))
    # odd sizes grown along the last spatial dims first, outputs kept to a few hundred positions
    # (the interpreter runs every tap of every program in Python)
    def grow(add):
        return tuple(v + (add if s >= S - 2 else 0) for s, v in enumerate(lo))
    sweep = [(1, ci) + tuple(lo), (2, ci) + grow(3), (1, ci) + grow(6 if S < 3 else 4)]
    edge = [(3, ci) + tuple(v + (2 if s == S - 1 else 0) for s, v in enumerate(lo)),
            (1, ci) + tuple(v + (10 if s == S - 1 else 0) for s, v in enumerate(lo))]
    return tuple(sweep), tuple(edge)


def _gemm_sweeps(spec) -> tuple[tuple, tuple]:
    """Family shapes (*lead, M, K, N) of a GEMM region: K and N tails of every size against
    the tiles (1, primes, just past a power of two), a long K, tall and wide outputs; the
    last ones are for GPUs (the interpreter keeps M*K*N <= 2^15)."""
    lead = spec["rank"] - 2
    sweep = [(1, 1, 1), (2, 3, 5), (16, 16, 16), (17, 33, 9), (31, 64, 15), (64, 8, 64),
             (1, 300, 100), (4, 1000, 8), (128, 4096, 128), (1, 4096, 1000), (512, 512, 512)]
    edge = [(1, 17, 1), (13, 1, 7), (97, 127, 2), (1, 2049, 3), (4099, 7, 1), (2, 1, 1000)]
    sweep = [(2,) * lead + s for s in sweep] + [(1,) * lead + (3, 7, 5)] if lead else sweep
    edge = [(3,) * lead + s for s in edge] + [(1,) * lead + (1, 1, 1)] if lead else edge
    return tuple(sweep), tuple(edge)


def _red_domain(spec) -> list:
    """The reduced dims in domain (unsplit) coordinates."""
    if not spec.get("split"):
        return list(spec["red"])
    d, _ = spec["split"]
    out = set()
    for k in spec["red"]:
        out.add(k if k <= d else k - 1)
    return sorted(out)


# ---------------------------------------------------------------------------------------------
# inputs, tolerance, cost
# ---------------------------------------------------------------------------------------------

def _inputs_for(spec, ranges, kinds):
    def make(shape, dtype, device, gen, kind="normal"):
        dtype = C.as_dtype(dtype)
        shape = tuple(int(s) for s in shape)
        scale = 1.0 if kind in ("normal", "nan", "inf") else kinds.get(kind)
        if scale is None:
            raise ValueError(f"unknown input kind {kind!r} for region {spec['name']}; known: "
                             f"normal, {', '.join(kinds)}")
        out = {}
        for i, (inp, rname) in enumerate(zip(spec["inputs"], ranges)):
            s = _role_shape(spec, inp, shape)
            if inp["dtype"] == "bool":
                t = C.rand(gen, *s) < 0.5 if s else C.rand(gen, 1)[0] < 0.5
            else:
                lo, hi = RANGES[rname]
                u = C.rand(gen, *s) if s else C.rand(gen, 1)[0]
                # a convolution's weights as models initialize them: sums of its taps stay O(1);
                # a GEMM's b divided by K: each output a mean of K products, in the interval of
                # one (what the ranges were chosen on)
                role = inp.get("role")
                if role == "conv_w":
                    w = 1.0 / math.sqrt(_conv_taps(spec["conv"]))
                elif role == "gemm_b":
                    w = scale / max(1, shape[-2])
                else:
                    w = scale
                t = ((lo + (hi - lo) * u) * w).to(dtype)
                # NaN and Inf go into the activations (the inputs spanning the domain, a
                # convolution's x), not into weights, biases or norm statistics: there where
                # they land depends on how an implementation orders its arithmetic (torch's
                # batch norm folds weight / sqrt(var) first), not on what it computes
                act = inp.get("role") == "conv_x" or (
                    inp.get("map") is not None and len(inp["map"]) == spec["rank"]
                    and None not in inp["map"])
                # a GEMM's a (and the input of a convolution that runs as one) takes NaN but
                # not Inf: fp32 on tensor cores (tf32x3) splits x into a TF32 part and x minus
                # it, which is NaN for x = inf
                act = act or (role == "gemm_a" and kind == "nan")
                if role == "conv_x" and kind == "inf" and conv_dot_ok(spec):
                    act = False
                if kind in ("nan", "inf") and s and act:
                    # about one element in 37 NaN ("nan"), or one in 37 +inf and one in 37 -inf
                    # ("inf"): the output must hold NaN and Inf exactly where torch's ops give
                    # them (a max over a row with a NaN, inf - inf, exp(-inf), gelu(-inf))
                    u2 = C.rand(gen, *s)
                    hi_v, lo_v = (float("nan"), None) if kind == "nan" else (float("inf"), -float("inf"))
                    t = torch.where(u2 < 1 / 37, torch.full_like(t, hi_v), t)
                    if lo_v is not None:
                        t = torch.where(u2 > 1 - 1 / 37, torch.full_like(t, lo_v), t)
            out[f"in{i}"] = t.to(device)
        return out
    return make


def _depth(spec) -> int:
    return sum(1 for op in spec["ops"] if op_parts(op["op"])[0] not in _NOOPS)


def _tolerance_for(spec) -> dict:
    """(atol, rtol) per dtype: a few fp32 ulps per op on top of fp32's own rounding; fp16/bf16
    outputs are rounded once (half an ulp) from an fp32 result, so their rtol is their ulp."""
    g = 1.0 + _depth(spec) / 4.0
    return {torch.float32: (1e-6 * g, 1e-5 * g), torch.float16: (1e-4 * g, 2e-3 * g),
            torch.bfloat16: (1e-3 * g, 1.6e-2 * g)}


_STOL = 16.0


def _bound_for(spec):
    """The region in fp32 against fp64 on the same inputs: what rounding in fp32 costs this
    region (cancellation, long sums); a candidate may be _STOL times as far off."""
    ref = _reference_for(spec)
    n = len(spec["inputs"])

    def bound(**kw):
        f32 = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
               for k, v in kw.items()}
        with torch.no_grad():
            hi = ref(**kw).double()
            lo = _replay(spec, [f32[f"in{i}"] for i in range(n)], fp32_scans=True).double()
        b = (lo - hi).abs()
        b = torch.where(torch.isfinite(b), b, torch.zeros_like(b))
        # eager's own fp32 result can be right by luck at one element (a partial sum that
        # rounds well); another summation order is not: a quarter of the worst error anywhere
        # in the output is allowed everywhere
        b = b + 0.25 * b.max() if b.numel() else b
        if spec.get("gemm"):
            b = b + _gemm_term(spec, kw, hi) / _STOL
        elif conv_dot_ok(spec) and spec["conv"].get("tf32", True):
            b = torch.maximum(b, _conv_tf32_term(spec, kw, hi) / _STOL)
        return b
    return bound


def _conv_tf32_term(spec, kw, hi):
    """What TF32 costs the region's convolution where the model lets cuDNN use it (torch.
    backends.cudnn.allow_tf32, on by default), carried through the epilogue.

    Eager's own error is no yardstick there: cuDNN picks its algorithm per shape, TF32 for a
    large convolution and IEEE fp32 for a small one, so the bound of a small case (the edge
    cases, the sweep's smallest shapes) held an implicit GEMM in TF32 to IEEE fp32's error and
    rejected it (KernelBench level 2's ConvTranspose3d_Clamp_Min_Divide on the H200: 0.0004
    off at an atol of 1.75e-6), while at the shipped shape eager itself ran in TF32. An
    operand read in TF32 keeps 10 mantissa bits: truncated, each product x*w is off by a
    relative -2^-10 on average (the output's own 2^-10 * |g|, allowed twice over) and by a
    spread of about 0.41 * 2^-10 around it, which over the taps adds up to 0.41 * 2^-10 *
    sqrt(sum (x*w)^2) (the convolution of the squares): 2^-8 of that is ten of those spreads.
    The worst case, 2^-9 * (|x| * |w|), would let a kernel that drops one of 576 taps pass.
    With an fp32 sum's rounding over the taps; perturbed both ways, the epilogue's change is
    the allowance (as _gemm_term)."""
    f64 = _inputs64(spec, kw)
    with torch.no_grad():
        g = _first_op(spec, f64)
        gabs = _first_op(spec, [t.abs() if t.is_floating_point() else t for t in f64]).abs()
        spread = _first_op(spec, [t * t if t.is_floating_point() else t for t in f64]).abs().sqrt()
    taps = _conv_taps(spec["conv"])
    d = (2.0**-9 * g.abs() + 2.0**-8 * spread
         + 64 * 2.0**-24 * gabs * max(1.0, math.sqrt(taps) / 8.0))
    return _through_epilogue(spec, f64, hi, g, d)


def _gemm_term(spec, kw, hi):
    """What a correct GEMM's own summation order may cost, carried through the epilogue.

    cuBLAS's fp32 result is no yardstick for a tensor-core dot: fp16/bf16 MMA on Hopper aligns
    its products before adding them (fewer bits than an IEEE fp32 sum), tf32x3 and a K loop of
    8192 in one accumulator round differently. The matmul family's analytic bound per output
    element, d = 64 ulps * (|a| @ |b| * max(1, sqrt(K) / 8) + |a @ b| * K / 64) (kernels/
    matmul.py says where it was measured), perturbs the GEMM's float64 result both ways; the
    epilogue's change of output is the allowance (first order, exact for the affine and
    monotone epilogues regions hold; where it is not finite it allows nothing). ``hi``: the
    region's float64 result on these inputs, already worked out by the caller."""
    f64 = _inputs64(spec, kw)
    # the first op alone, on |inputs|: |a| @ |b| (+ |bias|, which only widens it)
    g = _first_op(spec, f64)
    gabs = _first_op(spec, [t.abs() if t.is_floating_point() else t for t in f64]).abs()
    # K of this case (the sweep varies it): a's last dim
    k = next(int(kw[f"in{i}"].shape[-1]) for i, inp in enumerate(spec["inputs"])
             if inp.get("role") == "gemm_a")
    d = 64 * 2.0**-24 * (gabs * max(1.0, math.sqrt(k) / 8.0) + g.abs() * (k / 64.0))
    return _through_epilogue(spec, f64, hi, g, d)


def _inputs64(spec, kw) -> list:
    return [kw[f"in{i}"].double() if kw[f"in{i}"].is_floating_point() else kw[f"in{i}"]
            for i in range(len(spec["inputs"]))]


def _first_op(spec, inputs):
    """The region's first op (its GEMM or convolution) alone on ``inputs``."""
    return _replay_ops({**spec, "ops": [spec["ops"][0]]}, _flipped(spec, inputs))


def _through_epilogue(spec, f64, hi, g, d):
    """The first op's result ``g`` off by up to ``d`` either way, carried through the rest of
    the region: how far from ``hi`` (the region's float64 result) that moves the output (first
    order, exact for the affine and monotone epilogues regions hold; nothing where not finite)."""
    with torch.no_grad():
        up = _replay(spec, f64, first=g + d)
        dn = _replay(spec, f64, first=g - d)
    t = torch.maximum((up - hi).abs(), (dn - hi).abs())
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


def _cost_for(spec):
    def cost(shape, dtype):
        item = C.itemsize(dtype)
        fshape = tuple(int(s) for s in shape)
        shape = domain_of(spec, fshape)
        nbytes = 0
        for inp in spec["inputs"]:
            n = math.prod(_role_shape(spec, inp, fshape))
            nbytes += n * (1 if inp["dtype"] == "bool" else item)
        out = spec["ops"][-1]
        nbytes += math.prod(input_shape(shape, out["map"])) * item
        flops = 0
        for op in spec["ops"]:
            name, _ = op_parts(op["op"])
            kind, _, f = OPS[name]
            numel = math.prod(shape) if kind != "pw" else math.prod(input_shape(shape, op["map"]))
            if kind == "conv":
                numel *= _conv_taps(spec["conv"])
            if kind == "gemm":
                numel *= fshape[-2]                  # K products an output element
            flops += f * numel
        return nbytes, flops
    return cost


def region_name(spec_ops: list) -> str:
    names = []
    for op in spec_ops:
        n = op_parts(op["op"])[0]
        if n in _NOOPS:
            continue
        names.append(SHORT.get(n, n))
    return "+".join(names) or "copy"


# ---------------------------------------------------------------------------------------------
# the generator: spec -> micro steps -> Triton source
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Step:
    name: str
    kind: str            # "pw" | "red" | "scan" | "in" | "conv" | "gemm"
    expr: str = ""       # pw: the fp32 expression; red/scan: the argument's name
    op: str = ""         # red: sum | max | min | prod; scan: cumsum | cumprod
    deps: tuple = ()
    level: str = "dom"   # "dom": varies along the cols; "row": one value per row
    is_bool: bool = False


class _Lower:
    """Turns the spec's ops into micro steps: fp32 expressions, reductions, scans."""

    def __init__(self, spec):
        self.spec = spec
        self.steps: list[Step] = []
        self.by_name: dict = {}
        self.k = 0
        split = spec.get("split")
        self.cols = set(spec["red"])
        for i, inp in enumerate(spec["inputs"]):
            dims = set(_split_dims(inp["map"], split)) if inp.get("map") is not None else set()
            lvl = "dom" if dims & self.cols else "row"
            self._add(Step(f"in{i}", "in", level=lvl, is_bool=inp["dtype"] == "bool"))
        self.values = []

    def _add(self, st: Step) -> str:
        self.steps.append(st)
        self.by_name[st.name] = st
        return st.name

    def fresh(self) -> str:
        self.k += 1
        return f"t{self.k}"

    def pw(self, expr: str, deps, is_bool=False) -> str:
        deps = tuple(d for d in deps if isinstance(d, str) and d in self.by_name)
        lvl = "dom" if any(self.by_name[d].level == "dom" for d in deps) else "row"
        return self._add(Step(self.fresh(), "pw", expr, deps=deps, level=lvl, is_bool=is_bool))

    def red(self, op: str, arg: str) -> str:
        return self._add(Step(self.fresh(), "red", arg, op, deps=(arg,), level="row"))

    def scan(self, op: str, arg: str) -> str:
        return self._add(Step(self.fresh(), "scan", arg, op, deps=(arg,), level="dom"))

    def f(self, name) -> str:
        """A value as an fp32 operand: bools become 0/1."""
        if isinstance(name, str) and name in self.by_name and self.by_name[name].is_bool:
            return f"{name}.to(tl.float32)"
        return _lit(name) if not isinstance(name, str) else name

    def run(self) -> str:
        for op in self.spec["ops"]:
            self.values.append(self.lower(op))
        return self.values[-1]

    def arg(self, v):
        if isinstance(v, dict) and "in" in v:
            return f"in{v['in']}"
        if isinstance(v, dict) and "v" in v:
            return self.values[v["v"]]
        return decode(v, [], [])

    def lower(self, op) -> str:
        name, overload = op_parts(op["op"])
        a = named_args(op["op"], op["args"], op["kwargs"])
        a = {k: self.arg(v) for k, v in a.items()}
        fn = _LOWER.get(name)
        if fn is None:
            raise ValueError(f"no lowering for aten.{name}")
        return fn(self, a, op)


def _split_dims(m, split) -> list:
    """Domain dims (split coordinates) an input map reaches."""
    out = []
    for d in m:
        if d is None:
            continue
        if split and d == split[0]:
            out += [d, d + 1]
        elif split and d > split[0]:
            out.append(d + 1)
        else:
            out.append(d)
    return out


def _lit(v) -> str:
    if isinstance(v, bool):
        return "1.0" if v else "0.0"
    if isinstance(v, (int, float)):
        v = float(v)
        if math.isinf(v):
            return "float('inf')" if v > 0 else "float('-inf')"
        if v != v:
            return "float('nan')"
        return repr(v)
    raise ValueError(f"not a scalar: {v!r}")


def _tanh(z):
    # tanh(z) = 1 - 2 / (exp(2z) + 1): exact limits at both ends, no overflow to NaN
    return f"(1.0 - 2.0 / (tl.exp(2.0 * ({z})) + 1.0))"


def _log1p(z):
    # log(u) * z / (u - 1), u = 1 + z: accurate for tiny z (Goldberg's trick); +inf stays
    # +inf (the trick's inf * inf / inf is NaN)
    return (f"tl.where(({z}) == float('inf'), ({z}), tl.where((1.0 + ({z})) == 1.0, ({z}), "
            f"tl.log(1.0 + ({z})) * ({z}) / ((1.0 + ({z})) - 1.0)))")


def _expm1(z):
    # (u - 1) * z / log(u), u = exp(z): accurate for tiny z (Kahan); exp's overflow to +inf
    # stays +inf
    return (f"tl.where(tl.exp({z}) == float('inf'), float('inf'), tl.where(tl.exp({z}) == 1.0, ({z}), "
            f"tl.where(tl.exp({z}) - 1.0 == -1.0, -1.0, (tl.exp({z}) - 1.0) * ({z}) / tl.log(tl.exp({z})))))")


def _where_clamp(x, lo, hi):
    # NaN stays NaN (comparisons with NaN are false), as torch.clamp does
    e = x
    if lo is not None:
        e = f"tl.where({e} < {_lit(lo)}, {_lit(lo)}, {e})"
    if hi is not None:
        e = f"tl.where({e} > {_lit(hi)}, {_lit(hi)}, {e})"
    return e


def _softplus(x, beta, threshold):
    z = f"({x}) * {_lit(beta)}"
    return f"tl.where({z} > {_lit(threshold)}, ({x}), {_log1p(f'tl.exp({z})')} / {_lit(beta)})"


def _bin(sym):
    def f(L, a, op):
        x, y = L.f(a["self"]), L.f(a["other"])
        alpha = a.get("alpha", 1)
        if alpha not in (None, 1):
            y = f"({y}) * {_lit(alpha)}"
        if sym == "rsub":
            return L.pw(f"({y}) - ({x})", (a["self"], a["other"]))
        return L.pw(f"({x}) {sym} ({y})", (a["self"], a["other"]))
    return f


def _un(template):
    def f(L, a, op):
        src = a.get("self", a.get("input"))
        x = L.f(src)
        return L.pw(template(x, a), (src,))
    return f


def _test(template):
    """A bool of one input: ``template`` with its fp32 value as {x} (isnan, isinf)."""
    return lambda L, a, op: L.pw(template.format(x=L.f(a["self"])), (a["self"],), is_bool=True)


def _cmp(sym):
    def f(L, a, op):
        return L.pw(f"({L.f(a['self'])}) {sym} ({L.f(a['other'])})", (a["self"], a["other"]),
                    is_bool=True)
    return f


def _div(L, a, op):
    if a.get("rounding_mode") is not None:
        raise ValueError("div with a rounding mode")
    return L.pw(f"({L.f(a['self'])}) / ({L.f(a['other'])})", (a["self"], a["other"]))


def _pow(L, a, op):
    e = a["exponent"]
    x = L.f(a["self"])
    if not isinstance(e, (int, float)):
        raise ValueError("pow with a tensor exponent")
    if float(e).is_integer() and 0 <= e <= 4:
        expr = " * ".join([f"({x})"] * int(e)) if e else "1.0"
        if e == 0:
            expr = f"({x}) * 0.0 + 1.0"
    elif e == 0.5:
        expr = f"tl.sqrt({x})"
    elif e == -0.5:
        expr = f"tl.rsqrt({x})"
    elif float(e).is_integer() and e < 0:
        expr = "1.0 / (" + " * ".join([f"({x})"] * int(-e)) + ")"
    else:
        expr = f"tl.exp2({_lit(e)} * tl.log2({x}))"
    return L.pw(expr, (a["self"],))


def _trunc(x):
    return f"tl.where(({x}) < 0.0, tl.ceil({x}), tl.floor({x}))"


def _shrink(x, lambd, soft):
    """softshrink: x -+ lambd outside [-lambd, lambd], else 0; hardshrink: x there. NaN
    falls through both comparisons to the last branch: it must be x, as torch keeps it."""
    lo, hi = (f"({x}) + {_lit(lambd)}", f"({x}) - {_lit(lambd)}") if soft else (x, x)
    return (f"tl.where(({x}) > {_lit(lambd)}, {hi}, tl.where(({x}) < {_lit(-lambd)}, {lo}, "
            f"tl.where(({x}) != ({x}), ({x}), 0.0)))")


def _logaddexp(L, a, op):
    """max + log1p(exp(-|x - y|)); equal infinities give themselves (their difference is NaN),
    as torch's kernel does."""
    x, y = L.f(a["self"]), L.f(a["other"])
    m = f"tl.where(({x}) > ({y}), ({x}), ({y}))"
    d = f"tl.exp(-tl.abs(({x}) - ({y})))"
    return L.pw(f"tl.where((({x}) == ({y})) & (tl.abs({x}) == float('inf')), ({x}), "
                f"tl.where(({x}) != ({x}), ({x}), {m} + {_log1p(d)}))", (a["self"], a["other"]))


def _minmax(fn):
    def f(L, a, op):
        x, y = L.f(a["self"]), L.f(a["other"])
        # NaN in either operand gives NaN, as torch.maximum / minimum do
        return L.pw(f"tl.where(({x}) != ({x}), ({x}), tl.where(({y}) != ({y}), ({y}), "
                    f"tl.{fn}({x}, {y})))", (a["self"], a["other"]))
    return f


def _gelu(x, a):
    if a.get("approximate", "none") == "tanh":
        inner = f"0.7978845608028654 * (({x}) + 0.044715 * ({x}) * ({x}) * ({x}))"
        return f"0.5 * ({x}) * (1.0 + {_tanh(inner)})"
    return f"0.5 * ({x}) * (1.0 + tl.erf(({x}) * 0.7071067811865476))"


def _elu(x, alpha, scale, input_scale):
    neg = f"{_lit(scale * alpha)} * ({_expm1(f'({x}) * {_lit(input_scale)}')})"
    return f"tl.where(({x}) > 0.0, {_lit(scale)} * ({x}), {neg})"


def _cast(L, a, op):
    src = a.get("self", a.get("input"))
    want = a.get("dtype")
    if want is None and op["args"][1:] and isinstance(op["args"][1], dict) and "dtype" in op["args"][1]:
        want = getattr(torch, op["args"][1]["dtype"])
    if not isinstance(want, torch.dtype):
        want = getattr(torch, op["dtype"]) if op.get("dtype") else None
    if want is None or not isinstance(src, str):
        return src
    st = L.by_name[src]
    if want == torch.bool:
        return L.pw(f"({L.f(src)}) != 0.0", (src,), is_bool=True)
    if st.is_bool and want.is_floating_point:
        return L.pw(f"{src}.to(tl.float32)", (src,))
    narrow = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}.get(want)
    src_bits = _bits(op.get("src_dtype"))
    if narrow and (src_bits == 0 or src_bits > torch.finfo(want).bits):
        # the model rounds here: so does the kernel
        return L.pw(f"({src}).to({narrow}).to(tl.float32)", (src,))
    return src


def _identity(L, a, op):
    src = a.get("self", a.get("input"))
    if op_parts(op["op"])[0] == "dropout" and a.get("train") and a.get("p"):
        raise ValueError("dropout in training mode")
    return src


def _where(L, a, op):
    c = a["condition"]
    cond = c if L.by_name.get(c, Step("", "")).is_bool else f"({L.f(c)}) != 0.0"
    return L.pw(f"tl.where({cond}, {L.f(a['self'])}, {L.f(a['other'])})",
                (c, a["self"], a["other"]))


def _masked_fill(L, a, op):
    m = a["mask"]
    cond = m if L.by_name.get(m, Step("", "")).is_bool else f"({L.f(m)}) != 0.0"
    return L.pw(f"tl.where({cond}, {L.f(a['value'])}, {L.f(a['self'])})", (a["self"], m, a["value"]))


def _batch_norm(L, a, op):
    if a.get("training"):
        raise ValueError("batch norm in training mode")
    x, rm, rv = L.f(a["input"]), L.f(a["running_mean"]), L.f(a["running_var"])
    e = f"(({x}) - ({rm})) * tl.rsqrt(({rv}) + {_lit(float(a['eps']))})"
    deps = [a["input"], a["running_mean"], a["running_var"]]
    if a.get("weight") is not None:
        e = f"({e}) * ({L.f(a['weight'])})"
        deps.append(a["weight"])
    if a.get("bias") is not None:
        e = f"({e}) + ({L.f(a['bias'])})"
        deps.append(a["bias"])
    return L.pw(e, deps)


def _n(L) -> str:
    return "n_red"       # elements reduced per row: a kernel argument (float)


def _reduce(kind):
    def f(L, a, op):
        x = a.get("self")
        name = op_parts(op["op"])[0]
        s = L.red(kind, L.f(x) if not L.by_name[x].is_bool else L.pw(f"{x}.to(tl.float32)", (x,)))
        if name == "mean":
            return L.pw(f"{s} / {_n(L)}", (s,))
        return s
    return f


def _var(L, a, op, std=False):
    x = L.f(a["self"])
    corr = a.get("correction")
    if corr is None:
        corr = 0 if a.get("unbiased") is False else 1
    m = L.pw(f"{L.red('sum', x)} / n_red", (L.steps[-1].name,))
    d = L.pw(f"({x}) - {m}", (a["self"], m))
    ss = L.red("sum", L.pw(f"{d} * {d}", (d,)))
    v = L.pw(f"{ss} / tl.maximum(n_red - {_lit(float(corr))}, 0.0)", (ss,))
    return L.pw(f"tl.sqrt({v})", (v,)) if std else v


def _logsumexp(L, a, op):
    x = L.f(a["self"])
    m = L.red("max", x)
    ms = L.pw(f"tl.where(({m} == float('inf')) | ({m} == float('-inf')), 0.0, {m})", (m,))
    s = L.red("sum", L.pw(f"tl.exp(({x}) - {ms})", (a["self"], ms)))
    return L.pw(f"tl.log({s}) + {ms}", (s, ms))


def _softmax(log):
    def f(L, a, op):
        x = L.f(a["self"])
        m = L.red("max", x)
        ms = L.pw(f"tl.where({m} == float('-inf'), 0.0, {m})", (m,))
        e = L.pw(f"tl.exp(({x}) - {ms})", (a["self"], ms))
        s = L.red("sum", e)
        if log:
            return L.pw(f"({x}) - {ms} - tl.log({s})", (a["self"], ms, s))
        return L.pw(f"{e} / {s}", (e, s))
    return f


def _argminmax(L, a, op):
    return L.red(op_parts(op["op"])[0], L.f(a["self"]))


def _loss(L, a, op):
    """l1 / mse / smooth_l1 / huber / kl_div: the pointwise term, summed over every dim, over
    the element count for reduction 1 (mean)."""
    name = op_parts(op["op"])[0]
    x, t = a["self"], a["target"]
    fx_, ft = L.f(x), L.f(t)
    if name == "kl_div":
        if a.get("log_target"):
            e = L.pw(f"tl.exp({ft}) * (({ft}) - ({fx_}))", (x, t))
        else:       # xlogy(t, t) - t * x: 0 where t == 0, NaN where t < 0, as torch
            e = L.pw(f"tl.where(({ft}) == 0.0, 0.0, ({ft}) * tl.log({ft})) - ({ft}) * ({fx_})", (x, t))
    else:
        d = L.pw(f"({fx_}) - ({ft})", (x, t))
        if name == "l1_loss":
            e = L.pw(f"tl.abs({d})", (d,))
        elif name == "mse_loss":
            e = L.pw(f"{d} * {d}", (d,))
        else:
            k = float(a.get("beta" if name == "smooth_l1_loss" else "delta", 1.0))
            if name == "smooth_l1_loss" and k == 0.0:
                e = L.pw(f"tl.abs({d})", (d,))
            elif name == "smooth_l1_loss":      # 0.5 d^2 / beta inside |d| < beta, |d| - beta / 2 out
                e = L.pw(f"tl.where(tl.abs({d}) < {_lit(k)}, 0.5 * {d} * {d} / {_lit(k)}, "
                         f"tl.abs({d}) - {_lit(0.5 * k)})", (d,))
            else:                               # 0.5 d^2 inside |d| < delta, delta (|d| - delta / 2) out
                e = L.pw(f"tl.where(tl.abs({d}) < {_lit(k)}, 0.5 * {d} * {d}, "
                         f"{_lit(k)} * (tl.abs({d}) - {_lit(0.5 * k)}))", (d,))
    s_ = L.red("sum", e)
    return L.pw(f"{s_} / {_n(L)}", (s_,)) if int(a.get("reduction", 1)) == 1 else s_


def _vnorm(L, a, op):
    p = a.get("ord", a.get("p", 2))
    p = 2 if p is None else p
    x = L.f(a["self"])
    if p == 2:
        return L.pw(f"tl.sqrt({L.red('sum', L.pw(f'({x}) * ({x})', (a['self'],)))})", (L.steps[-1].name,))
    if p == 1:
        return L.red("sum", L.pw(f"tl.abs({x})", (a["self"],)))
    if p == float("inf"):
        return L.red("max", L.pw(f"tl.abs({x})", (a["self"],)))
    raise ValueError(f"vector norm of order {p}")


def _norm_rows(L, a, op):
    """layer / group / instance norm: (x - mean) * rsqrt(var + eps) * w + b over the reduced
    dims (the biased variance, as torch's norms use)."""
    x = L.f(a["input"])
    m = L.pw(f"{L.red('sum', x)} / n_red", (L.steps[-1].name,))
    d = L.pw(f"({x}) - {m}", (a["input"], m))
    ss = L.red("sum", L.pw(f"{d} * {d}", (d,)))
    eps = float(a.get("eps") if a.get("eps") is not None else 1e-5)
    r = L.pw(f"tl.rsqrt({ss} / n_red + {_lit(eps)})", (ss,))
    e, deps = f"{d} * {r}", [d, r]
    if a.get("weight") is not None:
        e, deps = f"({e}) * ({L.f(a['weight'])})", deps + [a["weight"]]
    if a.get("bias") is not None:
        e, deps = f"({e}) + ({L.f(a['bias'])})", deps + [a["bias"]]
    return L.pw(e, deps)


def _scan(kind):
    def f(L, a, op):
        return L.scan(kind, L.f(a["self"]) if not L.by_name[a["self"]].is_bool
                      else L.pw(f"{a['self']}.to(tl.float32)", (a["self"],)))
    return f


def _conv(L, a, op):
    args = (a["self"],) if op_parts(op["op"])[0] in POOLS else (a["input"], a["weight"], a.get("bias"))
    return L._add(Step(L.fresh(), "conv", "", op_parts(op["op"])[0],
                       deps=tuple(d for d in args if isinstance(d, str)), level="dom"))


def _gemm(L, a, op):
    """The GEMM's accumulator tile (a "gemm" step: its lines are the K loop), then what the op
    adds to it in the epilogue: a linear layer's bias, addmm's beta * self (alpha scales the
    product first, as torch computes beta * self + alpha * (mat1 @ mat2))."""
    name = op_parts(op["op"])[0]
    x, w, add = {"linear": ("input", "weight", "bias"), "addmm": ("mat1", "mat2", "self"),
                 "matmul": ("self", "other", None)}.get(name, ("self", "mat2", None))
    g = L._add(Step(L.fresh(), "gemm", "", name, deps=(a[x], a[w]), level="dom"))
    extra = a.get(add) if add else None
    if name == "addmm":
        alpha, beta = float(a.get("alpha", 1)), float(a.get("beta", 1))
        if alpha != 1.0:
            g = L.pw(f"{g} * {_lit(alpha)}", (g,))
        if beta == 0.0:                        # torch ignores self then (NaN in it included)
            return g
        extra = extra if beta == 1.0 else L.pw(f"{L.f(extra)} * {_lit(beta)}", (extra,))
    if isinstance(extra, str):
        return L.pw(f"{g} + {L.f(extra)}", (g, extra))
    return g


_LOWER = {
    **{name: _gemm for name in GEMMS},
    "conv1d": _conv, "conv2d": _conv, "conv3d": _conv, "conv_transpose1d": _conv,
    "conv_transpose2d": _conv, "conv_transpose3d": _conv, **{name: _conv for name in POOLS},
    "add": _bin("+"), "sub": _bin("-"), "rsub": _bin("rsub"), "mul": _bin("*"),
    "multiply": _bin("*"), "div": _div, "pow": _pow,
    "neg": _un(lambda x, a: f"-({x})"), "abs": _un(lambda x, a: f"tl.abs({x})"),
    "reciprocal": _un(lambda x, a: f"1.0 / ({x})"), "square": _un(lambda x, a: f"({x}) * ({x})"),
    # torch.sign(NaN) is 0 (it computes (0 < x) - (x < 0))
    "sign": _un(lambda x, a: f"tl.where(({x}) > 0.0, 1.0, tl.where(({x}) < 0.0, -1.0, 0.0))"),
    "floor": _un(lambda x, a: f"tl.floor({x})"), "ceil": _un(lambda x, a: f"tl.ceil({x})"),
    "trunc": _un(lambda x, a: _trunc(x)),
    # x - trunc(x); an infinite x has none (torch: NaN)
    "frac": _un(lambda x, a: f"tl.where(tl.abs({x}) == float('inf'), float('nan'), ({x}) - {_trunc(x)})"),
    "maximum": _minmax("maximum"), "minimum": _minmax("minimum"),
    "exp": _un(lambda x, a: f"tl.exp({x})"), "exp2": _un(lambda x, a: f"tl.exp2({x})"),
    "expm1": _un(lambda x, a: _expm1(x)), "log": _un(lambda x, a: f"tl.log({x})"),
    "log2": _un(lambda x, a: f"tl.log2({x})"),
    "log10": _un(lambda x, a: f"tl.log2({x}) * 0.30102999566398120"),
    "log1p": _un(lambda x, a: _log1p(x)), "sqrt": _un(lambda x, a: f"tl.sqrt({x})"),
    "rsqrt": _un(lambda x, a: f"tl.rsqrt({x})"), "sin": _un(lambda x, a: f"tl.sin({x})"),
    "cos": _un(lambda x, a: f"tl.cos({x})"), "erf": _un(lambda x, a: f"tl.erf({x})"),
    "tanh": _un(lambda x, a: _tanh(x)), "sigmoid": _un(lambda x, a: f"tl.sigmoid({x})"),
    # min(x, 0) - log1p(exp(-|x|)): no overflow either way; NaN stays NaN (a where, not
    # tl.minimum, which drops NaN on a GPU)
    "log_sigmoid": _un(lambda x, a: f"tl.where(({x}) < 0.0, ({x}), 0.0) - {_log1p(f'tl.exp(-tl.abs({x}))')}"),
    "logaddexp": _logaddexp,
    "relu": _un(lambda x, a: f"tl.where(({x}) < 0.0, 0.0, ({x}))"),
    "leaky_relu": _un(lambda x, a: f"tl.where(({x}) > 0.0, ({x}), ({x}) * {_lit(a.get('negative_slope', 0.01))})"),
    "gelu": _un(_gelu), "silu": _un(lambda x, a: f"({x}) * tl.sigmoid({x})"),
    "mish": _un(lambda x, a: f"({x}) * {_tanh(_softplus(x, 1.0, 20.0))}"),
    "softplus": _un(lambda x, a: _softplus(x, float(a.get("beta", 1.0)), float(a.get("threshold", 20.0)))),
    "elu": _un(lambda x, a: _elu(x, float(a.get("alpha", 1.0)), float(a.get("scale", 1.0)),
                                 float(a.get("input_scale", 1.0)))),
    "selu": _un(lambda x, a: _elu(x, 1.6732632423543772, 1.0507009873554805, 1.0)),
    "celu": _un(lambda x, a: _elu(x, float(a.get("alpha", 1.0)), 1.0, 1.0 / float(a.get("alpha", 1.0)))),
    "hardtanh": _un(lambda x, a: _where_clamp(x, float(a.get("min_val", -1.0)), float(a.get("max_val", 1.0)))),
    "hardsigmoid": _un(lambda x, a: _where_clamp(f"({x}) / 6.0 + 0.5", 0.0, 1.0)),
    "hardswish": _un(lambda x, a: f"({x}) * {_where_clamp(f'({x}) + 3.0', 0.0, 6.0)} / 6.0"),
    "clamp": _un(lambda x, a: _where_clamp(x, a.get("min"), a.get("max"))),
    "clamp_min": _un(lambda x, a: _where_clamp(x, a.get("min"), None)),
    "clamp_max": _un(lambda x, a: _where_clamp(x, None, a.get("max"))),
    "threshold": _un(lambda x, a: f"tl.where(({x}) <= {_lit(a['threshold'])}, {_lit(a['value'])}, ({x}))"),
    "softshrink": _un(lambda x, a: _shrink(x, float(a.get("lambd", 0.5)), soft=True)),
    "hardshrink": _un(lambda x, a: _shrink(x, float(a.get("lambd", 0.5)), soft=False)),
    "where": _where, "masked_fill": _masked_fill,
    "gt": _cmp(">"), "lt": _cmp("<"), "ge": _cmp(">="), "le": _cmp("<="), "eq": _cmp("=="),
    "ne": _cmp("!="),
    "logical_not": lambda L, a, op: L.pw(f"({L.f(a['self'])}) == 0.0", (a["self"],), is_bool=True),
    "isnan": _test("({x}) != ({x})"), "isinf": _test("tl.abs({x}) == float('inf')"),
    "isposinf": _test("({x}) == float('inf')"), "isneginf": _test("({x}) == float('-inf')"),
    "logical_and": lambda L, a, op: L.pw(f"(({L.f(a['self'])}) != 0.0) & (({L.f(a['other'])}) != 0.0)",
                                         (a["self"], a["other"]), is_bool=True),
    "logical_or": lambda L, a, op: L.pw(f"(({L.f(a['self'])}) != 0.0) | (({L.f(a['other'])}) != 0.0)",
                                        (a["self"], a["other"]), is_bool=True),
    "_to_copy": _cast, "to": _cast, "type_as": _identity, "clone": _identity,
    "contiguous": _identity, "alias": _identity, "detach": _identity, "lift_fresh_copy": _identity,
    "dropout": _identity,
    "batch_norm": _batch_norm, "_native_batch_norm_legit_no_training": _batch_norm,
    "sum": _reduce("sum"), "mean": _reduce("sum"), "amax": _reduce("max"), "amin": _reduce("min"),
    "max": _reduce("max"), "min": _reduce("min"), "prod": _reduce("prod"),
    "var": lambda L, a, op: _var(L, a, op), "std": lambda L, a, op: _var(L, a, op, std=True),
    "logsumexp": _logsumexp, "linalg_vector_norm": _vnorm, "norm": _vnorm,
    "softmax": _softmax(False), "_softmax": _softmax(False), "log_softmax": _softmax(True),
    "_log_softmax": _softmax(True),
    "layer_norm": _norm_rows, "group_norm": _norm_rows, "instance_norm": _norm_rows,
    "cumsum": _scan("cumsum"), "cumprod": _scan("cumprod"),
    **{name: _loss for name in _LOSSES},
    "argmax": _argminmax, "argmin": _argminmax,
}
_NEUTRAL = {"sum": "0.0", "max": "float('-inf')", "min": "float('inf')", "prod": "1.0",
            "cumsum": "0.0", "cumprod": "1.0", "argmax": "float('-inf')", "argmin": "float('inf')"}


def _combine(op: str, acc: str, v: str) -> str:
    """The expression folding one chunk's values ``v`` into a reduction's per-lane accumulator.
    NaN sticks in max / min (torch's amax/amin propagate it; tl.maximum on a GPU drops it)."""
    if op in ("max", "min"):
        return (f"tl.where({acc} != {acc}, {acc}, tl.where(({v}) != ({v}), ({v}), "
                f"tl.{op}imum({acc}, {v})))")
    return {"sum": f"{acc} + {v}", "prod": f"{acc} * {v}"}[op]


def lower(spec) -> tuple[list[Step], str]:
    """The spec's micro steps (inputs first) and the name of the output value."""
    L = _Lower(spec)
    out = L.run()
    if not isinstance(out, str) or out not in L.by_name:
        raise ValueError("the region's output is not a computed value")
    for st in L.steps:
        if st.kind in ("red", "scan") and L.by_name[st.expr].level == "row":
            # torch reduces a size-1 dim there; a tile would add up the broadcast value
            raise ValueError("a reduction of a value that is constant along the reduced dims")
        if st.kind == "red":
            for anc in _ancestors(L.by_name, st.deps):
                if L.by_name[anc].kind == "scan":
                    raise ValueError("a reduction of a scan")
    return L.steps, out


def _ancestors(by_name, names) -> set:
    seen, stack = set(), list(names)
    while stack:
        n = stack.pop()
        if n in seen or n not in by_name:
            continue
        seen.add(n)
        stack.extend(by_name[n].deps)
    return seen


SPACE = {
    "variant": ["auto", "looped"],      # auto: one_pass when a row fits max_block
    "max_block": [1024, 2048, 4096, 8192, 16384],
    "block": [64, 128, 256, 512, 1024, 2048],   # chunk of the looped kernel
    "rows_cap": [1, 2, 4, 8, 16, 32, 64],       # rows per program, at most
    "max_tile": [1024, 2048, 4096, 8192, 16384],   # elements of a program's [ROWS, BLOCK] tile
    "col_dims": [1, 2, 3],                      # pointwise regions: trailing dims per row
    "num_warps": [1, 2, 4, 8, 16],
    "row_order": ["auto", "flat"],              # reductions: see _inner_dim
}
DEFAULT = {"variant": "auto", "max_block": 4096, "block": 512, "rows_cap": 64, "max_tile": 8192,
           "col_dims": 1, "num_warps": 4, "row_order": "auto"}
# A GEMM region's space: the matmul family's tile, order, pipeline and fp32-dot choices (one
# output tile a program, the epilogue on its accumulator; no split-K: the epilogue is not linear)
GEMM_SPACE = {k: list(_mm.SPACE[k]) for k in ("block_m", "block_n", "block_k", "group_m",
                                              "num_warps", "num_stages", "fp32_dot", "k_major")}
# a convolution's implicit GEMM gathers its input tile: no operand to split before it
CONV_FP32_DOT = [v for v in GEMM_SPACE["fp32_dot"] if v != "tf32x3_split"] + ["tf32"]
GEMM_ONLY = ("k_major",)          # an operand copy: a GEMM region's, not an implicit GEMM's
# 8 warps: a 128 x 128 fp32 accumulator in 4 warps (one warpgroup) is 128 registers a thread
# before the operands; compiled for sm_90 (ptxas -v, no GPU needed), the 4-warp GEMM region
# spilled 2-3 KB a thread at 128 x 128 x 32 in bf16 and the 8-warp one nothing
GEMM_DEFAULT = {**{k: _mm.DEFAULT[k] for k in GEMM_SPACE}, "num_warps": 8}
# An fp32 GEMM region's first point: tf32x3 with K-contiguous operands and 64-deep K steps, 4
# stages (as many as the shared memory holds: _fit_gemm). The matmul family's K loop is the
# same: on the H200 (KernelBench level 1, fp32) tf32x3 at 128 x 128 x 32, 4 warps, 3 stages ran
# 4096^3 in 3,800 us, slower than cuBLAS's 2,677; with 64-deep K steps, 8 warps and 4 stages it
# ran 1.41-1.48x cuBLAS at 128 x 64 (the square problems) and 1.79x at 128 x 128 (problem 10)
GEMM_FP32_FIRST = {"fp32_dot": "tf32x3", "k_major": True, "block_k": 64, "num_stages": 4}


# A reduction's looped kernel (a row wider than max_block, read once per pass): "loop_rows" rows
# a program (a row is already a program's work: ROWS_CAP's 16 rows of 65,535 left a 32,768-row
# L2 norm 2,048 programs, a group norm of 896 groups 56); "cache_hints": the reduction passes'
# loads evict_last, the last pass's evict_first; "last_pass" "reverse": the last pass walks the
# chunks from the end, the ones the pass before it read last (still in L2) first; "grid"
# "persistent": progs_per_sm programs an SM looping over row blocks, so the rows in flight
# between two passes (their bytes in L2) are bounded by the grid
LOOP_SPACE = {"loop_rows": [1, 2, 4, 8, 16], "loop_warps": [1, 2, 4, 8, 16],
              "cache_hints": [False, True], "last_pass": ["forward", "reverse"],
              "grid": ["rows", "persistent"], "progs_per_sm": [1, 2, 4, 8]}
# On the H200 (KernelBench level 1, fp32) one row a program ran 39_L2Norm's 32,768 x 65,535 in
# 13.4 ms against 15.2 with 16; the cache hints were 3-5% slower there and in 35_GroupNorm, so
# they start off; 1,024-wide chunks at 4 warps beat 512 in 35, 39 and 34_InstanceNorm (8.0 /
# 12.6 / 7.2 ms against 9.2 / 13.5 / 7.3). The warps split: one warp a program ran 39 (rows
# 65,535 apart: scalar loads) in 6.8 ms, 35 (aligned rows) in 15.6 (docs/benchmarks.md)
LOOP_DEFAULT = {"block": 1024, "loop_rows": 1, "loop_warps": 4, "cache_hints": False,
                "last_pass": "reverse", "grid": "rows", "progs_per_sm": 2}


# A region with one reduction and a row-level output (a loss's mean over everything, a sum over
# all dims, a max of a long row): the row's slices on several programs when rows are too few to
# fill the GPU. "split_progs" is how many programs to aim for (0: never split). One program a row
# left a [1, 1e9] mean (KernelBench's HuberLoss) on one SM, each lane adding 2M values in order:
# 5e-5 off its fp64 sum; with slices each lane adds at most a few thousand. On the H200
# (KernelBench's HingeLoss, a mean of 2^30 computed terms) one program took 1,086 ms, 1,024
# slices 1,415 us and 4,096 slices 1,068 us (96% of the speed of light).
SPLIT_SPACE = {"split_progs": [0, 256, 1024, 4096, 16384]}
SPLIT_DEFAULT = {"split_progs": 4096}
SPLIT_OPS = ("sum", "max", "min")


def splittable(spec) -> bool:
    """One reduction (sum, max or min) whose row value the output is, no scan, no GEMM or
    convolution: a row's slices reduce apart and one more kernel combines them in order."""
    if spec.get("gemm") or spec.get("conv") or not spec["red"]:
        return False
    try:
        steps, out = lower(spec)
    except ValueError:
        return False
    by = {s.name: s for s in steps}
    used = _ancestors(by, (out,))
    reds = [s for s in steps if s.kind == "red" and s.name in used]
    if len(reds) != 1 or reds[0].op not in SPLIT_OPS:
        return False
    if any(s.kind in ("scan", "conv", "gemm") for s in steps if s.name in used):
        return False
    return not set(_split_dims(spec["ops"][-1]["map"], spec.get("split"))) & set(spec["red"])


# A convolution's implicit GEMM starts at the tap-major "window" loop on channels-last copies
# of x and w ("conv_layout" "channels", as inductor lays out a convolution's operands: the
# [ROWS, BLOCK_K] input tile and the [BLOCK_K, BLOCK_N] weight tile run along K, the order
# Hopper's TF32 tensor-core operands want) where a tap's input channels fill the default
# 32-deep K step; with fewer, the flat "dot" gather (K = Ci x taps) on the model's layout
# wastes no lanes. On the H200 (KernelBench level 2, fp32 in TF32, 128 x 128 x 32 tiles, the
# region's own inputs): Ci = 64 Conv2d 3x3 with its epilogue (32, 4, 52) and a Ci = 64
# ConvTranspose2d (16) ran 1.4-3.1x faster as window + channels than as dot (32: 7,706 ->
# 3,901 us, 156 TFLOP/s); the window loop on the model's NCHW layout was slower than dot;
# a Ci = 3 Conv3d (48) was fastest as dot (channels 2,937 us, model 3,182)
WINDOW_MIN_CI = 32


def space_of(spec) -> tuple[dict, dict]:
    """(space, default) of a region: a GEMM's tile space; a convolution with weights and one
    group: the region space plus the implicit GEMM (its tile axes; "conv_loop" "dot" or
    "window", the starter by WINDOW_MIN_CI) beside the tap loop ("taps"); any other region:
    the region space."""
    if spec.get("gemm"):
        return GEMM_SPACE, GEMM_DEFAULT
    if conv_dot_ok(spec):
        # "tf32" too (the first opener, where cuDNN may use it): eager runs an fp32
        # convolution in TF32 unless the model turned torch.backends.cudnn.allow_tf32 off, and
        # the judge's bound is eager's own fp32 error on the GPU, so a TF32 dot passes exactly
        # where eager computed in TF32 (an IEEE fp32 dot ran KernelBench's Conv2d_Mish_Mish at
        # 41 ms on the H200, eager's cuDNN in 7.6 ms). Not the starter: cuDNN picks an IEEE
        # algorithm for small convolutions (a [2, 3, 11] one on the H200), where TF32 fails
        extra = {k: v for k, v in GEMM_SPACE.items() if k != "num_warps" and k not in GEMM_ONLY}
        extra["fp32_dot"] = CONV_FP32_DOT
        cv = spec["conv"]
        ci = cv["w_shape"][0] if cv["transposed"] else cv["w_shape"][1]
        wide = ci >= WINDOW_MIN_CI
        return ({"conv_loop": ["dot", "window", "taps"], "conv_layout": ["model", "channels"],
                 **SPACE, **extra},
                {"conv_loop": "window" if wide else "dot",
                 "conv_layout": "channels" if wide else "model", **DEFAULT,
                 **{k: v for k, v in GEMM_DEFAULT.items() if k not in GEMM_ONLY}})
    space, default = ((SPACE, DEFAULT) if not spec["red"]
                      else ({**SPACE, **LOOP_SPACE}, {**DEFAULT, **LOOP_DEFAULT}))
    if splittable(spec):
        return {**space, **SPLIT_SPACE}, {**default, **SPLIT_DEFAULT}
    return space, default


def _openers(space, spec) -> tuple:
    """A pointwise region: inductor's block for large pointwise kernels. A GEMM region: fp32
    operands on tensor cores first, as the matmul family tries them (the
    K loop's three TF32 products; matmul.openers_for says why not the pre-split operands); a
    convolution's implicit GEMM: TF32 before that where eager's cuDNN may run in TF32 (unless
    the model turned it off: the spec says so, from the process that captured the model)."""
    if "fp32_dot" not in space:
        # a pointwise region: torch.compile's tile for a large one first (a flat 1,024-element
        # block, 4 warps), the space's other shapes after it
        return ({"max_block": 1024, "max_tile": 1024, "num_warps": 4},) if not spec["red"] else ()
    if "k_major" in space:           # a GEMM region: with K-contiguous operands, then alone
        return (GEMM_FP32_FIRST,) + _mm.FAMILY.openers
    tf32 = "tf32" in space["fp32_dot"] and (spec.get("conv") or {}).get("tf32", True)
    return (({"fp32_dot": "tf32"},) if tf32 else ()) + _mm.FAMILY.openers


def _default_for(space, spec):
    """An fp32 GEMM or convolution region starts at its first opener (the IEEE dot ran
    KernelBench's Conv2d_Mish_Mish at 41 ms on the H200, eager's cuDNN in 7.6 ms: never placed,
    and at that size the one experiment of a problem's budget)."""
    first = _openers(space, spec) if "fp32_dot" in space else ()
    if not first:
        return None
    return lambda shape, dtype: dict(first[0]) if dtype == "float32" else {}


def _plan_dims(spec, p) -> tuple[list, list]:
    """(row dims, col dims) in split coordinates."""
    r = spec["rank"] + (1 if spec.get("split") else 0)
    if spec.get("gemm"):
        cols = [r - 1]                   # the GEMM's N along the tile; rows: *lead, M
    elif spec.get("conv"):
        cols = [1]                       # output channels along the tile; rows: (n, spatial)
    elif spec["red"]:
        cols = list(spec["red"])
    else:
        k = min(int(p["col_dims"]), r)
        cols = list(range(r - k, r)) if r else []
    rows = [d for d in range(r) if d not in cols]
    return rows, cols


def _inner_dim(spec, p, rows_d) -> int | None:
    """The kept dim a reduction's tile runs along, or None. A reduction over dims other than the
    last (KernelBench's max / min / sum / argmax over dim 1 of [128, 4096, 4095]) keeps the
    innermost dim, the contiguous one: with "row_order" "auto" a program takes ROWS consecutive
    positions of it (one outer row, the position block pid % n_blocks) so the tile's row axis
    is a contiguous run Triton's coalescing sees and loads along. Flat rows (the row index
    decomposed by % and //, contiguity unknown to Triton) read it column by column, 4095 x 4
    bytes apart: on the H200 the max over dim 1 ran at 24.7% of the copy rate, torch.compile
    at 96%. A convolution's or pooling's tap loop (rows: batch and output positions, cols: the
    channels) the same: flat rows put a warp's lanes along the channels, a whole row of
    positions apart (KernelBench's AvgPool1d over 65,536 positions read at 34% of the copy
    rate on the H200, compile at 100%)."""
    if p.get("row_order", "auto") != "auto" or spec.get("gemm") or not rows_d:
        return None
    if spec.get("conv"):
        if p.get("conv_loop") in ("dot", "window"):
            return None                  # the implicit GEMM tiles (positions, channels) itself
    elif not spec["red"]:
        return None
    last = spec["rank"] + (1 if spec.get("split") else 0) - 1
    return last if rows_d[-1] == last else None


def _decompose(idx: str, dims: list, prefix: str, name: str = "i") -> list:
    """Lines: per-dim indices {name}{d} of a flat index over ``dims`` (last fastest)."""
    lines = []
    if not dims:
        return lines
    rem = f"{prefix}_rem"
    lines.append(f"{rem} = {idx}")
    for j, d in enumerate(reversed(dims)):
        if j == len(dims) - 1:
            lines.append(f"{name}{d} = {rem}")
        else:
            lines.append(f"{name}{d} = {rem} % d{d}")
            lines.append(f"{rem} = {rem} // d{d}")
    return lines


def render_for(spec):
    steps, out = lower(spec)
    by = {s.name: s for s in steps}
    split = spec.get("split")
    nin = len(spec["inputs"])
    in_dims = [_split_dims(inp["map"], split) if inp.get("map") is not None else []
               for inp in spec["inputs"]]
    roles = {i for i, inp in enumerate(spec["inputs"]) if inp.get("role")}   # read by the conv
    out_map = spec["ops"][-1]["map"]
    out_dims = _split_dims(out_map, split)
    r2 = spec["rank"] + (1 if split else 0)

    gemm = spec.get("gemm")
    space, default = space_of(spec)

    def render(params):
        p = C.resolve(NAME, space, default, params)
        conv_dot = bool(spec.get("conv")) and p.get("conv_loop") in ("dot", "window")
        rows_d, cols_d = _plan_dims(spec, p)
        inner_d = _inner_dim(spec, p, rows_d)
        colset = set(cols_d)
        # several column dims, no convolution or GEMM (their loops index the dims themselves):
        # a FLAT variant reads them as one index where the strides allow (_FLAT_SRC). With
        # one div and mod of int64 an element per column dim, a group norm's [C/G, H, W]
        # columns ran at 7.7% of the copy rate on the H200 (KernelBench level 1's 35), an
        # instance norm's [H, W] at 48.9% (34)
        # the run: the longest suffix of the column dims every tensor reads all of or none of
        # (a group norm's [H, W], not its channels, which its weight reads alone)
        reads = [set(in_dims[i]) for i in range(nin) if spec["inputs"][i].get("map") is not None]
        reads.append(set(out_dims))
        k = len(cols_d)
        while k > 0 and all(not (r & set(cols_d[k - 1:])) or set(cols_d[k - 1:]) <= r for r in reads):
            k -= 1
        run_d, outer_d = cols_d[k:], cols_d[:k]
        flat_able = not spec.get("conv") and not gemm and not conv_dot and len(cols_d) >= 2
        lvl_in = ["dom" if set(in_dims[i]) & colset else "row" for i in range(nin)]
        # levels follow the plan (pointwise regions: cols are the trailing dims)
        level = {}
        for s in steps:
            if s.kind == "in":
                level[s.name] = lvl_in[int(s.name[2:])]
            elif s.kind == "red":
                level[s.name] = "row"
            elif s.kind in ("scan", "conv", "gemm"):
                level[s.name] = "dom"
            else:
                level[s.name] = "dom" if any(level[d] == "dom" for d in s.deps) else "row"
        out_level = "dom" if set(out_dims) & colset else "row"
        if level[out] == "row" and out_level == "dom":
            out_level = "dom"        # a row value written along the cols: broadcast at the store
        used = _ancestors(by, (out,))

        def strides_of(kind, i):
            dims = in_dims[i] if kind == "in" else out_dims
            return [f"s_{kind}{i if kind == 'in' else ''}_{d}" for d in dims], dims

        # ---- kernel signature
        sig = [f"in{i}_ptr" for i in range(nin)] + ["out_ptr", "n_rows", "n_cols", "n_red"]
        sig += [f"d{d}" for d in range(r2)]
        for i in range(nin):
            sig += strides_of("in", i)[0]
        sig += strides_of("out", 0)[0]
        sig += _conv_args(spec) + _gemm_args(spec, rows_d, conv_dot)
        # flipped inputs / output: a base offset to the last element of each reversed dim
        # (their strides come negated from the launcher)
        flips = [f"in{i}" for i, inp in enumerate(spec["inputs"]) if inp.get("flip")]
        flips += ["out"] if spec.get("out_flip") else []
        sig += [f"o_{v}" for v in flips]

        def offsets(kind, i, dims_part, tag):
            names, dims = strides_of(kind, i)
            terms = [f"i{d} * {n}" for n, d in zip(names, dims) if d in dims_part]
            return " + ".join(terms) if terms else "0"

        def row_off(kind, i):
            o = offsets(kind, i, set(rows_d), "r")
            if inner_d is not None and o != "0" and f"i{inner_d} * " not in o:
                # the outer dims alone are scalars of the program (a [B, T, 1] sum read
                # while reducing over T of [B, T, D]): a [ROWS] vector of them
                o = f"{o} + zr"
            return o

        def col_off(kind, i):
            return offsets(kind, i, colset, "c")

        hint = {"v": ""}           # the looped kernel's cache hint on tile loads (LOOP_SPACE)

        def load(i, tile: bool):
            ro, co = row_off("in", i), col_off("in", i)
            if tile and (gemm or conv_dot) and ro == "0":
                # one row of values for every row of the tile (a bias [N]): loaded once, as
                # [1, BLOCK], broadcast where it is used
                ptr = f"in{i}_ptr + ({co})[None, :]"
                if spec["inputs"][i]["dtype"] == "bool":
                    return f"in{i} = tl.load({ptr}, mask=cmask[None, :], other=0) != 0"
                return f"in{i} = tl.load({ptr}, mask=cmask[None, :], other=0.0).to(tl.float32)"
            if tile:
                ptr = f"in{i}_ptr + ({ro})[:, None] + ({co})[None, :]" if co != "0" else \
                    f"in{i}_ptr + ({ro})[:, None] + zc[None, :]"
                if ro == "0":
                    ptr = f"in{i}_ptr + zr[:, None] + ({co})[None, :]"
                m = "mask"
            else:
                ptr = f"in{i}_ptr + ({ro})[:, None]" if ro != "0" else f"in{i}_ptr + zr[:, None]"
                m = "rmask[:, None]"
            h = hint["v"] if tile else ""
            if spec["inputs"][i]["dtype"] == "bool":
                return f"in{i} = tl.load({ptr}, mask={m}, other=0{h}) != 0"
            return f"in{i} = tl.load({ptr}, mask={m}, other=0.0{h}).to(tl.float32)"

        def emit(names, have: set, lines: list, tile: bool, carries: dict):
            """Lines computing ``names`` (and what they need) not in ``have``, in order."""
            need = [s for s in steps if s.name in _ancestors(by, names) and s.name not in have]
            # a GEMM's K loop first (it reads only its operands): nothing of the epilogue is
            # live in registers beside the accumulator while it runs
            need.sort(key=lambda s: s.kind not in ("gemm", "conv"))
            for s in need:
                if s.kind == "in" and int(s.name[2:]) in roles:
                    pass                                  # the convolution reads it itself
                elif s.kind == "in":
                    lines.append(load(int(s.name[2:]), tile and level[s.name] == "dom"))
                elif s.kind == "conv":
                    lines.extend(_conv_dot_lines(spec, s, rows_d, p["conv_loop"] == "window")
                                 if conv_dot else _conv_lines(spec, s))
                elif s.kind == "gemm":
                    lines.extend(_gemm_lines(spec, s, rows_d))
                elif s.kind == "pw":
                    lines.append(f"{s.name} = {s.expr}")
                elif s.kind == "red":
                    raise AssertionError("reductions are emitted by passes")
                elif s.kind == "scan":
                    neutral = _NEUTRAL[s.op]
                    arg = s.expr if level[s.expr] == "dom" else f"({s.expr} + zt)"
                    lines.append(f"{s.name}_in = tl.where(mask, {arg}, {neutral})")
                    if s.op == "cumsum":
                        lines.append(f"{s.name} = tl.cumsum({s.name}_in, axis=1)")
                    else:
                        lines.append(f"{s.name} = tl.cumprod({s.name}_in, axis=1)")
                    if carries is not None:
                        c = carries.setdefault(s.name, f"{s.name}_carry")
                        if s.op == "cumsum":
                            lines.append(f"{s.name} = {s.name} + {c}")
                            lines.append(f"{c} = {c} + tl.sum({s.name}_in, axis=1)[:, None]")
                        else:
                            lines.append(f"{s.name} = {s.name} * {c}")
                            lines.append(f"{c} = {c} * tl.reduce({s.name}_in, 1, _mul)[:, None]")
                have.add(s.name)

        def red_lines(s, acc_expr):
            if s.op == "sum":
                return f"tl.sum({acc_expr}, axis=1)[:, None]"
            if s.op in ("argmax", "argmin"):
                # the first NaN's index where the row has one (torch ranks NaN above all), else
                # the first index of the max / min (tl.argmax breaks ties to the left, as torch)
                nan = f"((({acc_expr}) != ({acc_expr})).to(tl.int32))"
                return (f"tl.where(tl.max({nan}, axis=1)[:, None] > 0, tl.argmax({nan}, axis=1)[:, None], "
                        f"tl.{s.op}({acc_expr}, axis=1)[:, None])")
            if s.op in ("max", "min"):
                # torch's amax/amin propagate NaN; tl.max/tl.min on a GPU skip it (maxnum):
                # a row holding a NaN reduces to NaN
                return (f"tl.where(tl.sum((({acc_expr}) != ({acc_expr})).to(tl.int32), axis=1)"
                        f"[:, None] > 0, float('nan'), tl.{s.op}({acc_expr}, axis=1)[:, None])")
            return f"tl.reduce({acc_expr}, 1, _mul)[:, None]"

        def store_lines(val):
            ro = row_off("out", 0)
            if out_level == "dom":
                co = col_off("out", 0)
                v = val if level[val] == "dom" else f"({val} + zt)"
                ptr = f"out_ptr + ({ro})[:, None] + ({co})[None, :]"
                if ro == "0":
                    ptr = f"out_ptr + zr[:, None] + ({co})[None, :]"
                if co == "0":
                    ptr = f"out_ptr + ({ro})[:, None] + zc[None, :]"
                return [f"tl.store({ptr}, {v}.to(out_ptr.dtype.element_ty), mask=mask)"]
            ptr = f"out_ptr + ({ro})[:, None]" if ro != "0" else "out_ptr + zr[:, None]"
            return [f"tl.store({ptr}, {val}.to(out_ptr.dtype.element_ty), mask=rmask[:, None])"]

        def row_head(pid_lines):
            flip_lines = [f"{v}_ptr = {v}_ptr + o_{v}" for v in flips]
            if inner_d is not None:
                # one outer row a program, ROWS consecutive positions of the inner dim
                # (_inner_dim): the outer dims are scalars, the inner index a contiguous run
                return (flip_lines + pid_lines
                        + [f"n_iblk = tl.cdiv(d{inner_d}, ROWS)",
                           "outer = (pid // n_iblk).to(tl.int64)",
                           f"i{inner_d} = ((pid % n_iblk) * ROWS + tl.arange(0, ROWS)).to(tl.int64)   # [ROWS]",
                           f"rows = outer * d{inner_d} + i{inner_d}",
                           f"rmask = i{inner_d} < d{inner_d}",
                           "zr = rows * 0                                               # [ROWS] zeros (int64)"]
                        # a tap loop's masks combine the outer indices with the inner ones:
                        # [ROWS] vectors there (the interpreter takes no scalar bool in a mask)
                        + (["outer = outer + zr"] if spec.get("conv") else [])
                        + _decompose("outer", rows_d[:-1], "o"))
            return (flip_lines + pid_lines
                    + ["rows = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)      # [ROWS]",
                       "rmask = rows < n_rows",
                       "zr = rows * 0                                               # [ROWS] zeros (int64)"]
                    + _decompose("rows", rows_d, "r"))
        head = row_head(["pid = tl.program_id(0)"])

        def col_head(start):
            lines = [f"cols = ({start} + tl.arange(0, BLOCK)).to(tl.int64)       # [BLOCK]",
                     "cmask = cols < n_cols", "zc = cols * 0",
                     "mask = rmask[:, None] & cmask[None, :]                     # [ROWS, BLOCK]",
                     "zt = tl.zeros([ROWS, BLOCK], dtype=tl.float32)"]
            if not flat_able:
                return lines + _decompose("cols", cols_d, "c")
            # FLAT (the launcher's _flat_cols): the run dims' flat index is every tensor's
            # offset along them over the innermost stride, and a chunk (BLOCK columns from a
            # multiple of BLOCK, which divides the run) lies in one run: the outer column dims'
            # indices are scalars of the chunk. No division an element.
            run_len = " * ".join(f"d{d}" for d in run_d)
            chunk = ([f"    c_q = {start} // ({run_len})                          # the chunk's run"]
                     + ["    " + x for x in _decompose("c_q", outer_d, "cq")]
                     # scalars of the chunk, as [BLOCK] vectors (offsets are indexed [None, :])
                     + [f"    i{d} = i{d} + zc" for d in outer_d] if outer_d else [])
            return (lines + ["if FLAT:"] + chunk
                    + [f"    i{run_d[-1]} = cols" + (f" - c_q * ({run_len})" if outer_d else "")]
                    + [f"    i{d} = 0" for d in run_d[:-1]]
                    + ["else:"] + ["    " + x for x in _decompose("cols", cols_d, "c")])

        reds = [s for s in steps if s.kind == "red" and s.name in used]

        # ---- one pass: whole rows in one tile (a GEMM region: its output tile, the K loop first)
        # A pointwise region's columns may be cut into blocks: program p takes row band
        # p // blocks, column block p % blocks, so programs launched together stream adjacent
        # memory (row bands first put concurrent programs 1.5 MB apart in LeakyReLU's rows).
        # Any other region's one-pass tile holds whole rows: one block, the start 0.
        one = (_gemm_head(spec, rows_d, cols_d) if gemm or conv_dot
               else row_head(["n_cblk = tl.cdiv(n_cols, BLOCK)                            # column blocks a row",
                              "pid = tl.program_id(0) // n_cblk",
                              "c_start = (tl.program_id(0) % n_cblk) * BLOCK"]) + col_head("c_start"))
        have: set = set()
        for s in steps:
            if s.name not in used or s.name in have:
                continue
            if s.kind == "red":
                emit(s.deps, have, one, True, None)
                arg = s.expr if level[s.expr] == "dom" else f"({s.expr} + zt)"
                one.append(f"{s.name} = {red_lines(s, f'tl.where(mask, {arg}, {_NEUTRAL[s.op]})')}")
                have.add(s.name)
        emit((out,), have, one, True, None)
        one += store_lines(out)
        if gemm or conv_dot:
            return _render_gemm(spec, p, space, sig, one,
                                any(s.op in ("prod", "cumprod") for s in steps if s.name in used),
                                _launcher(spec, rows_d, cols_d, in_dims, out_dims, out_map, r2,
                                          conv_dot, channels=p.get("conv_layout") == "channels"))

        # ---- looped: a pass per reduction, then a pass for a column-shaped output
        loop = list(head)
        have = set()
        rowvals = [s for s in steps if s.name in used and level[s.name] == "row" and s.kind != "red"]

        def emit_rows_to(lines, done):
            """Row values whose inputs are ready, in order, until none is."""
            ready = True
            while ready:
                ready = False
                for s in rowvals:
                    if s.name in done:
                        continue
                    if all(d in done for d in s.deps):
                        if s.kind == "in" and int(s.name[2:]) in roles:
                            pass
                        elif s.kind == "in":
                            lines.append(load(int(s.name[2:]), False))
                        else:
                            lines.append(f"{s.name} = {s.expr}")
                        done.add(s.name)
                        ready = True

        def emit_rows():
            emit_rows_to(loop, have)
        emit_rows()
        # the reduction passes' loads keep their lines in L2 for the pass after them, the last
        # pass's loads go first (C.cache_hints); none where a pass reads the row once
        keep, stream = C.cache_hints(bool(p.get("cache_hints")) and bool(reds))
        hint["v"] = keep
        for s in reds:
            loop.append(f"{s.name}_acc = tl.full([ROWS, BLOCK], {_NEUTRAL[s.op]}, tl.float32)")
            body = col_head("c0")
            inner = set(have)
            emit(s.deps, inner, body, True, None)
            arg = s.expr if level[s.expr] == "dom" else f"({s.expr} + zt)"
            v = f"tl.where(mask, {arg}, {_NEUTRAL[s.op]})"
            if s.op in ("argmax", "argmin"):
                # per lane: the best value and its column (a later chunk only on strictly
                # better, so the first index wins; a NaN once seen stays), then across lanes
                n_, better = s.name, ">" if s.op == "argmax" else "<"
                loop.append(f"{n_}_idx = tl.zeros([ROWS, BLOCK], dtype=tl.int64)")
                body += [f"{n_}_v = {v}",
                         f"{n_}_take = (({n_}_v != {n_}_v) & ({n_}_acc == {n_}_acc)) | ({n_}_v {better} {n_}_acc)",
                         f"{n_}_acc = tl.where({n_}_take, {n_}_v, {n_}_acc)",
                         f"{n_}_idx = tl.where({n_}_take, cols[None, :] + zr[:, None], {n_}_idx)"]
                loop.append("for c0 in range(0, n_cols, BLOCK):")
                loop += ["    " + x for x in body]
                best = "max" if s.op == "argmax" else "min"
                far = "float('-inf')" if s.op == "argmax" else "float('inf')"
                loop += [f"{n_}_nan = {n_}_acc != {n_}_acc",
                         f"{n_}_m = tl.{best}(tl.where({n_}_nan, {far}, {n_}_acc), axis=1)[:, None]",
                         f"{n_}_hit = tl.where(tl.max({n_}_nan.to(tl.int32), axis=1)[:, None] > 0, {n_}_nan, "
                         f"{n_}_acc == {n_}_m)",
                         f"{n_} = tl.min(tl.where({n_}_hit, {n_}_idx, 1 << 62), axis=1)[:, None]"]
                have.add(s.name)
                emit_rows()
                continue
            body.append(f"{s.name}_acc = {_combine(s.op, f'{s.name}_acc', v)}")
            loop.append("for c0 in range(0, n_cols, BLOCK):")
            loop += ["    " + x for x in body]
            loop.append(f"{s.name} = {red_lines(s, f'{s.name}_acc')}")
            have.add(s.name)
            emit_rows()
        if out_level == "dom":
            carries: dict = {}
            hint["v"] = stream
            body = col_head("c0")
            inner = set(have)
            emit((out,), inner, body, True, carries)
            body += store_lines(out)
            hint["v"] = ""
            for s in steps:
                if s.name in carries:
                    init = "0.0" if s.op == "cumsum" else "1.0"
                    loop.append(f"{carries[s.name]} = tl.full([ROWS, 1], {init}, tl.float32)")
            if p.get("last_pass") == "reverse" and reds and not carries:
                # the chunks the reduction pass read last first: the ones still in L2 (a scan
                # carries its sum forward and keeps the order)
                loop.append("for cj in range(0, n_cols, BLOCK):")
                loop.append("    c0 = (tl.cdiv(n_cols, BLOCK) - 1) * BLOCK - cj")
            else:
                loop.append("for c0 in range(0, n_cols, BLOCK):")
            loop += ["    " + x for x in body]
        else:
            hint["v"] = ""
            emit_rows()
            if out not in have:
                emit((out,), have, loop, False, None)
            loop += store_lines(out)

        # ---- split: a row's slices on several programs (splittable(); few rows), partials
        # [n_split, n_rows] in fp32, then one kernel combining each row's in slice order
        split_ok = p.get("split_progs", 0) > 0 and inner_d is None and len(reds) == 1
        kern_split = ""
        if split_ok:
            s = reds[0]
            neutral = _NEUTRAL[s.op]
            part = list(head) + ["sid = tl.program_id(1).to(tl.int64)",
                                 "c_lo = sid * slice_len",
                                 "c_hi = tl.minimum(c_lo + slice_len, n_cols)"]
            done: set = set()
            emit_rows_to(part, done)
            part.append(f"{s.name}_acc = tl.full([ROWS, BLOCK], {neutral}, tl.float32)")
            body = col_head("c0")
            emit(s.deps, set(done), body, True, None)
            arg = s.expr if level[s.expr] == "dom" else f"({s.expr} + zt)"
            v = f"tl.where(mask, {arg}, {neutral})"
            body.append(f"{s.name}_acc = {_combine(s.op, f'{s.name}_acc', v)}")
            part.append("for c0 in range(c_lo, c_hi, BLOCK):")
            part += ["    " + x for x in body]
            part += [f"{s.name}_part = {red_lines(s, f'{s.name}_acc')}",
                     f"tl.store(ws_ptr + sid * n_rows + rows[:, None], {s.name}_part, mask=rmask[:, None])"]
            fin = list(head)
            done = set()
            emit_rows_to(fin, done)
            fin += ["sp = tl.arange(0, SPLITS_P2)                                # [SPLITS_P2]",
                    f"pv = tl.load(ws_ptr + sp[None, :].to(tl.int64) * n_rows + rows[:, None], "
                    f"mask=rmask[:, None] & (sp[None, :] < n_split), other={neutral})",
                    f"{s.name} = {red_lines(s, 'pv')}"]
            done.add(s.name)
            emit_rows_to(fin, done)
            if out not in done:
                emit((out,), done, fin, False, None)
            fin += store_lines(out)
            sargs = (", ".join(sig) + ", ws_ptr, slice_len, n_split,\n        ROWS: tl.constexpr, "
                     "BLOCK: tl.constexpr, SPLITS_P2: tl.constexpr" + (", FLAT: tl.constexpr" if flat_able else ""))
            kern_split = (f"\n\n@triton.jit\ndef _region_partial({sargs}):\n"
                          f'    """Program (row block, slice): the reduction of ROWS rows over columns '
                          f'[c_lo, c_hi), one fp32 partial a row."""\n'
                          + "\n".join("    " + x for x in part) + "\n"
                          + f"\n\n@triton.jit\ndef _region_finish({sargs}):\n"
                          f'    """ROWS rows: their n_split partials combined in slice order, then '
                          f'the epilogue and the store."""\n'
                          + "\n".join("    " + x for x in fin) + "\n")

        args_sig = (", ".join(sig) + ",\n        ROWS: tl.constexpr, BLOCK: tl.constexpr"
                    + (", FLAT: tl.constexpr" if flat_able else ""))
        kern_one = (f"@triton.jit\ndef _region_one_pass({args_sig}):\n"
                    f'    """Tile [ROWS, BLOCK]: ROWS whole rows, or (pointwise) one column block of them; '
                    f'every input read once."""\n'
                    + "\n".join("    " + x for x in one) + "\n")
        # persistent: PROGS_PER_SM programs an SM, each taking row blocks pid, pid + P, ...: the
        # rows in flight (and their lines in L2 between the passes) are bounded by the grid, not
        # by how many programs the SMs hold. The flipped pointers move once, before the loop.
        persist = p.get("grid") == "persistent" and inner_d is None and bool(reds)
        nf = len(flips)
        assert loop[nf] == "pid = tl.program_id(0)", loop[nf]
        kern_loop = C.tiled_kernel(
            "_region_looped", args_sig,
            '"""Tile [ROWS, BLOCK] sliding along the row: a pass per reduction, a last pass writing '
            f'the output{"; row blocks pid, pid + P, ... (P programs)" if persist else ""}."""',
            "\n".join(loop[:nf] + (["num_tiles = tl.cdiv(n_rows, ROWS)"] if persist else [])),
            "\n".join(["pid = tile"] + loop[nf + 1:]), persist)
        uses_mul = any(s.op in ("prod", "cumprod") for s in steps if s.name in used)
        helper = '''@triton.jit
def _mul(a, b):
    return a * b


''' if uses_mul else ""
        looped_rows = "loop_rows" in p and inner_d is None
        consts = "".join(line + "\n" for line in (
            ([f"SPLIT_PROGS = {p['split_progs']}      # programs to aim for when rows are few (0: never split)"]
             if split_ok else [])
            + ([f"LOOP_ROWS = {p['loop_rows']}          # rows per program of the looped kernel",
                f"LOOP_WARPS = {p['loop_warps']}         # its warps"] if looped_rows else [])
            + ([f"PROGS_PER_SM = {p['progs_per_sm']}       # the looped kernel's persistent grid"]
               if persist else [])))
        launcher = _launcher(spec, rows_d, cols_d, in_dims, out_dims, out_map, r2, inner=inner_d,
                             slices=split_ok, flat=run_d if flat_able else None,
                             looped_rows=looped_rows, persist=persist)
        doc = f'''"""Region candidate: {spec["name"]} (generated from its ops; no hand-written code).

Domain {spec["rank"]}-D{", split " + str(spec["split"]) if split else ""}; {"reduced dims " + str(spec["red"]) if spec["red"] else "pointwise"}; rows are the kept dims, cols {cols_d}.
Bytes the op must move: each input once (at its own, broadcast-free size) and the output once.
one_pass reads them once; looped reads the inputs once per reduction pass{" and once more for the output" if out_level == "dom" and reds else ""}.
Point: {C.point_line(space, p)}
"""
{C.IMPORTS_SRC}
VARIANT = {p["variant"]!r}
MAX_BLOCK = {p["max_block"]}     # widest row held in one tile (one_pass)
BLOCK_LOOP = {p["block"]}       # chunk of the looped kernel
ROWS_CAP = {p["rows_cap"]}          # rows per program, at most
MAX_TILE = {p["max_tile"]}      # elements of one [ROWS, BLOCK] tile
NUM_WARPS = {p["num_warps"]}
{consts}
'''
        return C.tidy(doc + helper + (_FLAT_SRC if flat_able else "") + kern_one + "\n\n" + kern_loop
                      + kern_split + (C.NUM_SMS_SRC if persist else "") + "\n\n" + launcher)
    return render


def _conv_args(spec) -> list:
    """Kernel arguments of the convolution: x's and w's strides, the bias stride, x's sizes."""
    cv = spec.get("conv")
    if not cv:
        return []
    r = spec["rank"]
    out = [f"cx_s{j}" for j in range(r)] + ([f"cw_s{j}" for j in range(r)] if cv.get("w") is not None else [])
    out += ["cb_s0"] if cv.get("b") is not None else []
    return out + [f"xi{s}" for s in range(r - 2)]


def _conv_dim_src(cv, d) -> str:
    """Launcher expression of the convolution's output dim ``d`` (conv_out's formula)."""
    x = f"in{cv['x']}"
    w = cv["w_shape"]
    if d == 0:
        return f"{x}.shape[0]"
    if d == 1:
        return str(w[1] * cv["groups"] if cv["transposed"] else w[0])
    s = d - 2
    st, pd, dl, k = cv["stride"][s], cv["padding"][s], cv["dilation"][s], w[2 + s]
    if cv["transposed"]:
        return f"({x}.shape[{d}] - 1) * {st} - {2 * pd} + {dl * (k - 1) + cv['output_padding'][s] + 1}"
    return f"({x}.shape[{d}] + {2 * pd - dl * (k - 1) - 1}) // {st} + 1"


def _pool_lines(spec, st) -> list:
    """Kernel lines of a pooling's [ROWS, BLOCK] tile (rows: n and output positions i0, i2, ...;
    cols: channels i1), tap by tap over the window: the max (NaN kept, -inf outside the input,
    as torch pads) or the mean (the sum over the window size, the taps inside the input, or the
    divisor given)."""
    cv = spec["conv"]
    S = spec["rank"] - 2
    k = cv["w_shape"][2:]
    kp = math.prod(k)
    n = st.name
    mx = cv["pool"] == "max"
    neutral = "float('-inf')" if mx else "0.0"
    out = [f"{n}_acc = tl.full([ROWS, BLOCK], {neutral}, tl.float32)"]
    count = not mx and cv["divisor"] is None and not cv["count_include_pad"]
    if count:
        out.append(f"{n}_cnt = tl.zeros([ROWS], dtype=tl.float32)     # taps inside the input")
    out.append(f"for {n}_kk in range(0, {kp}):        # the window's taps")
    body = [f"k_rem = {n}_kk"]
    for s in reversed(range(S)):
        body.append(f"kq{s} = k_rem % {k[s]}")
        body.append(f"k_rem = k_rem // {k[s]}")
    valid = []
    for s in range(S):
        body.append(f"pq{s} = i{2 + s} * {cv['stride'][s]} - {cv['padding'][s]} + kq{s} * {cv['dilation'][s]}")
        valid.append(f"(pq{s} >= 0) & (pq{s} < xi{s})")
    body.append("ok = rmask" + "".join(f" & {v}" for v in valid) + "            # [ROWS]")
    xoff = "i0 * cx_s0" + "".join(f" + pq{s} * cx_s{2 + s}" for s in range(S))
    body.append(f"xv = tl.load(in{cv['x']}_ptr + ({xoff})[:, None] + (i1 * cx_s1)[None, :], "
                f"mask=ok[:, None] & cmask[None, :], other={neutral}).to(tl.float32)")
    if mx:
        body.append(f"{n}_acc = tl.where({n}_acc != {n}_acc, {n}_acc, tl.where(xv != xv, xv, "
                    f"tl.maximum({n}_acc, xv)))")
    else:
        body.append(f"{n}_acc += xv")
        if count:
            body.append(f"{n}_cnt += ok.to(tl.float32)")
    out += ["    " + b for b in body]
    if mx:
        out.append(f"{n} = {n}_acc")
    elif count:
        out.append(f"{n} = {n}_acc / tl.maximum({n}_cnt, 1.0)[:, None]")
    else:
        out.append(f"{n} = {n}_acc / {float(cv['divisor'] or kp)!r}")
    return out


def _conv_lines(spec, st) -> list:
    """Kernel lines computing the convolution's [ROWS, BLOCK] tile (rows: n and output
    positions i0, i2, ...; cols: output channels i1) tap by tap: for each of the Ci/groups *
    kernel-volume taps, the input column [ROWS] (zero outside the input, and for a transposed
    convolution where the stride skips it) times the weight row [BLOCK]."""
    cv = spec["conv"]
    if cv.get("pool"):
        return _pool_lines(spec, st)
    r = spec["rank"]
    S = r - 2
    w = cv["w_shape"]
    k = w[2:]
    g_n = cv["groups"]
    taps = _conv_taps(cv)
    kp = math.prod(k)
    cig = taps // kp
    co = w[1] * g_n if cv["transposed"] else w[0]
    cog = co // g_n
    n = st.name
    grouped = g_n > 1
    out = [f"{n}_acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)"]
    if grouped:
        out.append(f"{n}_g = i1 // {cog}                    # [BLOCK] group of each output channel")
    out.append(f"for {n}_kk in range(0, {taps}):        # taps: Ci/groups x kernel volume")
    body = [f"ci_l = {n}_kk // {kp}", f"k_rem = {n}_kk % {kp}"]
    for s in reversed(range(S)):
        body.append(f"kq{s} = k_rem % {k[s]}")
        body.append(f"k_rem = k_rem // {k[s]}")
    valid = []
    for s in range(S):
        stv, pd, dl = cv["stride"][s], cv["padding"][s], cv["dilation"][s]
        if cv["transposed"]:
            body.append(f"tq{s} = i{2 + s} + {pd} - kq{s} * {dl}")
            body.append(f"pq{s} = tq{s} // {stv}")
            valid.append(f"(tq{s} >= 0) & (pq{s} * {stv} == tq{s}) & (pq{s} < xi{s})")
        else:
            body.append(f"pq{s} = i{2 + s} * {stv} - {pd} + kq{s} * {dl}")
            valid.append(f"(pq{s} >= 0) & (pq{s} < xi{s})")
    body.append("ok = rmask" + "".join(f" & {v}" for v in valid) + "            # [ROWS]")
    xoff = "i0 * cx_s0" + "".join(f" + pq{s} * cx_s{2 + s}" for s in range(S))
    body.append(f"xoff = {xoff}")
    if grouped:
        body.append(f"ci = {n}_g * {cig} + ci_l                  # [BLOCK]")
        body.append(f"xv = tl.load(in{cv['x']}_ptr + xoff[:, None] + (ci * cx_s1)[None, :], "
                    f"mask=ok[:, None] & cmask[None, :], other=0.0).to(tl.float32)")
    else:
        body.append("ci = ci_l")
        body.append(f"xv = tl.load(in{cv['x']}_ptr + (xoff + ci * cx_s1)[:, None], mask=ok[:, None], "
                    f"other=0.0).to(tl.float32)")
    ks = "".join(f" + kq{s} * cw_s{2 + s}" for s in range(S))
    if cv["transposed"]:
        local = f"(i1 - {n}_g * {cog})" if grouped else "i1"
        body.append(f"woff = ci * cw_s0 + {local} * cw_s1{ks}")
    else:
        body.append(f"woff = i1 * cw_s0 + ci_l * cw_s1{ks}")
    body.append(f"wv = tl.load(in{cv['w']}_ptr + woff, mask=cmask, other=0.0).to(tl.float32)")
    body.append(f"{n}_acc += xv * wv[None, :]")
    out += ["    " + b for b in body]
    if cv["b"] is not None:
        out.append(f"{n} = {n}_acc + tl.load(in{cv['b']}_ptr + i1 * cb_s0, mask=cmask, "
                   f"other=0.0).to(tl.float32)[None, :]")
    else:
        out.append(f"{n} = {n}_acc")
    return out


def conv_dot_ok(spec) -> bool:
    """Can the region's convolution run as an implicit GEMM (tl.dot over BLOCK_K taps a step)?
    A convolution with weights and one group; pooling and grouped convolutions keep the tap
    loop (their columns would read different taps)."""
    cv = spec.get("conv")
    return bool(cv) and not cv.get("pool") and cv.get("w") is not None and cv["groups"] == 1


def _conv_dot_lines(spec, st, rows_d, window=False) -> list:
    """Kernel lines of the convolution's fp32 accumulator tile [ROWS, BLOCK] as an implicit
    GEMM: rows are (n, output positions), columns output channels, and K the Ci x kernel-volume
    taps, BLOCK_K of them a step: the input tile [ROWS, BLOCK_K] gathered from x (zero outside
    it, and for a transposed convolution where the stride skips a position), the weight tile
    [BLOCK_K, BLOCK] read from w, one tl.dot. Rows and channels past the edge re-read valid
    ones (never stored). What depends on the row alone (its batch offset, each spatial dim's
    window origin) is worked out once, before the K loop; inside it the [ROWS, BLOCK_K]
    index tiles are int32 (IDX64: int64, for a tensor of 2^31 elements or more): at
    BLOCK_M x BLOCK_K = 128 x 32 int64 tiles of positions the loop spilled registers.

    ``window``: K ordered tap-major instead, BLOCK_K input channels of one tap a step (the
    point "conv_loop": "window", for Ci of BLOCK_K or more). The step's tap is a scalar, so the
    rows' positions, bounds and offsets are [ROWS] vectors worked out once a step and the
    [ROWS, BLOCK_K] tile is one add and one mask: the "dot" gather decomposes every K index
    into (channel, tap) and tests every element's window bounds."""
    if window:
        return _conv_window_lines(spec, st, rows_d)
    cv = spec["conv"]
    r = spec["rank"]
    S = r - 2
    w = cv["w_shape"]
    k = w[2:]
    kp = math.prod(k)
    taps = _conv_taps(cv)
    tr = cv["transposed"]
    n = st.name
    # the rows' indices cr_i{d}, in range (rows past the edge re-read valid ones)
    out = _decompose("(m % m_rows).to(IDX)", rows_d, "cr", "cr_i")
    xrow = "cr_i0.to(tl.int64) * cx_s0"
    for s in range(S):
        stv, pd = cv["stride"][s], cv["padding"][s]
        if tr:      # the input position is (o + pad - k * dil) / stride, where it divides
            out.append(f"ob{s} = (cr_i{2 + s} + {pd}).to(IDX)                 # [ROWS]")
        else:       # the window's origin: o * stride - pad, and tap k at origin + k * dil
            out.append(f"ob{s} = (cr_i{2 + s} * {stv} - {pd}).to(IDX)          # [ROWS]")
            xrow += f" + ob{s} * cx_s{2 + s}"
    out += [f"xrow = {xrow}                  # [ROWS] int64: n's offset"
            + ("" if tr else " and the window origin's"),
            "co = (cols % n_cols).to(IDX)                            # [BLOCK] channels in range",
            "rk = tl.arange(0, BLOCK_K)",
            f"{n}_acc = tl.zeros((ROWS, BLOCK), dtype=tl.float32)",
            f"for kb in range(0, {taps}, BLOCK_K):             # taps: Ci x kernel volume"]
    body = ["kk = (kb + rk).to(IDX)                              # [BLOCK_K]",
            f"kmask = kk < {taps}",
            f"ci = kk // {kp}", f"k_rem = kk % {kp}"]
    for s in reversed(range(S)):
        body.append(f"kq{s} = k_rem % {k[s]}")
        body.append(f"k_rem = k_rem // {k[s]}")
    ok = ["kmask[None, :]"]
    xtap = "ci * cx_s1"
    x2d = []
    for s in range(S):
        stv, dl = cv["stride"][s], cv["dilation"][s]
        if tr:
            body.append(f"tq{s} = ob{s}[:, None] - (kq{s} * {dl})[None, :]    # [ROWS, BLOCK_K]")
            body.append(f"pq{s} = tq{s} // {stv}")
            ok.append(f"(tq{s} >= 0) & (pq{s} * {stv} == tq{s}) & (pq{s} < xi{s})")
            x2d.append(f"pq{s} * cx_s{2 + s}")
        else:
            body.append(f"pq{s} = ob{s}[:, None] + (kq{s} * {dl})[None, :]    # [ROWS, BLOCK_K]")
            ok.append(f"(pq{s} >= 0) & (pq{s} < xi{s})")
            xtap += f" + kq{s} * {dl} * cx_s{2 + s}"
    body.append("ok = " + " & ".join(ok))
    body.append(f"xtap = {xtap}                              # [BLOCK_K]")
    xoff = "xrow[:, None] + xtap[None, :]" + "".join(f" + {t}" for t in x2d)
    body.append(f"xt = tl.load(in{cv['x']}_ptr + {xoff}, mask=ok, other=0.0)")
    ks = "".join(f" + kq{s}[:, None] * cw_s{2 + s}" for s in range(S))
    if tr:
        woff = f"ci[:, None] * cw_s0 + co[None, :] * cw_s1{ks}"
    else:
        woff = f"co[None, :] * cw_s0 + ci[:, None] * cw_s1{ks}"
    body.append(f"wt = tl.load(in{cv['w']}_ptr + {woff}, mask=kmask[:, None], other=0.0)")
    return _conv_dot_step(cv, n, rows_d, out, body)


def _conv_window_lines(spec, st, rows_d) -> list:
    """_conv_dot_lines' "window" loop: one K step is (tap t, channels cb .. cb + BLOCK_K) of
    kernel volume x cdiv(Ci, BLOCK_K) steps; Ci < BLOCK_K pads every step with masked lanes."""
    cv = spec["conv"]
    S = spec["rank"] - 2
    w = cv["w_shape"]
    k = w[2:]
    kp = math.prod(k)
    tr = cv["transposed"]
    ci_n = w[0] if tr else w[1]
    n = st.name
    nkc = f"(({ci_n} + BLOCK_K - 1) // BLOCK_K)"       # channel blocks a tap (constexpr)
    out = _decompose("(m % m_rows).to(IDX)", rows_d, "cr", "cr_i")
    xrow = "cr_i0.to(tl.int64) * cx_s0"
    for s in range(S):
        stv, pd = cv["stride"][s], cv["padding"][s]
        if tr:
            out.append(f"ob{s} = (cr_i{2 + s} + {pd}).to(IDX)                 # [ROWS]")
        else:
            out.append(f"ob{s} = (cr_i{2 + s} * {stv} - {pd}).to(IDX)          # [ROWS]")
    out += [f"xrow = {xrow}                  # [ROWS] int64: n's offset",
            "co = (cols % n_cols).to(IDX)                            # [BLOCK] channels in range",
            "rk = tl.arange(0, BLOCK_K)",
            f"{n}_acc = tl.zeros((ROWS, BLOCK), dtype=tl.float32)",
            f"for kb in range(0, {kp} * {nkc}):     # (tap, channel block), tap-major"]
    body = [f"t = kb // {nkc}                             # the tap (a scalar)",
            f"ci = ((kb - t * {nkc}) * BLOCK_K + rk).to(IDX)   # [BLOCK_K] its channels",
            f"kcm = ci < {ci_n}"]
    for s in reversed(range(S)):
        body.append(f"kq{s} = t % {k[s]}")
        body.append(f"t = t // {k[s]}")
    ok, xr = [], "xrow"
    for s in range(S):
        stv, dl = cv["stride"][s], cv["dilation"][s]
        if tr:
            body.append(f"tq{s} = ob{s} - kq{s} * {dl}                     # [ROWS]")
            body.append(f"pq{s} = tq{s} // {stv}")
            ok.append(f"(tq{s} >= 0) & (pq{s} * {stv} == tq{s}) & (pq{s} < xi{s})")
            xr += f" + pq{s} * cx_s{2 + s}"
        else:
            body.append(f"pq{s} = ob{s} + kq{s} * {dl}                     # [ROWS]")
            ok.append(f"(pq{s} >= 0) & (pq{s} < xi{s})")
            xr += f" + pq{s} * cx_s{2 + s}"          # IDX [ROWS]: int64 where offsets need it
    body.append("rok = " + " & ".join(ok) + "        # [ROWS] the tap inside x")
    body.append(f"xt = tl.load(in{cv['x']}_ptr + ({xr})[:, None] + (ci * cx_s1)[None, :],")
    body.append("             mask=rok[:, None] & kcm[None, :], other=0.0)")
    ks = "".join(f" + kq{s} * cw_s{2 + s}" for s in range(S))
    if tr:
        woff = f"ci[:, None] * cw_s0 + co[None, :] * cw_s1{ks}"
    else:
        woff = f"co[None, :] * cw_s0 + ci[:, None] * cw_s1{ks}"
    body.append(f"wt = tl.load(in{cv['w']}_ptr + {woff}, mask=kcm[:, None], other=0.0)")
    return _conv_dot_step(cv, n, rows_d, out, body)


def _conv_dot_step(cv, n, rows_d, out, body) -> list:
    """The implicit GEMM's K step after its tiles xt [ROWS, BLOCK_K] and wt [BLOCK_K, BLOCK]
    are loaded (``body``, the loop's lines so far): the dot, the loop closed, the bias added,
    the rows' indices for the epilogue."""
    body = body + ["if DOT_FP32:                       # interpreter: its tl.dot cannot multiply bf16",
                   "    xt = xt.to(tl.float32)",
                   "    wt = wt.to(tl.float32)",
                   "if IEEE:                           # fp32 operands: full fp32, no TF32",
                   f"    {n}_acc = tl.dot(xt, wt, {n}_acc, input_precision=\"ieee\")",
                   "else:",
                   f"    {n}_acc = tl.dot(xt, wt, {n}_acc)"]
    out = out + ["    " + b for b in body]
    if cv["b"] is not None:
        out.append(f"{n} = {n}_acc + tl.load(in{cv['b']}_ptr + i1 * cb_s0, mask=cmask, "
                   f"other=0.0).to(tl.float32)[None, :]")
    else:
        out.append(f"{n} = {n}_acc")
    return out + _decompose("rows.to(IDX)", rows_d, "r")


def _gemm_args(spec, rows_d, conv_dot=False) -> list:
    """Kernel arguments of the GEMM: rows per batch, K, a's K stride, b's K and N strides, a's
    stride along each row dim, b's along each batch dim (an implicit-GEMM convolution: the
    rows only; the rest are the convolution's own)."""
    g = spec.get("gemm")
    if not g:
        return ["m_rows"] if conv_dot else []
    return (["m_rows", "K", "stride_ak", "stride_bk", "stride_bn"] + [f"sa_{d}" for d in rows_d]
            + [f"sb_{d}" for d in range(g["batch"])])


def _gemm_head(spec, rows_d, cols_d) -> list:
    """Kernel lines placing a program on its output tile [ROWS, BLOCK] (= [BLOCK_M, BLOCK_N])
    of batch program_id(1), tiles in grouped order (GROUP_M row-tiles sweep the columns
    together: the tiles running at once share rows of a and columns of b in L2); the row and
    column indices i{d} every epilogue load and the store address through."""
    lines = ["tile = tl.program_id(0)",
             "pid_b = tl.program_id(1).to(tl.int64)        # batch: the product of b's batch dims",
             "# index arithmetic in int32 unless an offset may reach 2^31 (IDX64): an int64 division",
             "# is a subroutine call, and the rows' index vectors spilled the accumulator",
             "if IDX64:", "    IDX = tl.int64", "else:", "    IDX = tl.int32",
             "num_pid_m = tl.cdiv(m_rows, ROWS)",
             "num_pid_n = tl.cdiv(n_cols, BLOCK)",
             "num_pid_in_group = GROUP_M * num_pid_n"]
    lines += _mm.GROUP_ORDER_SRC.strip("\n").split("\n")
    lines += ["m = (pid_m * ROWS + tl.arange(0, ROWS)).to(tl.int64)      # [ROWS] rows of the batch",
              "rmask = m < m_rows",
              "rows = pid_b * m_rows + m                          # [ROWS] flat over the lead dims",
              "zr = rows * 0"]
    # the rows' indices i{d} come after the K loop (_row_indices): held across it, a 4-D
    # convolution's three int64 index vectors spilled the accumulator
    lines += ["cols = (pid_n * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)   # [BLOCK] columns (N)",
              "cmask = cols < n_cols", "zc = cols * 0",
              "mask = rmask[:, None] & cmask[None, :]                     # [ROWS, BLOCK]",
              "zt = tl.zeros([ROWS, BLOCK], dtype=tl.float32)"]
    return lines + _decompose("cols", cols_d, "c")


def _gemm_lines(spec, st, rows_d) -> list:
    """Kernel lines of the GEMM's fp32 accumulator tile: a [*lead, M, K] rows times b's
    columns, K steps of BLOCK_K (the matmul family's pipelined loop). Rows and columns past the
    edge re-read valid ones (index modulo m_rows and N; never stored): no M/N masks inside the
    loop, the K tail masked unless EVEN_K."""
    g = spec["gemm"]
    n = st.name
    # a's rows, in range (rows past the edge re-read valid ones): their indices ga_i{d}
    out = _decompose("(pid_b * m_rows + (m % m_rows)).to(IDX)", rows_d, "ga", "ga_i")
    out.append("a_row = " + " + ".join(f"ga_i{d} * sa_{d}" for d in rows_d))
    b_base = f"in{g['b']}_ptr"
    if g["batch"]:                  # the batch's index bb{d} along each of b's batch dims
        out += _decompose("pid_b", list(range(g["batch"])), "bb", "bb")
        b_base += " + " + " + ".join(f"bb{d} * sb_{d}" for d in range(g["batch"]))
    out += ["gb_n = cols % n_cols                                   # [BLOCK] b's columns, in range",
            "rk = tl.arange(0, BLOCK_K)",
            "k_len = K",
            f"a_ptrs = in{g['a']}_ptr + a_row[:, None] + rk[None, :] * stride_ak      # [ROWS, BLOCK_K]",
            f"b_ptrs = {b_base} + rk[:, None] * stride_bk + gb_n[None, :] * stride_bn   # [BLOCK_K, BLOCK]",
            f"{n}_acc = tl.zeros((ROWS, BLOCK), dtype=tl.float32)"]
    out += _mm.k_loop([(f"{n}_acc", "b_ptrs", "b_tile", "stride_bk")]).split("\n")
    out.append(f"{n} = {n}_acc")
    return out + _decompose("rows.to(IDX)", rows_d, "r")


_FAR_SRC = '''def _far(*ts):
    """Whether an element offset of one of these tensors (its storage included: a view may start
    far into it) may reach 2^31, beyond int32 index arithmetic."""
    for t in ts:
        span = t.storage_offset() + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()) if s)
        if span >= 2**31 - 1 or t.numel() >= 2**31 - 1:
            return True
    return False


'''


_CHANNELS_SRC = '''def _channels_inner(t, d):
    """``t`` (same shape) with dim ``d`` contiguous, its other dims in order: a copy unless it is."""
    if t.stride(d) == 1:
        return t
    perm = [j for j in range(t.dim()) if j != d] + [d]
    inv = [perm.index(j) for j in range(t.dim())]
    return t.permute(perm).contiguous().permute(inv)


'''


_MUL_SRC = '''@triton.jit
def _mul(a, b):
    return a * b


'''


def _render_gemm(spec, p, space, sig, body, uses_mul, launcher) -> str:
    """The candidate source of a GEMM region, or of a convolution region as an implicit GEMM:
    one kernel (the K loop, then the epilogue on the accumulator, then the store) and its
    launcher. The point line names the axes this kernel reads."""
    g = spec.get("gemm")
    args_sig = (", ".join(sig) + ",\n        ROWS: tl.constexpr, BLOCK: tl.constexpr, "
                "BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,\n        EVEN_K: tl.constexpr, "
                "IEEE: tl.constexpr, DOT_FP32: tl.constexpr"
                + ", IDX64: tl.constexpr")
    kern = (f"@triton.jit\ndef _region_gemm({args_sig}):\n"
            '    """Output tile [ROWS, BLOCK] = [BLOCK_M, BLOCK_N]: the GEMM accumulated in fp32 over K,\n'
            '    the epilogue applied to it in registers, stored once."""\n'
            + "\n".join("    " + x for x in body) + "\n")
    red = " and the reduction over each row" if spec["red"] else ""
    whole = " (the whole row: BLOCK_N >= N)" if spec["red"] else ""
    if g:
        b_desc = {"kn": f"b [*lead[:{g['batch']}], K, N]" if g["batch"] else "b [K, N]",
                  "nk": "a linear layer's weight [N, K] (read as its transpose)"}[g["layout"]]
        what = [f"GEMM a [*lead, M, K] @ {b_desc} -> [*lead, M, N] with its epilogue{red} fused: one",
                f"program per [BLOCK_M, BLOCK_N] output tile{whole}, fp32 accumulation;"]
        moves = ["Bytes the op must move: a, b and the epilogue's inputs once, the output once; flops",
                 "2*M*N*K per batch plus the epilogue's. Each tile re-reads its rows of a and columns of b",
                 "from L2/HBM."]
    else:
        cv = spec["conv"]
        what = [f"{'Transposed c' if cv['transposed'] else 'C'}onvolution as an implicit GEMM with its epilogue{red} fused: rows are",
                "(n, output positions), columns output channels, K the Ci x kernel-volume taps; one",
                f"program per [BLOCK_M, BLOCK_N] output tile{whole}, the input tile gathered from x, fp32",
                "accumulation;"]
        moves = ["Bytes the op must move: x, the weights and the epilogue's inputs once, the output once;",
                 "flops 2 per output element and tap. Each tile re-reads its input window from L2/HBM."]
    axes = {k: v for k, v in space.items()
            if k in GEMM_SPACE or k in ("conv_loop", "conv_layout", "num_warps")}
    doc = "\n".join([
        f'"""Region candidate: {spec["name"]} (generated from its ops; no hand-written code).',
        ""] + what + [_mm.FP32_DOT_DOC[p["fp32_dot"]]] + moves + [
        f"Point: {C.point_line(axes, p)}",
        '"""',
        C.IMPORTS_SRC,
        f"BLOCK_M = {p['block_m']}         # output tile rows (clamped at launch)",
        f"BLOCK_N = {p['block_n']}         # output tile columns"
        + (" (a reduction's row: the power of two >= N)" if spec["red"] else ""),
        f"BLOCK_K = {p['block_k']}          # K step",
        f"GROUP_M = {p['group_m']}           # row-tiles per group of the swizzled tile order",
        f"NUM_WARPS = {p['num_warps']}",
        f"NUM_STAGES = {p['num_stages']}        # software-pipelining depth of the K loop",
        ""])
    split = p["fp32_dot"] == "tf32x3_split"
    b_k = "1" if g and g["layout"] == "nk" else "-2"
    k_major = bool(g and p.get("k_major"))
    prep = ""
    if k_major:    # fp32 operands K-contiguous first (copies where they are not)
        prep += f"    a, b = _k_major(a, b, {b_k})\n"
    if split:      # the GEMM's fp32 operands split once into TF32 parts, K tripled
        prep += ("    if a.dtype == torch.float32:       # [a_hi | a_hi | a_lo] @ [b_hi ; b_lo ; b_hi]\n"
                 f"        a, b = _split3(a, -1, 2), _split3(b, {b_k}, 1)\n")
    launcher = launcher.replace(_OPERANDS_MARK, prep)
    channels = p.get("conv_layout") == "channels"
    src = C.tidy(doc + _mm.GEMM_HELPERS_SRC + "\n\n" + _FAR_SRC + (_MUL_SRC if uses_mul else "")
                 + (_CHANNELS_SRC if channels else "")
                 + (_mm.TF32_SPLIT_SRC if split else "") + (_mm.K_MAJOR_SRC if k_major else "")
                 + kern + "\n\n" + launcher)
    # the K loop's fp32 dots say "ieee"; bf16/fp16 tiles never take that branch
    dot = "tf32" if split else p["fp32_dot"]
    return src.replace('input_precision="ieee"', f'input_precision="{dot}"')


# where a GEMM region's launcher prepares its fp32 operands (k_major copies, the tf32x3_split),
# before K and their strides are read
_OPERANDS_MARK = "    # (operands)\n"


def _tiled_launch(spec, nin, call, a, k, batches, even_k) -> list:
    """Launcher lines of ``_region_gemm`` (a GEMM region, or a convolution as an implicit GEMM):
    the tile fitted to the problem and the device (a reduction after it: BLOCK_N the whole row),
    the grid over (tiles, ``batches``), K = ``k``; ``a`` names the operand whose dtype and
    device decide the dot."""
    return [
        "    # the interpreter's tl.dot cannot multiply bf16 tiles (numpy has none): upcast them there",
        f"    dot_fp32 = {a}.dtype == torch.bfloat16 and {a}.device.type == 'cpu'",
        f"    ieee = {a}.dtype == torch.float32 or dot_fp32",
        "    keep_n = " + ("True                # the reduction needs the whole row in one tile"
                           if spec["red"] else "False"),
        "    bn = max(16, _pow2(n_cols)) if keep_n else BLOCK_N",
        "    bm, bn, bk, stages = _fit_gemm(BLOCK_M, bn, BLOCK_K, NUM_STAGES, NUM_WARPS, m_rows, n_cols,",
        f"                                   {k}, {a}.element_size(), _smem_budget({a}.device), keep_n=keep_n)",
        f"    grid = (_cdiv(m_rows, bm) * _cdiv(n_cols, bn), {batches})",
        f"    idx64 = _far({', '.join(call[:nin])}, out)   # int32 indices unless 2^31 is in reach",
        "    _region_gemm[grid](" + ", ".join(call) + ",",
        f"                       ROWS=bm, BLOCK=bn, BLOCK_K=bk, GROUP_M=GROUP_M, EVEN_K={even_k},",
        "                       IEEE=ieee, DOT_FP32=dot_fp32, IDX64=idx64, num_warps=NUM_WARPS,",
        "                       num_stages=stages)",
        "    return out",
    ]


_FLAT_SRC = '''def _flat_cols(sizes, tensors):
    """True when every tensor that reads the run dims (each a tuple of its strides along them)
    reads them as one run: each dim's stride the inner dims' sizes times the innermost's (a dim
    of size 1 any). The kernel then takes the flat index in the run times the innermost stride
    as the offset."""
    for st in tensors:
        want = st[-1]
        for size, s in zip(reversed(sizes), reversed(st)):
            if size != 1 and s != want:
                return False
            want = want * size
    return True


'''


def _launcher(spec, rows_d, cols_d, in_dims, out_dims, out_map, r2, conv_dot=False, inner=None,
              slices=False, channels=False, flat=None, looped_rows=False, persist=False):
    split = spec.get("split")
    nin = len(spec["inputs"])
    rank = spec["rank"]
    args = ", ".join(f"in{i}" for i in range(nin))
    lines = [f"def kernel_fn({args}):",
             f'    """{spec["name"]}: the region\'s output from its {nin} input(s); any strides."""']
    # domain sizes from the inputs that reach each dim (a convolution's: from its formula)
    cv = spec.get("conv")
    gs = spec.get("gemm")
    if gs:
        ka, kb = f"in{gs['a']}", f"in{gs['b']}"
        b_k, b_n = ("1", "0") if gs["layout"] == "nk" else ("-2", "-1")
        lines += [f"    a, b = {ka}, {kb}",
                  f"    if a.dim() != {rank} or b.dim() != {2 if not gs['batch'] else rank}:",
                  f"        raise ValueError(f'the GEMM takes a {rank}-D a and a "
                  f"{2 if not gs['batch'] else rank}-D b, got {{a.dim()}}-D and {{b.dim()}}-D')",
                  f"    if a.shape[-1] != b.shape[{b_k}]"
                  + "".join(f" or a.shape[{j}] != b.shape[{j}]" for j in range(gs["batch"])) + ":",
                  "        raise ValueError(f'GEMM operands {list(a.shape)} and {list(b.shape)} do not fit')"]
    for d in range(rank):
        if cv:
            lines.append(f"    D{d} = " + _conv_dim_src(cv, d))
            continue
        if gs:
            lines.append(f"    D{d} = " + (f"a.shape[{d}]" if d < rank - 1 else f"b.shape[{b_n}]"))
            continue
        src = next(((i, j) for i, inp in enumerate(spec["inputs"]) if inp.get("map") is not None
                    for j, m in enumerate(inp["map"]) if m == d), None)
        lines.append(f"    D{d} = in{src[0]}.shape[{src[1]}]" if src else f"    D{d} = 1")
    # split coordinates
    if split:
        sd, g = split
        dd = []
        for d in range(rank):
            if d == sd:
                dd += [f"{g}", f"D{d} // {g}"]
            else:
                dd.append(f"D{d}")
    else:
        dd = [f"D{d}" for d in range(rank)]
    for k, e in enumerate(dd):
        lines.append(f"    d{k} = {e}")
    float_in = next((i for i, inp in enumerate(spec["inputs"]) if inp["dtype"] != "bool"), None)
    out_dt = (f"torch.{spec['out_dtype']}" if spec.get("out_dtype")
              else (f"in{float_in}.dtype" if float_in is not None else "torch.float32"))
    oshape = ", ".join(f"D{m}" if m is not None else "1" for m in out_map)
    lines.append(f"    out = torch.empty(({oshape}{',' if len(out_map) == 1 else ''}), dtype={out_dt}, device=in0.device)")
    lines.append("    n_rows = 1" + "".join(f" * d{d}" for d in rows_d))
    lines.append("    n_cols = 1" + "".join(f" * d{d}" for d in cols_d))
    red_d = [d for d in cols_d] if spec["red"] else []
    lines.append("    n_red = float(1" + "".join(f" * d{d}" for d in red_d) + ")")
    lines.append("    if n_rows * n_cols == 0:")
    lines.append("        return out")

    def strides(var, m, dims, flip=()):
        """Lines: the split-coordinate strides of ``var`` (map ``m``) as a list; a dim in
        ``flip`` is read backwards (its stride negated, the base offset at its last index)."""
        vals = []
        for j, dm in enumerate(m):
            if dm is None:
                continue
            if split and dm == split[0]:
                vals += [f"{var}.stride({j}) * (D{dm} // {split[1]})", f"{var}.stride({j})"]
            else:
                vals.append(f"{'-' if j in flip else ''}{var}.stride({j})")
        return vals

    def base(var, flip):
        return " + ".join(f"({var}.shape[{j}] - 1) * {var}.stride({j})" for j in flip) or "0"
    call = [f"in{i}" for i in range(nin)] + ["out", "n_rows", "n_cols", "n_red"]
    call += [f"d{k}" for k in range(r2)]
    for i, inp in enumerate(spec["inputs"]):
        if inp.get("map") is not None:
            call += strides(f"in{i}", inp["map"], in_dims[i], inp.get("flip") or ())
    call += strides("out", out_map, out_dims, spec.get("out_flip") or ())
    if cv:
        x, w, b = cv["x"], cv.get("w"), cv.get("b")
        call += [f"in{x}.stride({j})" for j in range(rank)]
        call += [f"in{w}.stride({j})" for j in range(rank)] if w is not None else []
        call += [f"in{b}.stride(0)"] if b is not None else []
        call += [f"in{x}.shape[{2 + s}]" for s in range(rank - 2)]
    call += [base(f"in{i}", inp["flip"]) for i, inp in enumerate(spec["inputs"]) if inp.get("flip")]
    call += [base("out", spec["out_flip"])] if spec.get("out_flip") else []
    kw, flat_line = "", []
    if flat:
        # each tensor's strides along the run dims ``flat`` (split coordinates, as the kernel
        # gets them; render_for chose dims every tensor reads all of or none of)
        runs = []
        tensors = [(f"in{i}", inp["map"], in_dims[i], inp.get("flip") or ())
                   for i, inp in enumerate(spec["inputs"]) if inp.get("map") is not None]
        for var, m, dims, flip in tensors + [("out", out_map, out_dims, spec.get("out_flip") or ())]:
            by = dict(zip(dims, strides(var, m, dims, flip)))
            if flat[0] in by:
                runs.append("(" + ", ".join(by[d] for d in flat) + ",)")
        run_len = " * ".join(f"d{d}" for d in flat)
        # a chunk lies in one run where BLOCK divides it (or the run is all the columns)
        fits = "True" if len(flat) == len(cols_d) else f"({run_len}) % block == 0"
        flat_line = ["    flat = " + fits + " and _flat_cols((" + ", ".join(f"d{d}" for d in flat)
                     + ",), (" + ", ".join(runs) + ("," if len(runs) == 1 else "") + "))"]
        kw = ", FLAT=flat"
    if gs:
        call += ["m_rows", "K", "a.stride(-1)", f"b.stride({b_k})", f"b.stride({b_n})"]
        call += [f"a.stride({d})" for d in rows_d] + [f"b.stride({d})" for d in range(gs["batch"])]
        call[gs["a"]], call[gs["b"]] = "a", "b"        # the operands as the GEMM reads them
        lines += [f"    m_rows = {'d' + str(rank - 2) if gs['batch'] else 'n_rows'}          # rows of one batch",
                  _OPERANDS_MARK.rstrip("\n"), "    K = a.shape[-1]"]
        lines += _tiled_launch(spec, nin, call, "a", "K", "n_rows // m_rows", "K % bk == 0")
        return "\n".join(lines) + "\n"
    if conv_dot:
        if channels:     # the "channels" layout: x and w with their input channels contiguous
            ci_dim = 0 if cv["transposed"] else 1
            lines += [f"    in{x} = _channels_inner(in{x}, 1)         # a copy unless already so",
                      f"    in{w} = _channels_inner(in{w}, {ci_dim})"]
        lines.append("    m_rows = n_rows                   # (n, output positions)")
        lines += _tiled_launch(spec, nin, call + ["m_rows"], f"in{cv['x']}", str(_conv_taps(cv)),
                               "1", "True")
        return "\n".join(lines) + "\n"
    lines.append("    width = _pow2(max(n_cols, 1))")
    if inner is not None:
        # a reduction keeping the inner dim (_inner_dim): ROWS_CAP consecutive positions of it a
        # program, the reduced dims in chunks that keep the tile within MAX_TILE
        lines.append(f"    rows = min(ROWS_CAP, _pow2(d{inner}))")
        if spec["red"]:
            lines += [
                "    block = min(width, BLOCK_LOOP, max(1, MAX_TILE // rows))",
                "    kernel = _region_one_pass if VARIANT == 'auto' and block == width else _region_looped",
                f"    grid = ((n_rows // d{inner}) * _cdiv(d{inner}, rows),)",
            ]
        else:
            # a convolution's or pooling's tap loop: ROWS consecutive output positions a
            # program, the channels in blocks (one-pass tiles, none looping along a row)
            lines += [
                "    if VARIANT == 'auto':",
                "        block = min(width, MAX_BLOCK, max(1, MAX_TILE // rows))",
                "        kernel, cblk = _region_one_pass, _cdiv(n_cols, block)",
                "    else:",
                "        block = min(width, BLOCK_LOOP, max(1, MAX_TILE // rows))",
                "        kernel, cblk = _region_looped, 1",
                f"    grid = ((n_rows // d{inner}) * _cdiv(d{inner}, rows) * cblk,)",
            ]
    else:
        # a pointwise region wider than one tile: a grid of [ROWS, BLOCK] tiles, none looping,
        # in memory order (one program a row band looping along 393,216 columns ran LeakyReLU's
        # 12.9 GB at 92% of the copy rate on the H200 with 256 programs, a row-band-major grid
        # of tiles at 94%; torch.compile's flat grid at 101%)
        lines += [
            f"    pointwise = {not spec['red']}",
            "    if VARIANT == 'auto' and width <= MAX_BLOCK:",
            "        kernel, block = _region_one_pass, width",
            "    elif VARIANT == 'auto' and pointwise and n_rows * _cdiv(n_cols, MAX_BLOCK) < 2**31:",
            "        kernel, block = _region_one_pass, MAX_BLOCK",
            "    else:",
            "        kernel, block = _region_looped, min(BLOCK_LOOP, width)",
            # a looped program already has a whole row's work (LOOP_ROWS: 16 rows of 65,535
            # a program left 2,048 programs for a 32,768-row L2 norm, 56 for a group norm's 896)
            "    rows = min(" + ("LOOP_ROWS if kernel is _region_looped else ROWS_CAP" if looped_rows
                                 else "ROWS_CAP") + ", max(1, MAX_TILE // block), _pow2(n_rows))",
            "    grid = (_cdiv(n_rows, rows) * (_cdiv(n_cols, block) if kernel is _region_one_pass else 1),)",
        ]
        if persist:
            lines += ["    if kernel is _region_looped:",
                      "        grid = (min(grid[0], PROGS_PER_SM * _num_sms(out.device)),)"]
    lines += flat_line
    if slices and inner is None:
        # few rows of looped reductions: each row's columns in n_split slices of whole chunks
        # (aiming at SPLIT_PROGS programs), fp32 partials, then one program per row block
        # combining them in slice order (no atomics: the same answer every run)
        lines += [
            "    row_progs = _cdiv(n_rows, rows)",
            "    n_split = min(_cdiv(n_cols, block), SPLIT_PROGS // row_progs) if kernel is _region_looped else 1",
            "    if n_split >= 2:",
            "        slice_len = _cdiv(_cdiv(n_cols, n_split), block) * block",
            "        n_split = _cdiv(n_cols, slice_len)",
            "        ws = torch.empty((n_split, n_rows), dtype=torch.float32, device=out.device)",
            "        _region_partial[(row_progs, n_split)](" + ", ".join(call) + ", ws, slice_len, n_split,",
            f"                     ROWS=rows, BLOCK=block, SPLITS_P2=1, num_warps=NUM_WARPS{kw})",
            "        p2 = _pow2(n_split)",
            "        rows_f = min(rows, max(1, 4096 // p2))",
            "        _region_finish[(_cdiv(n_rows, rows_f),)](" + ", ".join(call) + ", ws, slice_len, n_split,",
            f"                     ROWS=rows_f, BLOCK=block, SPLITS_P2=p2, num_warps=NUM_WARPS{kw})",
            "        return out",
        ]
    warps = "LOOP_WARPS if kernel is _region_looped else NUM_WARPS" if looped_rows else "NUM_WARPS"
    lines += ["    kernel[grid](" + ", ".join(call) + ",",
              f"                 ROWS=rows, BLOCK=block, num_warps={warps}{kw})",
              "    return out"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# the contract from a spec
# ---------------------------------------------------------------------------------------------

def validate(spec: dict) -> None:
    """Raises ValueError when ``spec`` is not a region this generator can serve."""
    need = {"name", "rank", "red", "inputs", "ops"}
    if not isinstance(spec, dict) or need - set(spec):
        raise ValueError(f"a region spec has {sorted(need)}; got {spec!r:.200}")
    if not spec["inputs"] or not spec["ops"]:
        raise ValueError("a region has at least one input and one op")
    for op in spec["ops"]:
        name, _ = op_parts(op["op"])
        if name not in OPS:
            raise ValueError(f"aten.{name} is not an op regions hold")
    lower(spec)


def configure(spec: dict) -> Family:
    """The region's contract, from its JSON spec (module doc)."""
    spec = json.loads(json.dumps(spec))          # a plain copy: JSON in, JSON kept
    validate(spec)
    ranges = choose_ranges(spec)
    if ranges is None:
        # no ranges the interval bounds prove safe (x / x.std(): zero only for constant rows,
        # which random inputs never are): positive inputs, and no stability kinds the bounds
        # cannot vouch for
        ranges = ["P" if i["dtype"] != "bool" else "N" for i in spec["inputs"]]
    kinds = _kinds(spec, ranges)
    if any(i["dtype"] != "bool" for i in spec["inputs"]):
        kinds["nan"] = 1.0                      # NaN and Inf placement must match the reference's
        kinds["inf"] = 1.0
    if spec.get("conv"):
        sweep, edge = _conv_sweeps(spec)
        real = sweep[0]
    elif spec.get("gemm"):
        sweep, edge = _gemm_sweeps(spec)
        real = tuple(spec.get("shape") or sweep[2])
    else:
        real = tuple(spec.get("shape") or [8] * spec["rank"])
        sweep, edge = _sweeps(spec, real)
    nin = len(spec["inputs"])
    names = tuple(f"in{i}" for i in range(nin))
    dtypes = ("float32", "float16", "bfloat16")
    space, default = space_of(spec)
    return Family(
        name=NAME,
        signature=f"kernel_fn({', '.join(names)}) -> {spec['name']}",
        arg_names=names,
        reference=_reference_for(spec),
        make_inputs=_inputs_for(spec, ranges, kinds),
        tolerance=_tolerance_for(spec),
        cost=_cost_for(spec),
        bench_shapes=(real,),
        sweep_shapes=sweep,
        edge_shapes=edge,
        adversarial=tuple(kinds),
        space=dict(space),
        default=dict(default),
        render=render_for(spec),
        # a GEMM region: fp32 operands on tensor cores first, as the matmul family tries them
        openers=_openers(space, spec),
        default_for=_default_for(space, spec),
        dtypes=dtypes,
        description=f"region {spec['name']}: {len(spec['ops'])} aten op(s) fused, fp32 inside",
        notes={"ranges": ranges, "kinds": kinds, "depth": _depth(spec),
               "reference_source": reference_source(spec)},
        shrink_lead=not spec.get("conv"),
        error_bound=_bound_for(spec),
        bound_tol={torch.float32: _STOL, torch.float16: _STOL, torch.bfloat16: _STOL},
        op_schema="(" + ", ".join(f"Tensor {n}" for n in names) + ") -> Tensor",
        spec=spec,
        model_strides={n: tuple(i["strides"]) for n, i in zip(names, spec["inputs"])
                       if i.get("strides")},
    )


def _no_plain(*_a, **_k):
    raise ValueError("the region family has no plain contract: kernels.get('region', spec)")


# The family without a spec: its name and op table only (a region is always configured).
FAMILY = Family(
    name=NAME, signature="kernel_fn(in0, ...)", arg_names=("in0",), reference=_no_plain,
    make_inputs=_no_plain, tolerance={}, cost=lambda shape, dtype: (0, 0), bench_shapes=(),
    sweep_shapes=(), edge_shapes=(), adversarial=(), space={}, default={}, render=_no_plain,
    description="any fusible region of a model's graph; configured from its spec",
)
