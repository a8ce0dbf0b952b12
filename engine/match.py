"""Find the families in a captured graph: each family's spellings, matched as subgraphs.

A family file declares ``SPELLINGS`` (kernels/patterns.py): small functions written as model code
writes the op. ``patterns()`` traces each one to an aten graph with the same torch.export road
the model took (engine/capture.py), so both sides speak the same IR whatever the torch version.
``find(graph)`` then looks for every pattern in a captured graph:

- anchored at the pattern's output op, a match walks the pattern backwards, node by node; its
  placeholders bind to any value (the same value every time the placeholder recurs);
- the leniencies of kernels/patterns.py: casts/aliases/clones/dropout(p=0) looked through,
  add/mul commutative (an op's most constrained operands matched first; a whole match that
  fails after a swap left untried is tried again with the swap forced), Tensor/Scalar
  overloads one op, sentinel scalars captured, dims compared from the end (or captured), sizes
  not compared, slice bounds compared as small offsets or fractions of the dim;
- a match's inner values must have no consumer outside it (else replacing it would not remove
  them), and matches never overlap: bigger patterns claim their nodes first (attention before
  the softmax and matmuls inside it, a gated MLP before its projections);
- the family's ``from_match`` turns the match into a ``Fit`` (spec, family shape, kernel
  arguments) or ``NoFit(why)``; then a **probe** runs the matched subgraph and the family's
  reference under that spec on the same random inputs (constants, such as a mask buffer, keep
  their values) and drops a match the two disagree on: what a target is judged on is what the
  model computes.

Every family, pattern and contract comes from ``kernels.all_families()``: nothing here names a
family.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn

import kernels
from engine import capture as cap
from kernels.patterns import Fit, NoFit, Ref, Scalar, Spelling, T

aten = torch.ops.aten

# Arithmetic ops whose Tensor and Scalar overloads are one op here.
_MERGED = {"add", "sub", "mul", "div", "pow", "eq", "ne", "lt", "le", "gt", "ge", "masked_fill",
           "where", "rsub", "bitwise_and", "logical_and", "__and__", "remainder", "var", "std"}
# var / std: x.var(unbiased=False) is var.dim, x.var(correction=0) var.correction; the same op
_VARIANCE = {"var", "std"}
_COMMUTATIVE = {"add", "mul", "eq", "ne", "bitwise_and", "logical_and", "__and__"}
# Ops looked through between spelled ops: casts, aliases, copies, dropout (only when it is a no-op).
_TRANSPARENT = {"to", "_to_copy", "alias", "clone", "contiguous", "detach", "lift_fresh_copy",
                "type_as", "dropout", "_assert_tensor_metadata"}
# Argument names that hold dims (compared from the end), sizes (not compared) and bounds.
_DIM_ARGS = {"dim", "dim0", "dim1", "dims", "start_dim", "end_dim"}
_SIZE_ARGS = {"size", "shape", "sizes", "repeats", "split_size", "split_sizes", "chunks", "sections",
              "output_size", "normalized_shape"}
_BOUND_ARGS = {"start", "end"}
_REDUCTIONS = {"mean", "sum", "amax", "amin", "var", "var_mean", "std", "logsumexp", "norm",
               "linalg_vector_norm", "max", "min", "prod", "softmax", "_softmax", "log_softmax",
               "_log_softmax"}
_RANDOM = {"rand", "randn", "randint", "bernoulli", "normal", "uniform", "rand_like", "randn_like",
           "native_dropout", "exponential", "multinomial"}
_FOLD_LIMIT = 1 << 26          # elements: constants bigger than this are not folded
PROBE_LIMIT = 1 << 25          # elements of a match's inputs beyond which its probe is skipped
PROBE_SLACK = 4.0              # the model rounds its own way (bf16 steps, fp32 upcasts)


def _opname(target) -> str | None:
    return getattr(target, "_opname", None) if isinstance(target, torch._ops.OpOverload) else None


def canon(target) -> str:
    """The key two nodes must share to match: merged overloads share their op name."""
    name = _opname(target)
    if name is None:
        return getattr(target, "__name__", str(target))
    if name in _MERGED:
        return f"{target.namespace}.{name}"
    return str(target)


_MISSING = object()


def norm_args(node: fx.Node) -> list[tuple[str, object]]:
    """(name, value) for every argument of an op node, defaults filled in, kwargs in place."""
    t = node.target
    if not isinstance(t, torch._ops.OpOverload):
        return [(str(i), a) for i, a in enumerate(node.args)] + sorted(node.kwargs.items())
    out = []
    for i, a in enumerate(t._schema.arguments):
        if i < len(node.args) and not a.kwarg_only:
            v = node.args[i]
        elif a.name in node.kwargs:
            v = node.kwargs[a.name]
        elif a.has_default_value():
            v = a.default_value
        else:
            v = _MISSING
        out.append((a.name, v))
    if t._opname in _VARIANCE:
        # one argument list for every overload: (self, dim, correction, keepdim)
        d = dict(out)
        corr = d.get("correction", _MISSING)
        if corr is _MISSING or corr is None:
            corr = 1 if d.get("unbiased", True) in (True, None) else 0
        out = [("self", d.get("self")), ("dim", d.get("dim")), ("correction", corr),
               ("keepdim", bool(d.get("keepdim", False)))]
    return out


def _is_noop_dropout(node) -> bool:
    args = dict(norm_args(node))
    return args.get("p") == 0.0 or args.get("train") is False


def transparent(node) -> bool:
    """A node the matcher looks through: a cast, alias, copy or a dropout that does nothing."""
    if not (isinstance(node, fx.Node) and node.op == "call_function"):
        return False
    name = _opname(node.target)
    if name not in _TRANSPARENT:
        return False
    if name == "dropout":
        return _is_noop_dropout(node)
    v = cap.val(node)
    src = node.args[0] if node.args else None
    sv = cap.val(src)
    # a cast keeps the shape; a float<->int cast changes the value: not transparent
    return (isinstance(v, torch.Tensor) and isinstance(sv, torch.Tensor) and v.shape == sv.shape
            and v.is_floating_point() == sv.is_floating_point())


def _widening(node) -> bool:
    """A transparent cast to a float type at least as wide as its input's."""
    if not transparent(node) or _opname(node.target) == "dropout":
        return False
    v, sv = cap.val(node), cap.val(node.args[0])
    return (v.is_floating_point() and sv.is_floating_point()
            and torch.finfo(v.dtype).bits >= torch.finfo(sv.dtype).bits)


def _rank(node) -> int | None:
    v = cap.val(node)
    return v.dim() if isinstance(v, torch.Tensor) else None


