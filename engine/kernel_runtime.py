"""Run a model with verified Triton kernels in place of the PyTorch ops they replace.

Standalone on purpose: this file imports torch only (the kernels bring triton). engine/integrate.py
uses it inside the engine, and ``python -m engine export`` copies it verbatim (one line changed:
OP_NAMESPACE) into the exported package, so an exported package applies its kernels where
Nightshift is not installed.

How a kernel gets used
- Functional ops are intercepted around the model's forward: in eager mode by replacing the
  functions themselves for the duration of the forward (on the calling thread only: another
  thread meanwhile gets PyTorch's), under torch.compile by a TorchFunctionMode, which dynamo
  traces. Eager avoids the mode because a mode is a Python call on every op of the model (2-4 us
  each: a launch-bound model such as BERT-base at 8x512 ran 2x slower under it). Code that bound
  a function before the forward (``from torch.nn.functional import softmax``) is not intercepted
  in eager; it runs PyTorch's op. The functions:
  torch.softmax / F.softmax / Tensor.softmax, F.layer_norm (nn.LayerNorm), F.rms_norm
  (nn.RMSNorm), F.cross_entropy, F.scaled_dot_product_attention, F.linear, torch.matmul and @,
  torch.sum / Tensor.sum over the last dim. Each handler checks that the call computes exactly the
  family's function (softmax over the last dim without a dtype, a one-dim normalized shape with
  weight and bias, cross-entropy with class indices, mean reduction and ignore_index -100, SDPA
  without a mask or dropout, ...) and otherwise leaves the call to PyTorch.
- Modules whose forward is the family's function but no single op says so (a model's own RMSNorm
  class, a gated MLP) have their forward replaced, per instance, but only after a probe: the module
  and the family's reference run on fresh random inputs of the kernel's verified shapes (and, for
  RMSNorm, tiny inputs where eps dominates), and must agree within the family's tolerance.
- Rotary embeddings are usually a plain function (``apply_rotary(x, cos, sin)``), neither an op
  nor a module. Functions named like one (rotary/rope) that take (x, cos, sin) in the modules that
  define the model's classes are probed like modules (x [B, H, S, Dh], cos/sin [S, Dh] tables,
  against the rotate-half reference) and, if they pass, replaced in their module while the kernels
  are applied; the replacement serves only the forwards of the optimized model on its thread
  (and torch.compile traces), and calls the original for everything else.
- A kernel runs only on what it was verified on: its family shapes (compared as the family sees
  them, e.g. [2, 16, 64] and [32, 64] are both 32 rows of 64 for a row-wise family), its dtype and
  its device type. Everything else falls through to PyTorch. No kernel has a backward: calls that
  need gradients fall through too.
- Each kernel is a torch.library custom op with a fake implementation, so torch.compile traces an
  optimized model with the kernels as opaque calls.

Kernel sources are code: loading one runs it in this process. They passed Nightshift's verifier,
but nothing here sandboxes them.
"""
from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import threading
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

OP_NAMESPACE = "nightshift"
ROWWISE = ("rmsnorm", "layernorm", "softmax", "cross_entropy", "reduce")
PROBE_SLACK = 4.0      # a module may differ from the float64 reference by 4x the kernel's tolerance:
                       # it rounds in its own way (fp32 upcasts, bf16 steps) and still computes the
                       # same function; a wrong eps, a missing weight or another formula is far off
EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")


def _dtype(name):
    return getattr(torch, name) if isinstance(name, str) else name


# ---- shapes as the families see them ---------------------------------------------------------

def shape_key(family: str, shape) -> tuple:
    """The canonical form of a verified family shape: what must match a call exactly."""
    s = tuple(int(v) for v in shape)
    if family in ROWWISE:                        # [..., D] viewed as [N, D]
        return (math.prod(s[:-1]), s[-1]) if s else (1, 1)
    if family == "matmul":                       # (M, K, N) or (Bt, M, K, N)
        return (1,) + s if len(s) == 3 else s
    if family == "attention":                    # (B, H, S, D[, Hkv[, causal]])
        b, h, sq, d = s[:4]
        return (b, h, sq, d, s[4] if len(s) > 4 else h, int(bool(s[5])) if len(s) > 5 else 1)
    if family == "fused_mlp":                    # (*x.shape, F)
        return (math.prod(s[:-2]), s[-2], s[-1])
    return s


@dataclass
class Kernel:
    """One verified kernel: ``fn`` is its kernel_fn; it may serve ``shapes`` in ``dtype`` on
    ``device_type`` ("cuda" or "cpu", the latter under Triton's interpreter)."""
    family: str
    fn: object
    dtype: object
    device_type: str
    shapes: list
    tolerance: tuple
    name: str = ""
    source_hash: str = ""
    keys: frozenset = field(default_factory=frozenset)
    op: object = None
    spec: dict = field(default_factory=dict)    # the contract it was verified under ({}: plain)
    schema: str = ""                            # its custom-op schema (kernels/<family>.py)

    def __post_init__(self):
        self.dtype = _dtype(self.dtype)
        self.keys = frozenset(shape_key(self.family, s) for s in self.shapes)
        self.exact = frozenset(tuple(int(v) for v in s) for s in self.shapes)
        self.name = self.name or self.family
        # the interception road (plain contracts only) registers its own ops per family
        self.op = _custom_op(self) if not self.spec else None

    def serves(self, spec: dict, shape, dtype, device_type: str) -> bool:
        """Was it verified for this contract, this exact family shape, dtype and device?"""
        return (spec_text(spec) == spec_text(self.spec) and tuple(int(v) for v in shape) in self.exact
                and _dtype(dtype) == self.dtype and device_type == self.device_type)


def spec_text(spec) -> str:
    import json
    return json.dumps(spec or {}, sort_keys=True)


def load_kernel_file(path: str, family: str, dtype, device_type: str, shapes, tolerance,
                     name: str = "", contract: dict | None = None, schema: str = "") -> Kernel:
    """Import a kernel source file (Triton reads kernel source through inspect, so it must be a
    real file) and wrap its kernel_fn."""
    if device_type == "cpu":
        _need_interpreter()
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    mod_name = f"{OP_NAMESPACE}_kernel_{family}_{digest}"
    module = sys.modules.get(mod_name)
    if module is None:
        mspec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(mspec)
        sys.modules[mod_name] = module
        try:
            mspec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(mod_name, None)
            raise
    fn = getattr(module, "kernel_fn", None)
    if not callable(fn):
        raise ValueError(f"{path} defines no kernel_fn")
    return Kernel(family, fn, dtype, device_type, [list(s) for s in shapes], tuple(tolerance),
                  name or family, digest, spec=dict(contract or {}), schema=schema)


def _need_interpreter() -> None:
    """Kernels verified under Triton's CPU interpreter run only interpreted. Triton decides at its
    first import (its own tl.sum, tl.max... become interpreted functions or not), so the switch
    must be on before then: set it if triton is not imported yet, else say what to do. Never on
    a GPU machine: every Triton kernel there (torch.compile's too) would run interpreted."""
    std = sys.modules.get("triton.language.standard")
    if std is not None:
        if type(getattr(std, "sum", None)).__name__ != "InterpretedFunction":
            raise RuntimeError("these kernels were verified under Triton's CPU interpreter and run "
                               "only interpreted, but triton was imported in this process without "
                               "it: start Python with TRITON_INTERPRET=1")
        return
    if torch.cuda.is_available():
        raise RuntimeError("these kernels were verified under Triton's CPU interpreter (CPU "
                           "tensors only); on a GPU machine, use kernels from a GPU run")
    os.environ["TRITON_INTERPRET"] = "1"


# ---- custom ops ----------------------------------------------------------------------------------

_OPS: dict = {}


def _custom_op(k: Kernel):
    """Register k.fn as OP_NAMESPACE::<family>_<hash> (once per process) with a fake
    implementation giving the output's shape and dtype, so torch.compile can trace around it.
    Outputs are made contiguous: the fake promises a contiguous result."""
    name = f"{OP_NAMESPACE}::{k.family}_{k.source_hash or id(k.fn)}"
    if name in _OPS:
        return _OPS[name]
    fn = k.fn
    lib = torch.library
    if k.family == "rmsnorm":
        @lib.custom_op(name, mutates_args=())
        def op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
            return fn(x, weight, eps).contiguous()

        @op.register_fake
        def _(x, weight, eps):
            return x.new_empty(x.shape)
    elif k.family == "layernorm":
        @lib.custom_op(name, mutates_args=())
        def op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
            return fn(x, weight, bias, eps).contiguous()

        @op.register_fake
        def _(x, weight, bias, eps):
            return x.new_empty(x.shape)
    elif k.family in ("softmax",):
        @lib.custom_op(name, mutates_args=())
        def op(x: torch.Tensor) -> torch.Tensor:
            return fn(x).contiguous()

        @op.register_fake
        def _(x):
            return x.new_empty(x.shape)
    elif k.family == "reduce":
        @lib.custom_op(name, mutates_args=())
        def op(x: torch.Tensor) -> torch.Tensor:
            return fn(x).contiguous()

        @op.register_fake
        def _(x):
            return x.new_empty(x.shape[:-1])
    elif k.family == "cross_entropy":
        @lib.custom_op(name, mutates_args=())
        def op(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return fn(logits, targets).contiguous()

        @op.register_fake
        def _(logits, targets):
            return logits.new_empty((), dtype=torch.float32)
    elif k.family == "matmul":
        @lib.custom_op(name, mutates_args=())
        def op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return fn(a, b).contiguous()

        @op.register_fake
        def _(a, b):
            return a.new_empty(tuple(a.shape[:-1]) + (b.shape[-1],))
    elif k.family == "attention":
        @lib.custom_op(name, mutates_args=())
        def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
               scale: float) -> torch.Tensor:
            return fn(q, k, v, causal, scale).contiguous()

        @op.register_fake
        def _(q, k, v, causal, scale):
            return q.new_empty(q.shape)
    elif k.family == "fused_mlp":
        @lib.custom_op(name, mutates_args=())
        def op(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
               w_down: torch.Tensor) -> torch.Tensor:
            return fn(x, w_gate, w_up, w_down).contiguous()

        @op.register_fake
        def _(x, w_gate, w_up, w_down):
            return x.new_empty(x.shape)
    elif k.family == "rotary":
        @lib.custom_op(name, mutates_args=())
        def op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            return fn(x, cos, sin).contiguous()

        @op.register_fake
        def _(x, cos, sin):
            return x.new_empty(x.shape)
    else:
        return None          # a family this runtime cannot place

    def call(*args):
        # Eager calls go straight to the kernel: a custom op's dispatch costs ~10-20 us of CPU
        # per call, which a launch-bound model (BERT-base at 8x512) pays on every layer. Under
        # torch.compile the op is what the graph records.
        if torch.compiler.is_compiling():
            return op(*args)
        return fn(*args).contiguous()

    call.custom_op = op
    _OPS[name] = call
    return call


# ---- the runtime: which kernel serves which call ----------------------------------------------

class Runtime:
    """The kernels in use for one model, by family, and how often each served or passed a call."""

    def __init__(self, kernels):
        self.kernels = {}
        for k in kernels:
            if k.op is not None:
                self.kernels[k.family] = k
        self.stats = {f: {"calls": 0, "fallthrough": 0} for f in self.kernels}
        self.points = None     # the patch points its eager forwards replace (see ``routed``)

    def fits(self, family: str, key: tuple, tensors) -> Kernel | None:
        """The kernel of ``family`` if it was verified for this call, else None (PyTorch runs it)."""
        k = self.kernels.get(family)
        if k is None:
            return None
        main = tensors[0]
        ok = (key in k.keys and main.dtype == k.dtype and main.device.type == k.device_type
              and all(t.device == main.device for t in tensors)
              and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)))
        if not torch.compiler.is_compiling():     # counters are eager-only bookkeeping
            self.stats[family]["calls" if ok else "fallthrough"] += 1
        return k if ok else None


def _arg(args, kwargs, i, name, default=None):
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _last_dim(dim, ndim) -> bool:
    if isinstance(dim, (tuple, list)):
        if len(dim) != 1:
            return False
        dim = dim[0]
    return isinstance(dim, int) and ndim > 0 and dim % ndim == ndim - 1