def _size_of(node, dim):
    v = cap.val(node)
    if isinstance(v, torch.Tensor) and isinstance(dim, int) and -v.dim() <= dim < v.dim():
        return int(v.shape[dim])
    return None


# ---- patterns ---------------------------------------------------------------------------------

@dataclass
class Pattern:
    family: str
    spelling: Spelling
    gm: fx.GraphModule
    output: fx.Node                       # the node the spelling returns
    arg_of: dict                          # placeholder node -> spelling argument name
    sentinels: dict                       # sentinel value -> capture name
    size: int                             # ops in the pattern

    @property
    def name(self) -> str:
        return f"{self.family}/{self.spelling.name}"


_SENTINEL_F = 0.0017320508     # unusual values: no model constant is equal to one of these
_SENTINEL_I = 7919


def _example(spelling: Spelling):
    gen = torch.Generator().manual_seed(0)
    tensors, scalars, sentinels = [], {}, {}
    k = 0
    for name, a in spelling.args:
        if isinstance(a, T):
            if a.dtype == "bool":
                t = torch.rand(a.shape, generator=gen) > 0.5
            elif a.dtype.startswith("int"):
                t = torch.randint(0, 2, a.shape, generator=gen, dtype=getattr(torch, a.dtype))
            else:
                t = torch.randn(a.shape, generator=gen, dtype=getattr(torch, a.dtype))
            tensors.append((name, t))
        elif isinstance(a, Scalar):
            v = (_SENTINEL_I + k) if a.kind == "int" else _SENTINEL_F * (1 + 0.01 * k)
            k += 1
            scalars[name] = v
            sentinels[v] = a.name
        else:
            scalars[name] = a
    return tensors, scalars, sentinels


class _Spelled(nn.Module):
    def __init__(self, spelling, names, scalars):
        super().__init__()
        self.fn, self.names, self.scalars, self.order = spelling.fn, names, scalars, [n for n, _ in spelling.args]

    def forward(self, *tensors):
        kw = dict(zip(self.names, tensors), **self.scalars)
        return self.fn(*[kw[n] for n in self.order])


def _make_fx(module, args):
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(module, pre_dispatch=True)(*args)


class _Canary(nn.Module):
    """Casts, a projection, softmax, a norm, dropout(p=0), SDPA, views: if make_fx and
    torch.export give these the same ops, spellings are traced with make_fx (20x faster)."""

    def forward(self, x, w, q, k, v):
        import torch.nn.functional as F
        y = F.linear(x.float(), w).to(x.dtype)
        s = torch.softmax(y, -1, dtype=torch.float32) + F.layer_norm(y, (8,)) + F.dropout(y, 0.0, False)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return s, o.transpose(1, 2).reshape(2, 4, -1), y.pow(2).mean(-1, keepdim=True).rsqrt()


_TRACER: list = []


def _tracer():
    """How spellings are traced: make_fx(pre_dispatch=True), when it yields the same IR as the
    torch.export road models take on this torch version, else torch.export itself."""
    if not _TRACER:
        args = tuple(torch.randn(s) for s in ((4, 8), (8, 8), (2, 2, 4, 8), (2, 2, 4, 8), (2, 2, 4, 8)))
        try:
            a = _make_fx(_Canary(), args)
            b = cap.export_graph(_Canary(), args)
            ops = lambda g: [canon(n.target) for n in g.graph.nodes  # noqa: E731
                             if n.op == "call_function" and _opname(n.target) not in cap._DROP]
            same = ops(a) == ops(b)
        except Exception:
            same = False
        _TRACER.append(_make_fx if same else (lambda m, a: cap.export_graph(m, a)))
    return _TRACER[0]


def trace(family: str, spelling: Spelling) -> Pattern:
    tensors, scalars, sentinels = _example(spelling)
    names = [n for n, _ in tensors]
    gm = _tracer()(_Spelled(spelling, names, scalars), tuple(t for _, t in tensors))
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = next(n for n in gm.graph.nodes if n.op == "output")
    ret = out.args[0]
    while isinstance(ret, (tuple, list)):
        ret = ret[0]
    gm = cap._clean(gm)
    size = sum(1 for n in gm.graph.nodes if n.op == "call_function" and not transparent(n))
    return Pattern(family, spelling, gm, ret, dict(zip(phs, names)), sentinels, size)


def _signature(p: Pattern) -> str:
    """The traced graph as text (ops, argument structure, loose names): equal for spellings that
    trace alike (a @ b at rank 2 and 3 both trace to aten.matmul here)."""
    names = {}
    lines = []
    for n in p.gm.graph.nodes:
        names[n] = f"v{len(names)}"
        if n.op == "call_function":
            args = [(k, names.get(v, repr(v)) if isinstance(v, fx.Node) else repr(v))
                    for k, v in norm_args(n)]
            lines.append(f"{canon(n.target)}{args}")
    return ";".join(lines) + repr(p.spelling.loose) + repr(p.spelling.free_dims)


_PATTERNS: list | None = None


def patterns() -> list[Pattern]:
    """Every family's spellings, traced once per process; biggest first (they claim nodes first)."""
    global _PATTERNS
    if _PATTERNS is None:
        out, seen = [], set()
        for fam in kernels.all_families():
            for sp in fam.spellings:
                pat = trace(fam.name, sp)
                sig = (fam.name, _signature(pat))
                if sig not in seen:          # a spelling this IR traces like another one
                    seen.add(sig)
                    out.append(pat)
        order = {n: i for i, n in enumerate(kernels.FAMILY_NAMES)}
        out.sort(key=lambda p: (-p.size, order[p.family]))
        _PATTERNS = out
    return _PATTERNS


# ---- constants ----------------------------------------------------------------------------------

class Folder:
    """Values of nodes that depend on nothing but the model's constants (parameters, buffers,
    literals): a causal mask built from a buffer or from arange, rotary tables, a scale."""

    def __init__(self, graph: cap.Graph):
        self.graph = graph
        self.memo: dict = {}
        self.tainted = _mutated(graph.gm.graph)
        # what reads a runtime input, in one pass in graph order: value() never recurses
        # through it (ResNet-101's chain of ~1,000 ops from the image exceeded Python's
        # recursion limit when a pattern asked whether its last value was a constant)
        self.runtime: set = set()
        for n in graph.gm.graph.nodes:
            if (n.op == "placeholder" and graph.static.get(n.target) is None) or any(
                    a in self.runtime for a in n.all_input_nodes):
                self.runtime.add(n)

    def value(self, node):
        if not isinstance(node, fx.Node):
            return node
        if node in self.runtime:
            return None
        if node in self.memo:
            return self.memo[node]
        self.memo[node] = None                     # cycles cannot happen; recursion guard
        v = self._eval(node)
        self.memo[node] = v
        return v

    def _eval(self, node):
        if node in self.tainted:
            return None                   # written in place somewhere: its traced value is not it
        if node.op == "get_attr":
            obj = self.graph.gm
            for part in node.target.split("."):
                obj = getattr(obj, part, None)
                if obj is None:
                    return None
            return obj.detach() if isinstance(obj, torch.Tensor) else obj
        if node.op == "placeholder":
            t = self.graph.static.get(node.target)
            return t.detach() if t is not None else None
        if node.op != "call_function":
            return None
        name = _opname(node.target) or ""
        if name in _RANDOM or (name == "dropout" and not _is_noop_dropout(node)):
            return None
        v = cap.val(node)
        if isinstance(v, torch.Tensor) and v.numel() > _FOLD_LIMIT:
            return None
        missing = []

        def sub(a):
            if isinstance(a, fx.Node):
                r = self.value(a)
                if r is None:
                    missing.append(a)
                return r
            if isinstance(a, (list, tuple)):
                return type(a)(sub(x) for x in a)
            return a
        args = [sub(a) for a in node.args]
        kwargs = {k: sub(a) for k, a in node.kwargs.items()}
        if missing:
            return None
        try:
            with torch.no_grad():
                return node.target(*args, **kwargs)
        except Exception:
            return None


def aliases(node) -> list:
    """The nodes that are ``node``'s value again: casts and aliases of it that change neither
    dtype nor shape (HF's norm's .to(float32) on an fp32 model: export hands that node, not
    the sum, to every later reader of the same tensor), transitively."""
    out, todo = [], [node]
    want = cap.val(node)
    while todo:
        n = todo.pop()
        for u in n.users:
            v = cap.val(u)
            # of n itself, not of another value cast like n (type_as(y, n) is y's)
            if (transparent(u) and u.args and u.args[0] is n and u not in out
                    and isinstance(v, torch.Tensor)
                    and isinstance(want, torch.Tensor) and v.dtype == want.dtype
                    and tuple(v.shape) == tuple(want.shape)):
                out.append(u)
                todo.append(u)
    return out


def _is_view(node) -> bool:
    t = node.target
    if t is operator.getitem:
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return False
    rets = t._schema.returns
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def _mutated(graph: fx.Graph) -> set:
    """Nodes whose memory some op of the graph writes in place (``m[0, 3] = True`` on a fresh
    tensor, a buffer updated by ``copy_``), with every view of them: their values are not what
    the node computed when it ran, so they are never folded."""
    roots = set()
    for n in graph.nodes:
        if (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                and n.target._schema.is_mutable and n.args and isinstance(n.args[0], fx.Node)):
            r = n.args[0]
            while r.op == "call_function" and _is_view(r) and isinstance(r.args[0], fx.Node):
                r = r.args[0]
            roots.add(r)
    if not roots:
        return set()
    tainted = set(roots)
    for n in graph.nodes:              # graph order: a view's source comes first
        if n.op == "call_function" and _is_view(n) and n.args and n.args[0] in tainted:
            tainted.add(n)
    return tainted


# ---- matches ------------------------------------------------------------------------------------