def _is_float_tensor(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _softmax(rt, func, args, kwargs):
    # F.softmax(input, dim=None, _stacklevel=3, dtype=None); torch.softmax / Tensor.softmax
    # (input, dim, dtype=None)
    x = _arg(args, kwargs, 0, "input")
    dim = _arg(args, kwargs, 1, "dim")
    dtype = (_arg(args, kwargs, 3, "dtype") if func is _pytorch(F.softmax)
             else _arg(args, kwargs, 2, "dtype"))
    if not _is_float_tensor(x) or dtype is not None or not _last_dim(dim, x.dim()):
        return NotImplemented
    k = rt.fits("softmax", shape_key("softmax", x.shape), (x,))
    return NotImplemented if k is None else k.op(x)


def _layer_norm(rt, func, args, kwargs):
    # F.layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5)
    x = _arg(args, kwargs, 0, "input")
    ns = _arg(args, kwargs, 1, "normalized_shape")
    w, b = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias")
    eps = _arg(args, kwargs, 4, "eps", 1e-5)
    ns = (ns,) if isinstance(ns, int) else tuple(ns)
    if (not _is_float_tensor(x) or x.dim() < 1 or ns != (x.shape[-1],) or not _is_float_tensor(w)
            or not _is_float_tensor(b) or w.shape != ns or b.shape != ns
            or w.dtype != x.dtype or b.dtype != x.dtype):
        return NotImplemented          # the family is weight and bias of x's dtype, last dim only
    k = rt.fits("layernorm", shape_key("layernorm", x.shape), (x, w, b))
    return NotImplemented if k is None else k.op(x, w, b, float(eps))


def _rms_norm(rt, func, args, kwargs):
    # F.rms_norm(input, normalized_shape, weight=None, eps=None); eps None: the dtype's epsilon
    x = _arg(args, kwargs, 0, "input")
    ns = _arg(args, kwargs, 1, "normalized_shape")
    w = _arg(args, kwargs, 2, "weight")
    eps = _arg(args, kwargs, 3, "eps")
    ns = (ns,) if isinstance(ns, int) else tuple(ns)
    if (not _is_float_tensor(x) or x.dim() < 1 or ns != (x.shape[-1],) or not _is_float_tensor(w)
            or w.shape != ns or w.dtype != x.dtype):
        return NotImplemented
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    k = rt.fits("rmsnorm", shape_key("rmsnorm", x.shape), (x, w))
    return NotImplemented if k is None else k.op(x, w, float(eps))


def _cross_entropy(rt, func, args, kwargs):
    # F.cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
    #                 reduce=None, reduction="mean", label_smoothing=0.0)
    x, t = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "target")
    if (not _is_float_tensor(x) or not isinstance(t, torch.Tensor) or x.dim() != 2
            or t.dtype != torch.int64 or tuple(t.shape) != (x.shape[0],)
            or _arg(args, kwargs, 2, "weight") is not None
            or _arg(args, kwargs, 3, "size_average") is not None
            or _arg(args, kwargs, 4, "ignore_index", -100) != -100
            or _arg(args, kwargs, 5, "reduce") is not None
            or _arg(args, kwargs, 6, "reduction", "mean") != "mean"
            or _arg(args, kwargs, 7, "label_smoothing", 0.0) != 0.0):
        return NotImplemented          # classes on the last dim of [N, V] only
    k = rt.fits("cross_entropy", shape_key("cross_entropy", x.shape), (x, t))
    # the family returns the fp32 mean; PyTorch returns it in the logits' dtype
    return NotImplemented if k is None else k.op(x, t).to(x.dtype)


def _sdpa(rt, func, args, kwargs):
    # F.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
    #                                is_causal=False, scale=None, enable_gqa=False)
    q, k_, v = (_arg(args, kwargs, i, n) for i, n in enumerate(("query", "key", "value")))
    if (not all(_is_float_tensor(t) and t.dim() == 4 for t in (q, k_, v))
            or _arg(args, kwargs, 3, "attn_mask") is not None
            or _arg(args, kwargs, 4, "dropout_p", 0.0) != 0.0
            or k_.dtype != q.dtype or v.dtype != q.dtype
            or k_.shape != v.shape or k_.shape[0] != q.shape[0] or k_.shape[2] != q.shape[2]
            or k_.shape[3] != q.shape[3] or q.shape[1] % k_.shape[1]):
        return NotImplemented          # verified with equal query/key lengths, no mask
    if k_.shape[1] != q.shape[1] and not _arg(args, kwargs, 7, "enable_gqa", False):
        return NotImplemented          # PyTorch raises on that; let it
    causal = bool(_arg(args, kwargs, 5, "is_causal", False))
    scale = _arg(args, kwargs, 6, "scale")
    b, h, s, d = q.shape
    kern = rt.fits("attention", (b, h, s, d, k_.shape[1], int(causal)), (q, k_, v))
    if kern is None:
        return NotImplemented
    return kern.op(q, k_, v, causal, float(scale) if scale is not None else 1.0 / math.sqrt(d))


def _linear(rt, func, args, kwargs):
    # F.linear(input, weight, bias=None): x [..., K] @ weight[N, K]^T (+ bias)
    x, w, bias = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight"), _arg(args, kwargs, 2, "bias")
    if not (_is_float_tensor(x) and _is_float_tensor(w) and w.dim() == 2 and x.dim() >= 1
            and x.shape[-1] == w.shape[1] and w.dtype == x.dtype):
        return NotImplemented
    if bias is not None and not (_is_float_tensor(bias) and bias.dtype == x.dtype):
        return NotImplemented
    m = math.prod(x.shape[:-1])
    tensors = (x, w) if bias is None else (x, w, bias)
    kern = rt.fits("matmul", (1, m, x.shape[-1], w.shape[0]), tensors)
    if kern is None:
        return NotImplemented
    out = kern.op(x.reshape(m, x.shape[-1]), w.t()).reshape(*x.shape[:-1], w.shape[0])
    return out if bias is None else out + bias


def _matmul(rt, func, args, kwargs):
    # torch.matmul(input, other), Tensor.matmul, a @ b: 2-D, or equal batch dims on both sides
    a, b = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "other")
    if not (_is_float_tensor(a) and _is_float_tensor(b) and a.dtype == b.dtype
            and a.dim() == b.dim() and a.dim() >= 2 and a.shape[:-2] == b.shape[:-2]
            and a.shape[-1] == b.shape[-2]):
        return NotImplemented
    lead = tuple(a.shape[:-2])
    bt = math.prod(lead)
    m, kk, n = a.shape[-2], a.shape[-1], b.shape[-1]
    kern = rt.fits("matmul", (bt, m, kk, n), (a, b))
    if kern is None:
        return NotImplemented
    if a.dim() == 2:
        return kern.op(a, b)
    return kern.op(a.reshape(bt, m, kk), b.reshape(bt, kk, n)).reshape(*lead, m, n)


def _sum(rt, func, args, kwargs):
    # torch.sum / Tensor.sum(input, dim, keepdim=False, *, dtype=None) over the last dim only
    x, dim = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "dim")
    if (not _is_float_tensor(x) or dim is None or not _last_dim(dim, x.dim())
            or _arg(args, kwargs, 2, "keepdim", False) or kwargs.get("dtype") is not None):
        return NotImplemented
    k = rt.fits("reduce", shape_key("reduce", x.shape), (x,))
    return NotImplemented if k is None else k.op(x)