@dataclass
class Match:
    family: str
    pattern: str
    graph: cap.Graph
    output: fx.Node
    nodes: list                            # matched nodes in graph order (the output last)
    inputs: dict                           # spelling argument name -> node or literal
    captures: dict                         # Scalar name -> value (node or number); "dims"
    folder: Folder = field(repr=False, default=None)
    extra: list = field(default_factory=list)   # input upcasts other ops read too (probe only)
    through: list = field(default_factory=list)  # nodes from_match looked through (rebind)
    order: dict = field(default_factory=dict, repr=False)  # graph node -> position (find's)
    fit: Fit | None = None
    why_not: str = ""                      # recognized, but no contract serves it
    probe: str = ""                        # what the probe found

    # helpers for kernels/<family>.py from_match ------------------------------------------------
    def node(self, name):
        """What the spelling argument (or loose op argument) ``name`` is bound to."""
        return self.inputs[name] if name in self.inputs else self.captures.get(name)

    def meta(self, name) -> dict | None:
        return cap.tensor_meta(self.node(name))

    def out_meta(self) -> dict | None:
        return cap.tensor_meta(self.output)

    def const(self, name):
        """The input's value when it is a constant of the model (a buffer, or computed from
        them), else None."""
        return self.folder.value(self.node(name))

    def rebind(self, name, node, through=()):
        """Bind ``name`` to ``node`` upstream of what the spelling bound (e.g. a key before its
        grouped-query expansion); the ``through`` nodes in between join the match when nothing
        else reads them."""
        self.inputs[name] = node
        self.through.extend(through)

    def swapped_last(self, name):
        """The node whose last two dims ``name`` swaps (a k.transpose(-2, -1) feeding q @ k^T),
        or None."""
        n = self.node(name)
        if not (isinstance(n, fx.Node) and n.op == "call_function"):
            return None
        if _opname(n.target) == "transpose":
            r = _rank(n)
            d = _dims([n.args[1], n.args[2]], r, "transpose")
            return n.args[0] if d == (-2, -1) else None
        if _opname(n.target) == "permute":
            r = _rank(n)
            perm = list(n.args[1])
            want = list(range(r - 2)) + [r - 1, r - 2]
            return n.args[0] if [p % r for p in perm] == want else None
        return None

    def head_repeat(self, node):
        """(source, rep, nodes between) when ``node`` repeats each of the source's heads (dim 1
        of [B, Hkv, S, D]) rep times in a row: repeat_interleave(k, rep, dim=1), or HF's
        repeat_kv: k[:, :, None].expand(B, Hkv, rep, S, D).reshape(B, Hkv * rep, S, D);
        else (node, 1, [])."""
        n = node
        if not (isinstance(n, fx.Node) and n.op == "call_function"):
            return node, 1, []
        name = _opname(n.target)
        if name == "repeat_interleave":
            args = dict(norm_args(n))
            rep, dim = args.get("repeats"), args.get("dim")
            src = n.args[0]
            r = _rank(src)
            if isinstance(rep, int) and isinstance(dim, int) and r == 4 and dim % 4 == 1:
                return src, rep, [n]
            return node, 1, []
        if name in ("reshape", "view", "_unsafe_view"):
            e = n.args[0]
            while isinstance(e, fx.Node) and transparent(e):
                e = e.args[0]
            if not (isinstance(e, fx.Node) and _opname(e.target) == "expand"):
                return node, 1, []
            u = e.args[0]
            if not (isinstance(u, fx.Node) and _opname(u.target) in ("unsqueeze", "slice", "view",
                                                                     "reshape", "index")):
                return node, 1, []
            ev, uv = cap.val(e), cap.val(u)
            if ev is None or uv is None or ev.dim() != 5 or uv.dim() != 5:
                return node, 1, []
            b, hkv, rep, sq, d = (int(x) for x in ev.shape)
            if tuple(int(x) for x in uv.shape) != (b, hkv, 1, sq, d):
                return node, 1, []
            src = u.args[0] if _opname(u.target) == "unsqueeze" else None
            if src is None or _rank(src) != 4 or dict(norm_args(u)).get("dim") % 5 != 2:
                return node, 1, []
            out = cap.val(n)
            if tuple(int(x) for x in out.shape) != (b, hkv * rep, sq, d):
                return node, 1, []
            return src, rep, [n, e, u]
        return node, 1, []

    def sum_of(self, name):
        """(a, b, add) when the input ``name`` is bound to a + b (aten add, alpha 1) of two
        tensors with the sum's shape and dtype, or to a view of that sum keeping its last dim
        that alone reads it (OPT's blocks flatten the residual stream to [B*S, D] between the
        add and the norm; a and b are then read through the same reshape), and the sum's
        readers outside the match all come after the match's output in the graph: a residual
        add the matched kernel can compute, handing the sum to those readers
        (kernels/patterns.py ``Fit.outputs``); ``add`` is the add node where a view is between
        (it joins the match), else None. Else None."""
        n = self.node(name)
        add = None
        if (isinstance(n, fx.Node) and n.op == "call_function"
                and _opname(n.target) in ("view", "reshape", "_unsafe_view")
                and isinstance(n.args[0], fx.Node) and n.args[0].op == "call_function"
                and _opname(n.args[0].target) == "add" and list(n.args[0].users) == [n]):
            v, sv = cap.val(n), cap.val(n.args[0])
            if (isinstance(v, torch.Tensor) and isinstance(sv, torch.Tensor) and v.dim() >= 1
                    and sv.dim() >= 1 and v.shape[-1] == sv.shape[-1]):
                add = n.args[0]
        src = add if add is not None else n
        if not (isinstance(src, fx.Node) and src.op == "call_function" and _opname(src.target) == "add"):
            return None
        args = dict(norm_args(src))
        a, b = args.get("self"), args.get("other")
        if args.get("alpha", 1) != 1 or not all(isinstance(t, fx.Node) for t in (a, b)):
            return None
        want = cap.val(src)
        for t in (a, b):
            v = cap.val(t)
            if not (isinstance(v, torch.Tensor) and isinstance(want, torch.Tensor)
                    and v.dtype == want.dtype and tuple(v.shape) == tuple(want.shape)):
                return None
        order = self.order or {x: i for i, x in enumerate(self.graph.gm.graph.nodes)}
        same = [n] + aliases(n)
        inside = set(self.nodes) | set(same)
        if any(u not in inside and order[u] < order[self.output] for x in same for u in x.users):
            return None            # read before the kernel would run: the sum must stay its own
        return a, b, add

    def _constant(self, a):
        """A number an operand holds: a literal, or a node the folder reduces to a one-element
        constant; else None."""
        v = self.folder.value(a) if isinstance(a, fx.Node) else a
        if isinstance(v, torch.Tensor):
            v = v.item() if v.numel() == 1 else None
        return v if isinstance(v, (int, float, bool)) else None

    def _number(self, a):
        """``_constant`` as a float (a bool is no number here)."""
        v = self._constant(a)
        return float(v) if v is not None and not isinstance(v, bool) else None

    def _head_scale(self, n):
        """(x, s) when ``n`` is x * s, s * x or x / d (s = 1/d) for a finite nonzero number."""
        op = _opname(n.target)
        if op not in ("mul", "div") or len(n.args) != 2:
            return None
        a, b = n.args
        nb = self._number(b)
        if op == "div":
            x, s = a, (1.0 / nb if nb not in (None, 0.0) else None)
        elif nb is not None:
            x, s = a, nb
        else:
            x, s = b, self._number(a)
        if s is None or not math.isfinite(s) or s == 0.0 or not isinstance(x, fx.Node):
            return None
        return x, s

    def _head_bias(self, n, width):
        """(l, b) when ``n`` is l + b (alpha 1) for b a node holding [V] values ([V] or
        [1, .., 1, V]) in l's dtype, V = ``width``."""
        args = dict(norm_args(n))
        if args.get("alpha", 1) != 1:
            return None
        for l, b in ((args.get("self"), args.get("other")), (args.get("other"), args.get("self"))):
            lv, bv = cap.val(l), cap.val(b)
            if (isinstance(l, fx.Node) and isinstance(b, fx.Node) and isinstance(lv, torch.Tensor)
                    and isinstance(bv, torch.Tensor) and bv.dim() >= 1 and bv.numel() == width
                    and int(bv.shape[-1]) == width and bv.dtype == lv.dtype
                    and tuple(lv.shape) == tuple(cap.val(n).shape)):
                return l, b
        return None

    def linear_of(self, name):
        """An LM head whose logits only the loss reads, which the kernel can compute itself:
        ``name`` is c * tanh(s * (x @ w^T + b) / c) (aten linear, or mm / matmul of x by a 2-D w
        transposed; the bias b [V], the scale s and the soft cap c each optional: Phi and GPT-J
        heads have a bias, BART adds one to the head's output, Cohere and Granite scale their
        logits, Gemma 2 caps them), reached
        through reshapes that keep the last dim and widening casts, every node from the layer on
        read by this match alone. Returns (x, w, nodes between, upcast, {"bias": node or None,
        "scale": float or None, "softcap": float or None}) (upcast: the logits reach the loss
        as float32 from a narrower dtype), else None."""
        n = self.node(name)
        want = cap.val(n)
        if not isinstance(want, torch.Tensor) or want.dim() < 1:
            return None
        width = int(want.shape[-1])
        chain = []
        extra = {"bias": None, "scale": None, "softcap": None}
        while isinstance(n, fx.Node) and n.op == "call_function":
            op = _opname(n.target)
            v = cap.val(n)
            if not isinstance(v, torch.Tensor) or v.dim() < 1 or int(v.shape[-1]) != width:
                return None
            if op in ("view", "reshape", "_unsafe_view", "flatten") or (transparent(n) and op != "dropout"):
                if transparent(n) and not _widening(n):
                    return None
                chain.append(n)
                n = n.args[0]
                continue
            # walking back, the kernel's order reversed: a soft cap c * tanh(l / c) (applied
            # last), a scale, an added bias; one met out of that order ends the walk
            outer = self._head_scale(n) if op in ("mul", "div") else None
            if outer and all(v is None for v in extra.values()):
                th = outer[0]
                inner = (self._head_scale(th.args[0]) if th.op == "call_function"
                         and _opname(th.target) == "tanh" and isinstance(th.args[0], fx.Node)
                         and th.args[0].op == "call_function" else None)
                if inner and outer[1] > 0 and abs(inner[1] * outer[1] - 1.0) <= 1e-6:
                    extra["softcap"] = outer[1]
                    chain += [n, th, th.args[0]]
                    n = inner[0]
                    continue
            if outer and outer[1] == 1.0:   # times or over 1 (Granite's default logits_scaling)
                chain.append(n)
                n = outer[0]
                continue
            if outer and extra["scale"] is None and extra["bias"] is None:
                extra["scale"] = outer[1]
                chain.append(n)
                n = outer[0]
                continue
            # l + b, b a [V] (or [1, .., V]) tensor of l's dtype: BART's final_logits_bias
            term = self._head_bias(n, width) if op == "add" and extra["bias"] is None else None
            if term:
                extra["bias"] = term[1]
                chain.append(n)
                n = term[0]
                continue
            break
        else:
            return None
        layer = _layer(n, width)
        if layer is None:
            return None
        x, w, b, wt = layer
        if b is not None:
            if extra["bias"] is not None:
                return None                # two biases (the layer's and an add): not one head
            extra["bias"] = b
        chain += wt + [n]
        inside = set(self.nodes) | set(chain)
        if any(u not in inside for c in chain for u in c.users):
            return None            # the logits (or a view of them) are read elsewhere too
        upcast = want.dtype == torch.float32 and cap.val(n).dtype != torch.float32
        return x, w, chain, upcast, extra

    def projection_of(self, name, heads_first: bool = True):
        """A q or k projection with its heads split out (and moved forward), which a rotation's
        kernel can compute itself: ``name`` [B, H, S, Dh] is linear(x, w, b) [B, S, H*Dh] (or
        [B*S, H*Dh]; aten linear, or mm / matmul of x by a 2-D w transposed; the bias
        optional) viewed as [B, S, H, Dh] and transposed (1, 2) (transformers' LLaMA, Mistral,
        Qwen2, Gemma: ``q_proj(h).view(B, S, -1, Dh).transpose(1, 2)``); with ``heads_first``
        False ``name`` is the [B, S, H, Dh] view itself (Meta's LLaMA, gpt-fast, GPT-J rotate
        before the heads move). Every node from the layer on is read by this match alone.
        Returns (x, w, b or None, nodes between), else None."""
        n = self.node(name)
        v = cap.val(n)
        if not (isinstance(v, torch.Tensor) and v.dim() == 4 and isinstance(n, fx.Node)
                and n.op == "call_function"):
            return None
        chain = []
        if heads_first:
            b_, h_, s_, dh = (int(d) for d in v.shape)
            op = _opname(n.target)
            args = dict(norm_args(n))
            if op == "transpose":
                if {args.get("dim0") % 4, args.get("dim1") % 4} != {1, 2}:
                    return None
            elif op != "permute" or [d % 4 for d in args.get("dims", ())] != [0, 2, 1, 3]:
                return None
            chain = [n]
            n = n.args[0]
        else:
            b_, s_, h_, dh = (int(d) for d in v.shape)
        while (isinstance(n, fx.Node) and n.op == "call_function"
               and _opname(n.target) in ("view", "reshape", "_unsafe_view")):
            chain.append(n)
            n = n.args[0]
        lv = cap.val(n)
        if not (isinstance(n, fx.Node) and n.op == "call_function" and isinstance(lv, torch.Tensor)
                and lv.dim() in (2, 3) and lv.numel() == b_ * h_ * s_ * dh and lv.is_contiguous()
                and int(lv.shape[-1]) == h_ * dh and (lv.dim() == 2 or tuple(lv.shape[:2]) == (b_, s_))):
            return None
        layer = _layer(n, h_ * dh)
        if layer is None:
            return None
        x, w, b, wt = layer
        chain += wt + [n]
        inside = set(self.nodes) | set(chain)
        if any(u not in inside for c in chain for u in c.users):
            return None            # q (or a view of it) is read elsewhere too
        return x, w, b, chain

    def scalar(self, name):
        """A captured number (a literal, or a constant 0-d tensor), else None."""
        return self._constant(self.captures.get(name, self.inputs.get(name)))

    def op_args(self, opname: str) -> dict:
        """The arguments (schema names, defaults filled) of the matched op called ``opname``."""
        for n in self.nodes:
            if _opname(n.target) == opname:
                return dict(norm_args(n))
        raise KeyError(opname)

    @property
    def placeable(self) -> bool:
        return self.fit is not None and not self.why_not

    def describe(self) -> str:
        return f"{self.pattern} at {self.output.name}"