def _pytorch(fn):
    """The function behind ``fn``: PyTorch's own (or a model's rotary function), fn itself unless
    this copy of the runtime or an exported one has it replaced right now."""
    return getattr(fn, "_nightshift_original", fn)


HANDLERS = {
    _pytorch(F.softmax): ("softmax", _softmax), _pytorch(torch.softmax): ("softmax", _softmax),
    _pytorch(torch.Tensor.softmax): ("softmax", _softmax),
    _pytorch(F.layer_norm): ("layernorm", _layer_norm),
    _pytorch(F.cross_entropy): ("cross_entropy", _cross_entropy),
    _pytorch(F.scaled_dot_product_attention): ("attention", _sdpa),
    _pytorch(F.linear): ("matmul", _linear), _pytorch(torch.matmul): ("matmul", _matmul),
    _pytorch(torch.Tensor.matmul): ("matmul", _matmul),
    _pytorch(torch.Tensor.__matmul__): ("matmul", _matmul),
    _pytorch(torch.sum): ("reduce", _sum), _pytorch(torch.Tensor.sum): ("reduce", _sum),
}
if hasattr(F, "rms_norm"):
    HANDLERS[_pytorch(F.rms_norm)] = ("rmsnorm", _rms_norm)


# Where each intercepted function lives, so eager forwards can replace it there.
PATCH_POINTS = [(F, "softmax"), (torch, "softmax"), (torch.Tensor, "softmax"), (F, "layer_norm"),
                (F, "cross_entropy"), (F, "scaled_dot_product_attention"), (F, "linear"),
                (torch, "matmul"), (torch.Tensor, "matmul"), (torch.Tensor, "__matmul__"),
                (torch, "sum"), (torch.Tensor, "sum")] + ([(F, "rms_norm")] if hasattr(F, "rms_norm") else [])


class _Routing(threading.local):
    """Per thread: the runtimes of the optimized forwards running now (innermost last), and
    whether a handler or its fall-through is running (then nested calls go straight to PyTorch:
    F.softmax itself calls Tensor.softmax)."""
    stack: list
    busy: bool

    def __init__(self):
        self.stack, self.busy = [], False


_routing = _Routing()
_patch_lock = threading.Lock()
_patch_users: dict = {}        # (owner, attribute) -> forwards running with it replaced
_originals: dict = {}          # (owner, attribute) -> PyTorch's function


def _wrapper(orig, family, handler):
    def routed(*args, **kwargs):
        st = _routing
        if not st.stack or st.busy or family not in st.stack[-1].kernels:
            return orig(*args, **kwargs)
        st.busy = True
        try:
            out = handler(st.stack[-1], orig, args, kwargs)
            return orig(*args, **kwargs) if out is NotImplemented else out
        finally:
            st.busy = False
    routed.__name__ = getattr(orig, "__name__", "routed")
    routed.__doc__ = getattr(orig, "__doc__", None)
    routed._nightshift_original = orig
    return routed


def _points(families) -> list:
    """The patch points whose function belongs to one of ``families``: only those are replaced
    (a model with a softmax kernel keeps PyTorch's own @ and F.linear untouched)."""
    out = []
    for owner, attr in PATCH_POINTS:
        if HANDLERS[_pytorch(getattr(owner, attr))][0] in families:
            out.append((owner, attr))
    return out


_wrappers: dict = {}           # (owner, attribute, PyTorch's function) -> its routing wrapper


def _install(points) -> None:
    with _patch_lock:
        for owner, attr in points:
            key = (owner, attr)
            if _patch_users.get(key, 0) == 0:
                orig = _pytorch(getattr(owner, attr))
                wrapped = _wrappers.get((owner, attr, orig))
                if wrapped is None:            # built once: an eager forward installs it each call
                    family, handler = HANDLERS[orig]
                    wrapped = _wrappers[(owner, attr, orig)] = _wrapper(orig, family, handler)
                _originals[key] = orig
                setattr(owner, attr, wrapped)
            _patch_users[key] = _patch_users.get(key, 0) + 1


def _uninstall(points) -> None:
    with _patch_lock:
        for key in points:
            _patch_users[key] -= 1
            if _patch_users[key] == 0:
                setattr(key[0], key[1], _originals.pop(key))
                del _patch_users[key]


class routed:
    """Context: functional calls on this thread go to ``rt``'s kernels (eager path)."""

    def __init__(self, rt: Runtime):
        self.rt = rt
        if rt.points is None:                 # worked out once per runtime, not per forward
            rt.points = _points(set(rt.kernels))
        self.points = rt.points

    def __enter__(self):
        _install(self.points)
        _routing.stack.append(self.rt)

    def __exit__(self, *exc):
        _routing.stack.pop()
        _uninstall(self.points)


class KernelMode(TorchFunctionMode):
    """Routes the intercepted functional calls to the runtime's kernels. PyTorch leaves the mode
    while a handler runs, so falling through (calling ``func``) does not come back here."""

    def __init__(self, rt: Runtime):
        super().__init__()
        self.rt = rt

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        entry = HANDLERS.get(func)
        if entry is not None and entry[0] in self.rt.kernels:
            out = entry[1](self.rt, func, args, kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


# ---- module swaps, after a probe ----------------------------------------------------------------

def rmsnorm_params(module: nn.Module):
    """(weight, eps) of a module that looks like an RMSNorm (one 1-D weight, an eps attribute, no
    children, not a torch.nn class: nn.RMSNorm goes through F.rms_norm), else None. Looking
    like one is not enough to be swapped: see probe_rmsnorm."""
    if type(module).__module__.startswith("torch.nn") or any(True for _ in module.children()):
        return None
    params = dict(module.named_parameters(recurse=False))
    w = params.get("weight")
    if w is None or w.dim() != 1 or set(params) != {"weight"}:
        return None
    eps = next((getattr(module, a) for a in EPS_ATTRS if isinstance(getattr(module, a, None), float)), None)
    return None if eps is None else (w, eps)


def _rmsnorm_ref64(x, w, eps):
    x, w = x.double(), w.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _within(out, ref, tol, bound=None) -> bool:
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape:
        return False
    out = out.double()
    atol, rtol = tol[0], tol[1]
    allowed = atol + rtol * ref.abs()
    if len(tol) > 2 and bound is not None:
        allowed = allowed + tol[2] * bound
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(out)):
        return False
    return bool(((out - ref).abs()[finite] <= PROBE_SLACK * allowed[finite] + 1e-30).all())