def _layer(n, width: int):
    """(x, w, bias or None, [the transpose of w where one is between]) when ``n`` computes
    x @ w^T (+ bias) of width ``width`` in x's dtype: aten linear, or mm / matmul of x by a 2-D
    w transposed (t, transpose, permute); else None."""
    if not (isinstance(n, fx.Node) and n.op == "call_function"):
        return None
    op = _opname(n.target)
    args = dict(norm_args(n))
    b, wt = None, []
    if op == "linear":
        x, w = args.get("input"), args.get("weight")
        b = args.get("bias")
        if b is not None and not (isinstance(b, fx.Node) and _rank(b) == 1
                                  and int(cap.val(b).shape[0]) == width
                                  and cap.val(b).dtype == cap.val(n).dtype):
            return None
    elif op in ("mm", "matmul"):
        x, t, w = args.get("self"), args.get("other"), None
        if isinstance(t, fx.Node) and t.op == "call_function" and _rank(t) == 2:
            top = _opname(t.target)
            targs = dict(norm_args(t))
            swap = (top in ("t", "numpy_T") or top == "transpose" and {targs.get("dim0") % 2, targs.get("dim1") % 2} == {0, 1}
                    or top == "permute" and [d % 2 for d in targs.get("dims", ())] == [1, 0])
            if swap:
                w = t.args[0]
                wt = [t]
    else:
        return None
    if not (isinstance(x, fx.Node) and isinstance(w, fx.Node) and _rank(w) == 2):
        return None
    xv, wv, lv = cap.val(x), cap.val(w), cap.val(n)
    if not (isinstance(xv, torch.Tensor) and xv.dim() >= 1 and tuple(wv.shape) == (width, xv.shape[-1])
            and xv.dtype == wv.dtype == lv.dtype and lv.is_floating_point()):
        return None
    return x, w, b, wt


class _State:
    def __init__(self):
        self.env: dict = {}        # pattern placeholder -> bound value
        self.map: dict = {}        # pattern node -> target node
        self.caps: dict = {}       # capture name -> value
        self.inner: list = []      # target nodes looked through between spelled ops
        self.casts: list = []      # upcasts looked through in front of inputs

    def save(self):
        return dict(self.env), dict(self.map), dict(self.caps), list(self.inner), list(self.casts)

    def load(self, s):
        self.env, self.map, self.caps = dict(s[0]), dict(s[1]), dict(s[2])
        self.inner, self.casts = list(s[3]), list(s[4])


_REPLAYS = 16                      # whole-pattern retries with a commutative choice forced


class _Matcher:
    def __init__(self, pattern: Pattern):
        self.p = pattern
        self._ops: dict = {}       # pattern node -> ops in its subtree (visit order)
        self._script: tuple = ()   # forced orders (0 spelled, 1 swapped) by choice point
        self._chosen: list = []    # the order each choice point took in this try (None: failed)
        self._open: list = []      # choice points that held as spelled, their swap untried

    def _size(self, v) -> int:
        """Ops under a pattern argument: the most constrained arguments are matched first, so
        an input is bound through the structure around it (rotate_half(x)) before a bare
        operand of a commutative op (cos * x against x * cos) would bind it the wrong way."""
        if not isinstance(v, fx.Node) or v.op != "call_function":
            return 0
        if v not in self._ops:
            self._ops[v] = 1 + sum(self._size(a) for a in v.args if isinstance(a, fx.Node))
        return self._ops[v]

    def run(self, t: fx.Node) -> _State | None:
        """The pattern at ``t``, or None. A commutative op's operands are tried in the
        spelled order, then swapped, greedily; when the whole match then fails, it is tried
        again with one of the choices that held locally (the spelled order) forced the other
        way (cos[:, :h] * x[..., :h] against x1 * cos: both operands slices), depth first,
        at most _REPLAYS times."""
        todo = [()]
        for _ in range(_REPLAYS):
            if not todo:
                break
            self._script, self._chosen, self._open = todo.pop(), [], []
            st = _State()
            if self._node(self.p.output, t, st, top=True):
                return st
            forced = len(self._script)
            todo.extend(tuple(self._chosen[:k]) + (1,) for k in reversed(self._open) if k >= forced)
        return None

    # a pattern node against a target value
    def _node(self, p, t, st: _State, top=False) -> bool:
        if p.op == "placeholder":
            name = self.p.arg_of[p]
            # look through upcasts in front of an input: the kernel computes in fp32 anyway;
            # the casts stay in the graph (other ops may read them) but join the probe's region
            while isinstance(t, fx.Node) and _widening(t):
                st.casts.append(t)
                t = t.args[0]
            if name in st.env:
                return _same(st.env[name], t)
            st.env[name] = t
            return True
        if p.op != "call_function" or not isinstance(t, fx.Node):
            return False
        if p in st.map:
            return st.map[p] is t
        key = canon(p.target)
        if transparent(p) and (t.op != "call_function" or canon(t.target) != key):
            return self._node(p.args[0], t, st)          # a cast the spelling has and the model not
        skipped = []
        while t.op != "call_function" or canon(t.target) != key:
            if not transparent(t):
                return False
            skipped.append(t)
            t = t.args[0]
            if not isinstance(t, fx.Node):
                return False
        if _opname(p.target) == "dropout" and not _is_noop_dropout(t):
            return False
        pargs, targs = norm_args(p), norm_args(t)
        if len(pargs) != len(targs):
            return False
        orders = [list(range(len(pargs)))]
        name = _opname(p.target)
        if name in _COMMUTATIVE and len(pargs) >= 2:
            orders.append([1, 0] + list(range(2, len(pargs))))
        visit = sorted(range(len(pargs)), key=lambda i: -self._size(pargs[i][1]))
        point, force, tries = None, None, range(len(orders))
        if len(orders) == 2:                      # a choice point: numbered in visit order
            point = len(self._chosen)
            self._chosen.append(None)
            force = self._script[point] if point < len(self._script) else None
            tries = (force,) if force is not None else tries
        saved = st.save()
        for o in tries:
            st.load(saved)
            st.map[p] = t
            st.inner.extend(skipped)
            if all(self._arg(p, t, pargs[i], targs[orders[o][i]], st, name) for i in visit):
                if point is not None:
                    self._chosen[point] = o
                    if force is None and o == 0:  # held as spelled: the swap is still untried
                        self._open.append(point)
                return True
        st.load(saved)
        return False

    def _arg(self, p, t, pa, ta, st, opname) -> bool:
        pname, pv = pa
        _, tv = ta
        if pname in self.p.spelling.loose:
            if pname in st.caps:
                return _same(st.caps[pname], tv)
            st.caps[pname] = tv
            return True
        if isinstance(pv, fx.Node):
            return self._node(pv, tv, st)
        if isinstance(pv, (list, tuple)) and any(isinstance(x, fx.Node) for x in pv):
            if not isinstance(tv, (list, tuple)) or len(pv) != len(tv):
                return False
            return all((self._node(a, b, st) if isinstance(a, fx.Node) else _lit_eq(a, b))
                       for a, b in zip(pv, tv))
        if isinstance(pv, (int, float)) and not isinstance(pv, bool) and pv in self.p.sentinels:
            cname = self.p.sentinels[pv]
            if cname in st.caps:
                return _same(st.caps[cname], tv)
            if isinstance(tv, fx.Node) and not _scalar_like(tv):
                return False
            if tv is not None and (not isinstance(tv, (int, float, fx.Node)) or isinstance(tv, bool)):
                return False
            st.caps[cname] = tv
            return True
        if isinstance(pv, torch.dtype) or isinstance(tv, torch.dtype):
            return True                            # dtypes: the output check decides
        if pname in _SIZE_ARGS:
            return True
        if pname in _DIM_ARGS:
            prank = _dim_rank(p, opname)
            trank = _dim_rank(t, opname)
            if prank is None or trank is None:
                return _lit_eq(pv, tv)
            pd, td = _dims(pv, prank, opname), _dims(tv, trank, opname)
            if pd is None or td is None:
                return _lit_eq(pv, tv)
            if self.p.spelling.free_dims and opname in _REDUCTIONS:
                if "dims" in st.caps:
                    return st.caps["dims"] == td
                st.caps["dims"] = td
                return True
            return pd == td
        if pname in _BOUND_ARGS:
            return _bound(p, pv) == _bound(t, tv)
        return _lit_eq(pv, tv)