def _probe_gen(seed=1234):
    # on the CPU, then moved: the same probe values on every device
    return torch.Generator(device="cpu").manual_seed(seed)


def probe_rmsnorm(module: nn.Module, shape, dtype, tol) -> bool:
    """Does module(x) equal the rmsnorm reference with the module's weight and eps, on random x
    of ``shape`` in ``dtype``, at unit scale and at a scale where eps dominates?"""
    found = rmsnorm_params(module)
    if found is None:
        return False
    w, eps = found
    if tuple(shape)[-1] != w.shape[0]:
        return False
    gen = _probe_gen()
    try:
        with torch.no_grad():
            for scale in (1.0, 1e-3, 30.0):
                x = (torch.randn(tuple(shape), generator=gen) * scale).to(device=w.device, dtype=dtype)
                if not _within(_orig_forward(module)(x), _rmsnorm_ref64(x, w, eps), tol):
                    return False
    except Exception:
        return False
    return True


_MLP_NAMES = {"gate": ("gate_proj", "gate", "w1", "fc_gate"), "up": ("up_proj", "up", "w3", "fc_up"),
              "down": ("down_proj", "down", "w2", "fc_down")}


def mlp_params(module: nn.Module):
    """(gate, up, down) nn.Linear children without bias of a gated-MLP-looking module, else None."""
    children = dict(module.named_children())
    found = []
    for role in ("gate", "up", "down"):
        lin = next((children[n] for n in _MLP_NAMES[role] if n in children), None)
        if not isinstance(lin, nn.Linear) or lin.bias is not None:
            return None
        found.append(lin)
    g, u, d = found
    if g.weight.shape != u.weight.shape or d.weight.shape[1] != g.weight.shape[0]:
        return None
    return g, u, d


def _mlp_ref64(x, wg, wu, wd):
    x, wg, wu, wd = (t.double() for t in (x, wg, wu, wd))
    g, u = F.linear(x, wg), F.linear(x, wu)
    sg = torch.sigmoid(g)
    y = F.linear(g * sg * u, wd)
    # the family's error bound: h's rounding plus what the rounding of g and u does to it
    dh = (sg * (1 + g * (1 - sg))).abs() * u.abs() * F.linear(x.abs(), wg.abs()) \
        + (g * sg).abs() * F.linear(x.abs(), wu.abs())
    return y, F.linear((g * sg * u).abs() + dh, wd.abs())


def probe_mlp(module: nn.Module, shape, dtype, tol) -> bool:
    """Does module(x) equal down(silu(gate(x)) * up(x)) on random x (shape (*x.shape, F))?"""
    found = mlp_params(module)
    if found is None:
        return False
    g, u, d = found
    xs, f = tuple(shape)[:-1], tuple(shape)[-1]
    if f != g.weight.shape[0] or xs[-1] != g.weight.shape[1]:
        return False
    gen = _probe_gen()
    try:
        with torch.no_grad():
            x = torch.randn(xs, generator=gen).to(device=g.weight.device, dtype=dtype)
            ref, bound = _mlp_ref64(x, g.weight, u.weight, d.weight)
            return _within(_orig_forward(module)(x), ref, tol, bound)
    except Exception:
        return False


def _orig_forward(module):
    return getattr(module, "_nightshift_forward", None) or module.forward


def _rmsnorm_forward(rt, module, orig):
    def forward(x, *args, **kwargs):
        found = rmsnorm_params(module) if not (args or kwargs) else None
        if found is not None and isinstance(x, torch.Tensor) and found[0].dtype == x.dtype:
            w, eps = found
            k = rt.fits("rmsnorm", shape_key("rmsnorm", x.shape), (x, w))
            if k is not None:
                return k.op(x, w, float(eps))
        return orig(x, *args, **kwargs)
    return forward


def _mlp_forward(rt, module, orig):
    def forward(x, *args, **kwargs):
        found = mlp_params(module) if not (args or kwargs) else None
        if found is not None and isinstance(x, torch.Tensor):
            g, u, d = found
            ws = (g.weight, u.weight, d.weight)
            if all(w.dtype == x.dtype for w in ws):
                k = rt.fits("fused_mlp", shape_key("fused_mlp", tuple(x.shape) + (g.weight.shape[0],)),
                            (x,) + ws)
                if k is not None:
                    return k.op(x, *ws)
        return orig(x, *args, **kwargs)
    return forward


# ---- function swaps (rotary), after a probe -------------------------------------------------------

_ROTARY_NAME = ("rotary", "rope")


def rotary_functions(model: nn.Module) -> list:
    """(python module, attribute name, function) for each module-level function named like a
    rotary embedding (rotary/rope, not rotate_half) with at least three positional parameters,
    in the modules that define the model's classes."""
    import inspect
    found, seen = [], set()
    for mod_name in sorted({type(m).__module__ for m in model.modules()}):
        pymod = sys.modules.get(mod_name)
        if pymod is None or mod_name.startswith("torch."):
            continue
        for attr, fn in sorted(vars(pymod).items()):
            fn = _pytorch(fn)                       # the model's own, if swapped right now
            if (not inspect.isfunction(fn) or not any(w in attr.lower() for w in _ROTARY_NAME)
                    or id(fn) in seen):
                continue
            try:
                params = [p for p in inspect.signature(fn).parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            except (TypeError, ValueError):
                continue
            if len(params) >= 3 and all(p.default is p.empty for p in params[:3]):
                seen.add(id(fn))
                found.append((pymod, attr, fn))
    return found


def _rotary_ref64(x, cos, sin):
    x, cos, sin = x.double(), cos.double(), sin.double()
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def probe_rotary(fn, shape, dtype, tol, device) -> bool:
    """Does fn(x, cos, sin) equal the rotate-half rotary embedding on random x [B, H, S, Dh] of
    ``shape`` and tables of random angles [S, Dh] (frequencies repeated twice), in ``dtype``?"""
    b, h, sq, dh = (tuple(shape) + (0, 0, 0, 0))[:4]
    if len(tuple(shape)) != 4 or dh % 2:
        return False
    gen = _probe_gen()
    try:
        with torch.no_grad():
            x = torch.randn((b, h, sq, dh), generator=gen).to(device=device, dtype=dtype)
            ang = torch.rand((sq, dh // 2), generator=gen) * 6.3
            ang = torch.cat((ang, ang), dim=-1)
            cos, sin = ang.cos().to(device=device, dtype=dtype), ang.sin().to(device=device, dtype=dtype)
            # the products' magnitude bounds the rounding of their sum, which cancels where a
            # rotated value lands near 0; a wrong half, sign or table row is off by O(bound)
            h = dh // 2
            bound = (x.abs() * cos.abs() + torch.cat((x[..., h:], x[..., :h]), dim=-1).abs()
                     * sin.abs()).double()
            return _within(fn(x, cos, sin), _rotary_ref64(x, cos, sin), (tol[0], tol[1], tol[1]), bound)
    except Exception:
        return False


def _rotary_function(rt, orig):
    def rotary(*args, **kwargs):
        # the optimized model's forward on this thread, or a torch.compile trace of it
        if (len(args) == 3 and not kwargs and (torch.compiler.is_compiling()
                                               or (_routing.stack and _routing.stack[-1] is rt))):
            x, cos, sin = args
            if (isinstance(x, torch.Tensor) and isinstance(cos, torch.Tensor)
                    and isinstance(sin, torch.Tensor) and x.dim() == 4
                    and cos.shape == sin.shape == (x.shape[2], x.shape[3])
                    and cos.dtype == sin.dtype == x.dtype):
                k = rt.fits("rotary", shape_key("rotary", x.shape), (x, cos, sin))
                if k is not None:
                    return k.op(x, cos, sin)
        return orig(*args, **kwargs)
    rotary.__name__ = orig.__name__
    rotary._nightshift_original = orig
    return rotary


def _set_forward(module, fn, swaps):
    """Replace module.forward on this instance only; remember how to put it back."""
    had = "forward" in module.__dict__
    swaps.append((module, had, module.__dict__.get("forward")))
    module._nightshift_forward = module.forward
    module.forward = fn


class Applied:
    """What ``apply`` did to a model: ``swapped`` module names per family, ``stats()`` the calls
    each kernel served (and passed to PyTorch), ``remove()`` undoes it all."""

    def __init__(self, model, rt, swaps, swapped):
        self.model, self.rt, self._swaps, self.swapped = model, rt, swaps, swapped

    def stats(self) -> dict:
        return {f: dict(s, kernel=self.rt.kernels[f].name, swapped=self.swapped.get(f, []))
                for f, s in self.rt.stats.items()}

    def reset_stats(self) -> None:
        for s in self.rt.stats.values():
            s["calls"] = s["fallthrough"] = 0

    def remove(self) -> None:
        for module, had, old in reversed(self._swaps):
            if had == "function":                 # a module-level function swap
                setattr(module, old[0], old[1])
            elif had:
                module.forward = old
            else:
                module.__dict__.pop("forward", None)
            module.__dict__.pop("_nightshift_forward", None)
        self._swaps.clear()


def apply(model: nn.Module, kernels, probe: bool = True) -> Applied:
    """Use ``kernels`` (Kernel objects, one per family) in ``model``, in place: module swaps that
    pass their probe, and the functional interception around model.forward. Weights stay where
    they are (state_dict unchanged); ``.remove()`` on the result restores the model."""
    rt = Runtime(kernels)
    swaps, swapped = [], {}
    named = list(model.named_modules())
    for fam, probe_fn, make in (("rmsnorm", probe_rmsnorm, _rmsnorm_forward),
                                ("fused_mlp", probe_mlp, _mlp_forward)):
        k = rt.kernels.get(fam)
        if k is None:
            continue
        for name, mod in named:
            params = rmsnorm_params(mod) if fam == "rmsnorm" else mlp_params(mod)
            if params is None:
                continue
            width = params[0].shape[0] if fam == "rmsnorm" else None
            shapes = [s for s in k.shapes if fam != "rmsnorm" or s[-1] == width]
            if not shapes or (probe and not all(probe_fn(mod, s, k.dtype, k.tolerance) for s in shapes)):
                continue
            _set_forward(mod, make(rt, mod, mod.forward), swaps)
            swapped.setdefault(fam, []).append(name or "<root>")
    k = rt.kernels.get("rotary")
    if k is not None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        for pymod, attr, fn in rotary_functions(model):
            if probe and not all(probe_rotary(fn, sh, k.dtype, k.tolerance, device) for sh in k.shapes):
                continue
            swaps.append((pymod, "function", (attr, getattr(pymod, attr))))
            setattr(pymod, attr, _rotary_function(rt, fn))
            swapped.setdefault("rotary", []).append(f"{pymod.__name__}.{attr}")
    if any(f in rt.kernels for f, _ in HANDLERS.values()) or "rotary" in swapped:
        inner = model.forward

        def forward(*args, **kwargs):
            if torch.compiler.is_compiling():
                with KernelMode(rt):
                    return inner(*args, **kwargs)
            with routed(rt):
                return inner(*args, **kwargs)
        _set_forward(model, forward, swaps)
    return Applied(model, rt, swaps, swapped)


# ---- the graph road: placed call sites -------------------------------------------------------------
#
# engine/place.py rewrites a captured graph: each matched subgraph becomes one call
# ``site_call(site_id, *kernel_args)``. A Site knows its kernel, the exact shapes, dtypes and
# strides of the tensors it was placed for (the graph is static: these are what it always
# sees), and the output it must produce. In eager mode site_call runs the kernel directly (a
# custom op's dispatch costs 10-20 us of CPU a call); under torch.compile it calls the site's
# custom op, whose fake implementation gives inductor the output's shape and dtype, so the
# kernel stays one opaque call in the compiled graph. Arguments that do not fit raise GuardMiss:
# the optimized module catches it and runs the original model for that call.

class GuardMiss(Exception):
    """A placed site got tensors other than the ones it was verified and placed for."""


@dataclass
class Site:
    id: int
    kernel: Kernel
    args: tuple           # per kernel argument: (shape, dtype, stride, device type) of a tensor, else None
    out: tuple            # (shape, dtype, stride) the site returns: contiguous, or the layout
                          # the family's kernels write (Family.out_order); given without the
                          # stride (a manifest written before sites carried one): contiguous
    op: object = None

    def __post_init__(self):
        shape = tuple(self.out[0])
        self.out = (shape, self.out[1],
                    tuple(self.out[2]) if len(self.out) > 2 else ordered_strides(shape))

    def layout(self) -> tuple:
        """The strides of what the site returns."""
        return self.out[2]

    def result(self, y: torch.Tensor) -> torch.Tensor:
        """The kernel's result in the site's layout: as it is where the kernel wrote that
        layout (no copy), else copied into it."""
        shape, _, stride = self.out
        return y if same_layout(shape, y.stride(), stride) else restrided(y, shape, stride)

    def fits(self, values) -> bool:
        for v, want in zip(values, self.args):
            if want is None:
                if isinstance(v, torch.Tensor):
                    return False
                continue
            if not isinstance(v, torch.Tensor):
                return False
            shape, dtype, stride, dev = want
            if (tuple(v.shape) != shape or v.dtype != dtype or v.device.type != dev
                    or (v.numel() > 1 and not same_layout(shape, tuple(v.stride()), stride))):
                return False
        return not (torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad
                                                    for v in values))

    def conform(self, values):
        """``values`` with each tensor that arrives in another layout than the dense one the
        site was placed for copied into it, or None where anything else differs. The graph's
        fake values and the real run can disagree on a layout: ``x.to(dtype)`` to the dtype x
        has is a fresh contiguous tensor when the graph is captured and x itself (a strided
        slice: the probabilities of an attention with sinks, the sink column cut off) when it
        runs. The kernel then gets the layout it was verified and placed for."""
        out = list(values)
        for i, (v, want) in enumerate(zip(values, self.args)):
            if want is None or not isinstance(v, torch.Tensor):
                continue
            shape, dtype, stride, dev = want
            if (tuple(v.shape) == shape and v.dtype == dtype and v.device.type == dev
                    and not same_layout(shape, tuple(v.stride()), stride)
                    and same_layout(shape, stride, ordered_strides(shape))):
                out[i] = v.contiguous()
        out = tuple(out)
        return out if self.fits(out) else None


def ordered_strides(shape, order=None) -> tuple:
    """Dense strides of ``shape`` with its dims laid out outermost first in ``order`` (a
    family's out_order; None: contiguous)."""
    order = range(len(shape)) if order is None else order
    stride, n = [0] * len(shape), 1
    for d in reversed(tuple(order)):
        stride[d] = n
        n *= max(1, shape[d])
    return tuple(stride)


def same_layout(shape, a, b) -> bool:
    """Strides ``a`` and ``b`` address a tensor of ``shape`` alike: equal on every dim longer
    than 1 (a size-1 dim's stride is never multiplied by anything but 0, and the graph's fake
    values and the real run disagree on it: a reshape to [1, 2, 81, 8] gave stride 16 or 1296)."""
    return all(x == y for n, x, y in zip(shape, a, b) if n != 1)


SITES: dict = {}
_SITE_OPS: dict = {}
_LIB: list = []


def _library():
    if not _LIB:
        _LIB.append(torch.library.Library(OP_NAMESPACE, "FRAGMENT"))
    return _LIB[0]


def _site_op(site: Site):
    """The custom op behind a site: one per kernel and site signature, schema from the family."""
    sig = hashlib.sha256(repr((site.args, site.out, site.kernel.source_hash)).encode()).hexdigest()[:12]
    name = f"{site.kernel.family}_{site.kernel.source_hash or id(site.kernel.fn)}_{sig}"
    if name in _SITE_OPS:
        return _SITE_OPS[name]
    schema = site.kernel.schema or "(Tensor x) -> Tensor"
    lib = _library()
    lib.define(name + schema)
    fn = site.kernel.fn
    shape, dtype, stride = site.out

    def impl(*args):
        return site.result(fn(*args))

    def fake(*args):
        return torch.empty_strided(shape, stride, dtype=dtype,
                                   device=next(a.device for a in args if isinstance(a, torch.Tensor)))
    lib.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{OP_NAMESPACE}::{name}", fake, lib=lib)
    op = getattr(getattr(torch.ops, OP_NAMESPACE), name).default
    _SITE_OPS[name] = op
    return op


def add_site(kernel: Kernel, args: tuple, out: tuple) -> int:
    site = Site(len(SITES) + 1, kernel, tuple(args), tuple(out))
    site.op = _site_op(site)
    SITES[site.id] = site
    return site.id


def restrided(x: torch.Tensor, shape: tuple, stride: tuple) -> torch.Tensor:
    """``x``'s values in the layout ``stride`` (dense, non-overlapping): what a site's
    contiguous result is copied into where a reader of the original op depended on its
    layout (engine/place.py)."""
    return torch.empty_strided(shape, stride, dtype=x.dtype, device=x.device).copy_(x)


def site_call(site_id: int, *args):
    """What a placed node runs: the site's kernel on its arguments (see above)."""
    site = SITES[site_id]
    if not site.fits(args):
        fitted = site.conform(args)
        if fitted is None:
            got = [(tuple(a.shape), a.dtype, tuple(a.stride())) if isinstance(a, torch.Tensor) else a
                   for a in args]
            raise GuardMiss(f"site {site_id} ({site.kernel.name}) got {got}, placed for {site.args}")
        args = fitted
    if torch.compiler.is_compiling():
        return site.op(*args)
    return site.result(site.kernel.fn(*args))


def _leaves(x) -> list:
    from torch.utils._pytree import tree_leaves
    return tree_leaves(x)


def _signature(args, kwargs) -> tuple:
    # called on every forward of an optimized model: tensors alone, the common call, skip pytree
    if not kwargs and all(type(t) is torch.Tensor for t in args):
        return tuple((tuple(t.shape), t.dtype, t.device.type) for t in args)
    return tuple((tuple(t.shape), t.dtype, t.device.type) if isinstance(t, torch.Tensor) else
                 ("value", t if isinstance(t, (int, float, bool, str, type(None))) else type(t))
                 for t in _leaves((args, kwargs)))


class Optimized(nn.Module):
    """The model with its placed kernels: ``run`` (the rewritten graph(s), eager or compiled)
    serves calls whose inputs have the captured shapes and dtypes, and any call that misses a
    site's guard; every other call runs the original model. ``calls`` counts both."""

    def __init__(self, original: nn.Module, run, example_args, example_kwargs=None, label="",
                 signature=None):
        super().__init__()
        object.__setattr__(self, "original", original)   # not a submodule: no second state_dict
        object.__setattr__(self, "run", run)
        self.signature = signature if signature is not None else _signature(
            tuple(example_args), dict(example_kwargs or {}))
        self.label = label
        self.calls = {"placed": 0, "original": 0, "guard_miss": 0}

    def forward(self, *args, **kwargs):
        return self.call(_signature(args, kwargs), args, kwargs)

    def call(self, sig, args, kwargs):
        """forward with the call's signature already computed (Specializing has it)."""
        if sig == self.signature:
            try:
                out = self.run(*args, **kwargs)
                self.calls["placed"] += 1
                return out
            except GuardMiss:
                self.calls["guard_miss"] += 1
        self.calls["original"] += 1
        return self.original(*args, **kwargs)

    def stats(self) -> dict:
        return dict(self.calls)

    def remove(self) -> None:
        """Nothing to undo: the original model was never modified."""


class Graphed(nn.Module):
    """``module`` replayed from one CUDA graph for calls shaped like ``example_args`` (tensors,
    positional): a call's tensors are copied into the graph's own inputs and the recorded
    kernels run with no host work per launch (a Triton launch costs ~50 us of Python on the
    H200's host against ~15 us for an ATen op: a forward of short kernels waits on the host).
    Any other call runs ``module`` itself. As with torch's CUDA graphs, the outputs are the
    graph's own tensors: the next call overwrites them (clone what you keep)."""

    def __init__(self, module, example_args, warmup: int = 3):
        super().__init__()
        object.__setattr__(self, "inner", module)        # not a submodule: no second state_dict
        args = tuple(example_args)
        if not args or not all(type(a) is torch.Tensor and a.is_cuda for a in args):
            raise ValueError("a CUDA graph needs the call's inputs as CUDA tensors, positional")
        self.signature = _signature(args, {})
        self.strides = tuple(a.stride() for a in args)
        self.static_in = [a.clone() for a in args]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(warmup):                       # compiles, autotunes, fills caches
                module(*self.static_in)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.static_out = module(*self.static_in)
        self.calls = {"replayed": 0, "original": 0}
        # with autograd on and something to differentiate, the model itself runs: a replay
        # has no backward
        own = getattr(module, "original", module)        # an optimized model keeps its original apart
        self.trainable = any(p.requires_grad for p in own.parameters()) if isinstance(own, nn.Module) else False

    def forward(self, *args, **kwargs):
        grad = torch.is_grad_enabled() and (self.trainable or any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args))
        if (kwargs or grad or len(args) != len(self.static_in)
                or _signature(args, {}) != self.signature
                or tuple(a.stride() for a in args) != self.strides):
            self.calls["original"] += 1
            return self.inner(*args, **kwargs)
        for mine, a in zip(self.static_in, args):
            if a.data_ptr() != mine.data_ptr():
                mine.copy_(a)
        self.graph.replay()
        self.calls["replayed"] += 1
        return self.static_out


# ---- a rewritten graph written to a package (engine/export.py) and loaded back --------------------

_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16,
                                                      torch.float64, torch.int64, torch.int32,
                                                      torch.int16, torch.int8, torch.uint8, torch.bool)}