def _scalar_like(node) -> bool:
    v = cap.val(node)
    return isinstance(v, (int, float, torch.SymInt, torch.SymFloat)) or (
        isinstance(v, torch.Tensor) and v.numel() == 1)


def _same(a, b) -> bool:
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        return a is b
    return _lit_eq(a, b)


def _lit_eq(a, b) -> bool:
    if a is _MISSING or b is _MISSING:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b):
            return a == b or (math.isnan(a) and math.isnan(b))
        return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_lit_eq(x, y) for x, y in zip(a, b))
    return a == b


def _dim_rank(node, opname) -> int | None:
    src = node.args[0] if node.args else None
    if opname == "cat" and isinstance(src, (list, tuple)) and src:
        src = src[0]
    r = _rank(src)
    if r is None:
        return None
    return r + 1 if opname in ("unsqueeze", "stack") else r


def _dims(v, rank, opname):
    if v is None or rank == 0:
        return ("all",) if v is None else None
    if isinstance(v, int):
        d = v - rank if v >= 0 else v
        return (d,)
    if isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v):
        ds = [x - rank if x >= 0 else x for x in v]
        return tuple(ds) if opname == "permute" else tuple(sorted(ds))
    return None


def _bound(node, b):
    """A slice bound as a small offset from the start or the end, or a fraction of the dim."""
    if b is None:
        return None
    args = dict(norm_args(node))
    size = _size_of(node.args[0], args.get("dim", 0))
    if size is None or not isinstance(b, int):
        return ("abs", b)
    b = max(0, min(size, b + size if b < 0 else b))
    if 2 * b == size:           # a half, at any width (rotate-half of a 4-wide partial rotary)
        return ("frac", 0.5)
    if b < 4:
        return ("abs", b)
    if size - b < 4:
        return ("end", size - b)
    return ("frac", b / size)


# ---- finding -------------------------------------------------------------------------------------

def _users_inside(nodes: set, output) -> bool:
    for n in nodes:
        if n is output:
            continue
        for u in n.users:
            if u not in nodes:
                return False
    return True


def _absorb_tail(output: fx.Node, nodes: set) -> fx.Node:
    """Casts and aliases right after the output join the match (HF norms cast back to bf16)."""
    while len(output.users) == 1:
        u = next(iter(output.users))
        if not transparent(u):
            break
        nodes.add(u)
        output = u
    return output


def find(graph: cap.Graph, pats: list[Pattern] | None = None, probe: bool = True,
         families=None) -> list[Match]:
    """Every family match in ``graph``, non-overlapping, in graph order. Matches whose family
    contract cannot serve them carry ``why_not``; decoys are not returned. ``families``: only
    those families' patterns (a run asked for softmax alone finds the softmax inside a
    hand-written attention, which the attention pattern would otherwise claim)."""
    pats = patterns() if pats is None else pats
    if families is not None:
        pats = [p for p in pats if p.family in set(families)]
    folder = Folder(graph)
    order = {n: i for i, n in enumerate(graph.gm.graph.nodes)}
    claimed: set = set()
    found: list[Match] = []
    by_key: dict = {}
    for n in graph.gm.graph.nodes:
        if n.op == "call_function":
            by_key.setdefault(canon(n.target), []).append(n)
    for pat in pats:
        anchors = by_key.get(canon(pat.output.target), [])
        for t in anchors:
            if t in claimed:
                continue
            st = _Matcher(pat).run(t)
            if st is None:
                continue
            nodes = set(st.map.values()) | set(st.inner)
            if nodes & claimed:
                continue
            out = _absorb_tail(t, nodes)
            if not _users_inside(nodes, out):
                continue
            # an input's upcast read only by the match belongs to it (it dies with it)
            casts = set(st.casts)
            for c in sorted(casts, key=order.get, reverse=True):
                if c not in claimed and all(u in nodes for u in c.users):
                    nodes.add(c)
            m = Match(pat.family, pat.name, graph, out, sorted(nodes, key=order.get),
                      st.env, st.caps, folder, extra=sorted(casts - nodes, key=order.get),
                      order=order)
            fam = kernels.get(pat.family)
            try:
                m.fit = fam.from_match(m) if fam.from_match else None
            except NoFit as e:
                m.why_not = str(e)
                m.fit = None
            if m.fit is None and not m.why_not:
                continue                                  # a decoy: looks like it, is not it
            if m.fit is not None and m.fit.outputs:
                also = [m.node(name) for name, _ in m.fit.outputs]
                if any(n in claimed for n in also):
                    # another match computes it (a second norm of the same sum): this one
                    # reads it as it is, under its plain contract
                    if m.fit.fallback is None:
                        continue
                    m.fit = m.fit.fallback
                else:
                    nodes.update(also)    # computed by the kernel, read beside it (Fit.outputs)
                    nodes.update(a for n in also for a in aliases(n))
            for n in sorted(set(m.through), key=order.get, reverse=True):
                if n not in claimed and all(u in nodes for u in n.users):
                    nodes.add(n)                          # read only by the match (a GQA expansion)
            m.nodes = sorted(nodes, key=order.get)
            if m.fit is not None and probe:
                bad = probe_match(m)
                if bad:
                    if bad.startswith("disagree"):
                        continue                          # not the family after all
                    m.probe = bad
                else:
                    m.probe = "agrees with the family reference"
            claimed |= nodes
            found.append(m)
    found.sort(key=lambda m: order[m.output])
    return found


# ---- regions and probes -----------------------------------------------------------------------------

def region(m: Match) -> tuple[fx.GraphModule, list[str]]:
    """The matched subgraph as a GraphModule of its node inputs (names returned in order)."""
    g = fx.Graph()
    env = {}
    names = []
    order = {n: i for i, n in enumerate(m.graph.gm.graph.nodes)}
    body = sorted(set(m.nodes) | set(m.extra) | set(m.through), key=order.get)
    inside = set(body)
    for n in body:
        for a in n.all_input_nodes:
            if a not in inside and a not in env:
                env[a] = g.placeholder(f"in_{len(names)}")
                names.append(a)
        env[n] = g.node_copy(n, lambda x: env[x])
    g.output(env[m.output])
    return fx.GraphModule(m.graph.gm, g), names