def site_rows(site_ids) -> list[dict]:
    """Sites as JSON rows for a manifest."""
    rows = []
    for sid in site_ids:
        st = SITES[sid]
        rows.append({"id": sid, "kernel": st.kernel.name,
                     "args": [None if a is None else [list(a[0]), str(a[1]).removeprefix("torch."),
                                                      list(a[2]), a[3]] for a in st.args],
                     "out": [list(st.out[0]), str(st.out[1]).removeprefix("torch."),
                             list(st.out[2])]})
    return rows


def signature_rows(sig) -> list:
    return [[list(x[0]), str(x[1]).removeprefix("torch."), x[2]] if len(x) == 3 and x[0] != "value"
            else ["value", repr(x[1])] for x in sig]


def _signature_from_rows(rows) -> tuple:
    out = []
    for r in rows:
        if r[0] == "value":
            import ast
            out.append(("value", ast.literal_eval(r[1])))
        else:
            out.append((tuple(r[0]), _DTYPES[r[1]], r[2]))
    return tuple(out)


def load_graph(model: nn.Module, folder: str, entry: dict, kernels_by_name: dict) -> "Optimized":
    """The module an exported graph describes: ``entry`` (manifest "graphs" row) names the
    forward's source file, its pytree specs and constants, the sites it calls and the input
    signature it serves. The graph reads the model's own weights (same names)."""
    import pickle
    remap = {}
    for row in entry["sites"]:
        k = kernels_by_name[row["kernel"]]
        args = tuple(None if a is None else (tuple(a[0]), _DTYPES[a[1]], tuple(a[2]), a[3])
                     for a in row["args"])
        out = row["out"]           # [shape, dtype, stride]; stride absent: contiguous (Site)
        remap[row["id"]] = add_site(k, args, (tuple(out[0]), _DTYPES[out[1]], *out[2:]))

    def call(site_id, *args):
        return site_call(remap[site_id], *args)
    from torch.fx import _pytree as fx_pytree
    from torch.utils import _pytree as pytree
    env = {"torch": torch, "inf": math.inf, "nan": math.nan, "NoneType": type(None),
           "device": torch.device, "fx_pytree": fx_pytree, "pytree": pytree,
           entry["site_call_name"]: call}
    with open(os.path.join(folder, entry["file"])) as f:
        exec(compile(f.read(), os.path.join(folder, entry["file"]), "exec"), env)
    holder = nn.Module()
    for name, child in model.named_children():
        holder.add_module(name, child)
    for name, p in model.named_parameters(recurse=False):
        holder.register_parameter(name, p)
    for name, b in model.named_buffers(recurse=False):
        holder.register_buffer(name, b)
    import warnings
    with open(os.path.join(folder, entry["specs"]), "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore")             # torch 2.13 deprecates LeafSpec's isinstance
        specs = pickle.load(f)
    holder._in_spec, holder._out_spec = specs["in_spec"], specs["out_spec"]
    if entry.get("constants"):
        consts = torch.load(os.path.join(folder, entry["constants"]), map_location="cpu")
        dev = next((p.device for p in model.parameters()), torch.device("cpu"))
        for name, t in consts.items():
            holder.register_buffer(name, t.to(dev), persistent=False)
    forward = env["forward"]

    def run(*args, **kwargs):
        return forward(holder, *args, **kwargs)
    return Optimized(model, run, (), None, "exported rewritten graph",
                     signature=_signature_from_rows(entry["signature"]))


def load_manifest_kernels(folder: str, manifest: dict) -> list[Kernel]:
    """Kernels described by an export manifest: {"kernels": [{"family", "file", "dtype",
    "device_type", "shapes", "tolerance", "name"}, ...]}, files relative to ``folder``."""
    out = []
    for e in manifest["kernels"]:
        out.append(load_kernel_file(os.path.join(folder, e["file"]), e["family"], e["dtype"],
                                    e["device_type"], e["shapes"], e["tolerance"], e.get("name", ""),
                                    e.get("spec"), e.get("schema", "")))
    return out


__all__ = ["Kernel", "Applied", "apply", "load_kernel_file", "load_manifest_kernels", "shape_key",
           "probe_rmsnorm", "probe_mlp", "KernelMode", "Runtime", "Site", "SITES", "add_site",
           "site_call", "GuardMiss", "Optimized"]