def _random_like(node, gen):
    v = cap.val(node)
    if not isinstance(v, torch.Tensor):
        return None
    shape, dtype, dev = tuple(v.shape), v.dtype, v.device
    if dtype == torch.bool:
        t = torch.rand(shape, generator=gen) > 0.5
    elif dtype.is_complex:                          # rotary's freqs_cis (cos + i sin)
        t = torch.randn(shape, generator=gen, dtype=dtype)
    elif not dtype.is_floating_point:
        t = torch.randint(0, 2, shape, generator=gen, dtype=dtype)
    else:
        t = torch.randn(shape, generator=gen, dtype=torch.float32)
    t = t.to(device=dev, dtype=dtype)
    zero = [d for d in range(v.dim()) if v.stride(d) == 0 and shape[d] > 1]
    if zero:
        # an expanded view (a padding mask broadcast over the queries): one random row per
        # broadcast dim, expanded again, so the probe's input has the values the graph can have
        return t[tuple(slice(0, 1) if d in zero else slice(None) for d in range(v.dim()))].expand(shape)
    if tuple(v.stride()) != tuple(t.stride()) and v.numel() > 0:
        try:
            t = torch.empty_strided(shape, tuple(v.stride()), dtype=dtype, device=dev).copy_(t)
        except Exception:
            pass
    return t


def apply_views(t, views):
    for v in views:
        op, args = v[0], v[1:]
        t = VIEW_OPS[op](t, *args)
    return t


VIEW_OPS = {
    "t": lambda t: t.t(), "reshape": lambda t, s: t.reshape(s), "select": lambda t, d, i: t.select(d, i),
    "squeeze": lambda t, d: t.squeeze(d), "transpose": lambda t, a, b: t.transpose(a, b),
    "unsqueeze": lambda t, d: t.unsqueeze(d), "contiguous": lambda t: t.contiguous(),
    "to": lambda t, dtype: t.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype),
    "long": lambda t: t.long(), "expand": lambda t, s: t.expand(s),
    "slice": lambda t, d, a, b: t.narrow(d, a, b - a), "permute": lambda t, p: t.permute(p),
    "view_as_real": lambda t: torch.view_as_real(t),
    "repeat_interleave": lambda t, r, d: t.repeat_interleave(r, d),
    "repeat": lambda t, r: t.repeat(r),
}


def kernel_args(m: Match, values: dict) -> dict:
    """The family's keyword arguments for this match, from the values of its inputs."""
    out = {}
    for arg, ref in m.fit.args.items():
        if ref.name is None:
            out[arg] = ref.value
            continue
        v = values[ref.name]
        out[arg] = apply_views(v, ref.views) if isinstance(v, torch.Tensor) else v
    return out


def post_ops(m: Match, y, values: dict, views_only: bool = False):
    for op in m.fit.post:
        name, args = op[0], op[1:]
        if name == "add" and views_only:
            continue
        if name == "to" and views_only:
            continue
        if name == "add":
            b = args[0]
            y = y + (values[b.name] if isinstance(b, Ref) else b)
        else:
            y = VIEW_OPS[name](y, *args)
    return y


def _ref_names(m: Match) -> list:
    names = [r.name for r in m.fit.args.values() if isinstance(r, Ref) and r.name is not None]
    names += [op[1].name for op in m.fit.post if len(op) > 1 and isinstance(op[1], Ref)]
    return list(dict.fromkeys(names))


def probe_match(m: Match) -> str:
    """"" when the matched subgraph and the family's reference (under the match's spec) agree on
    random inputs (constants kept), "disagree: ..." when they do not, else why it was not run."""
    gm, names = region(m)
    metas = [cap.val(n) for n in names]
    if sum(v.numel() for v in metas if isinstance(v, torch.Tensor)) > PROBE_LIMIT:
        return "probe skipped: inputs too large to probe here"
    gen = torch.Generator().manual_seed(1234)
    vals = []
    for n in names:
        c = m.folder.value(n)
        vals.append(c if isinstance(c, torch.Tensor) else _random_like(n, gen))
    if any(v is None for v in vals):
        return "probe skipped: an input has no tensor value"
    by_node = dict(zip(names, vals))
    values = {}
    for k in _ref_names(m):
        n = m.node(k)
        if isinstance(n, fx.Node):
            values[k] = by_node[n] if n in by_node else m.folder.value(n)
            if values[k] is None:
                return f"probe skipped: input {k!r} has no value outside the match"
        else:
            values[k] = n
    fam = kernels.get(m.family, m.fit.spec or None)
    try:
        with torch.no_grad():
            want = gm(*vals)
            kw = kernel_args(m, values)
            f64 = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                   for k, v in kw.items()}
            ref = post_ops(m, fam.reference(**f64), {k: (v.double() if isinstance(v, torch.Tensor)
                                                           and v.is_floating_point() else v)
                                                      for k, v in values.items()})
            same = fam.reference(**kw)
    except Exception as e:
        return f"disagree: the family reference could not run on the match's inputs: " \
               f"{type(e).__name__}: {cap._one_line(e, 200)}"
    if not isinstance(want, torch.Tensor) or tuple(ref.shape) != tuple(want.shape):
        return (f"disagree: shapes {tuple(ref.shape)} (family) vs "
                f"{tuple(getattr(want, 'shape', ()))} (model)")
    out_dtype = post_ops(m, same, values).dtype
    if out_dtype != want.dtype:
        return f"disagree: dtypes {out_dtype} (family) vs {want.dtype} (model)"
    tol = fam.tolerance.get(want.dtype) if want.is_floating_point() else (0.0, 0.0)
    if tol is None:
        return f"probe skipped: no tolerance for {want.dtype}"
    w, r = want.double(), ref.double()
    fin = torch.isfinite(r)
    if not torch.equal(fin, torch.isfinite(w)):
        return "disagree: NaN/Inf in other places"
    allowed = tol[0] + tol[1] * r.abs()
    if fam.error_bound is not None and fam.bound_tol.get(want.dtype):
        try:
            bound = post_ops(m, fam.error_bound(**f64).abs(), values, views_only=True)
            allowed = allowed + fam.bound_tol[want.dtype] * bound
        except Exception:
            pass
    err = (w - r).abs()
    if fin.any() and not bool((err[fin] <= PROBE_SLACK * allowed[fin] + 1e-12).all()):
        return f"disagree: max |diff| {err[fin].max().item():.3g}"
    return ""


__all__ = ["Pattern", "Match", "Folder", "patterns", "trace", "find", "region", "probe_match", "aliases",
           "kernel_args", "post_ops", "apply_views", "canon", "transparent"]
