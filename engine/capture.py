"""Capture a model's forward as aten-level FX graphs, every node carrying its shape, dtype, strides.

``capture(model, inputs)`` tries, in order:

1. ``torch.export.export(model, inputs, strict=False)``: one graph for the whole forward, its
   parameters and buffers as ``get_attr`` nodes of ``ep.module()`` (so constants such as a causal
   ``tril`` buffer can be read and folded). This is the main road: transformers models, the zoo
   and KernelBench problems export.
2. dynamo with a backend of ours: a forward that export refuses (data-dependent Python control
   flow, ``.item()``, prints) runs under ``torch.compile(backend=...)``; every graph break yields
   one more graph, and each of those torch-level graphs is exported to aten on the inputs dynamo
   hands the backend. Code between the graphs is Python the profile shows as "other".
3. Nothing: the run falls back to call interception (engine/kernel_runtime.py ``apply``) and the
   caller records why (``Capture.note``).

Every node of a captured graph has ``node.meta["val"]``, a FakeTensor (or a tuple of them, or a
SymInt) with the shape, dtype and strides the node produces on these inputs: the matcher
(engine/match.py) reads shapes from it and placement (engine/place.py) guards on it.

``Capture.runner(wrap)`` runs the model with every captured graph replaced by ``wrap(graph)``, a
callable of the graph's flat inputs: the profiler wraps graphs in a node-timing interpreter,
placement in the rewritten graph. Export graphs take the model's own (pytree) inputs; dynamo
graphs the flat tensors dynamo passes.
"""
from __future__ import annotations

import contextlib
import operator
import math
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn as nn

# Runtime dtype asserts export puts after every .to(): they use nodes without computing anything,
# and would otherwise look like extra consumers of a matched subgraph's inner values.
_DROP = {"_assert_tensor_metadata"}


@dataclass
class Graph:
    """One captured aten graph. ``gm(*flat_inputs)`` (dynamo) or ``gm(*args, **kwargs)``
    (export: the model's own signature) computes it. ``static`` maps placeholder names to the
    tensors behind them when those are the model's parameters or buffers (dynamo lifts them to
    inputs): constants the matcher may read."""
    gm: torch.fx.GraphModule
    origin: str                               # "export" | "dynamo"
    index: int = 0
    example: tuple = ()                       # dynamo: the flat inputs it was traced on
    static: dict = field(default_factory=dict)

    def nodes(self):
        return self.gm.graph.nodes


@dataclass
class Capture:
    method: str                               # "export" | "dynamo" | "none"
    graphs: list[Graph]
    note: str = ""                            # why a fallback was taken (the run's event says so)
    seconds: float = 0.0
    model: nn.Module | None = None
    inputs: tuple = ()
    kwargs: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.graphs)

    def runner(self, wrap):
        """A callable running the model's forward with each graph replaced by ``wrap(graph)``.
        Export: one graph, called with the model's inputs. Dynamo: the model under a
        torch.compile whose backend hands out the wrapped graphs in capture order."""
        if self.method == "export":
            fn = wrap(self.graphs[0])
            return fn
        if self.method == "dynamo":
            return _dynamo_runner(self, wrap)
        raise RuntimeError("nothing was captured")


def _clean(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    import operator
    g = gm.graph
    for n in list(g.nodes):
        if n.op == "call_function" and getattr(n.target, "_opname", None) in _DROP and not n.users:
            g.erase_node(n)
    for n in reversed(list(g.nodes)):       # unread items of tuple results (max's indices)
        if n.op == "call_function" and n.target is operator.getitem and not n.users:
            g.erase_node(n)
    _decompose(g)
    _exclusive_scans(g)
    _drop_dead(g)
    _functional(g)
    _drop_empty_cats(g)
    _split_einsums(g)
    _split_baddbmm(g)
    _split_pairs(g)
    _merged_heads(g)
    _batched_scores(g)
    _fold_biases(g)
    # export's own input guards (a module run under a dynamo context manager on every call, ~10
    # us of host time): what runs this graph checks the call's signature and each placed site
    # its tensors, and anything else runs the original model
    for n in list(g.nodes):
        if n.op == "call_module" and n.target == "_guards_fn" and not n.users:
            g.erase_node(n)
    gm.recompile()
    return gm


def _dead(n) -> bool:
    """``n`` computes a value nothing reads, with no effect of its own: an aten op that returns
    a value, writes no argument and draws no random numbers (a result the model drops)."""
    t = getattr(n, "target", None)
    if n.op != "call_function" or n.users or not isinstance(t, torch._ops.OpOverload):
        return False
    if t in getattr(torch.fx.node, "_side_effectful_functions", ()):
        return False                      # asserts, profiler ranges: run for their effect
    return (bool(t._schema.returns) and not t._schema.is_mutable
            and torch.Tag.nondeterministic_seeded not in t.tags)


def _drop_dead(g: torch.fx.Graph) -> None:
    """Values the model computes and never reads leave the graph (with what only they read):
    nn.MultiheadAttention returns its attention weights averaged over the heads, and a caller
    that drops them (``out, _ = attn(x, x, x)``) leaves the softmax with a second reader, the
    mean, which the attention patterns (one reader: the product with v) would refuse."""
    for n in reversed(list(g.nodes)):
        if _dead(n):
            g.erase_node(n)


def _fresh(n) -> bool:
    """``n`` computes a tensor of its own: an op's result, not a view of another tensor, an
    input, a parameter or a buffer (writing into those changes something outside ``n``)."""
    t = getattr(n, "target", None)
    if not (isinstance(n, torch.fx.Node) and n.op == "call_function"
            and isinstance(t, torch._ops.OpOverload)):
        return False
    rets = t._schema.returns
    return bool(rets) and all(r.alias_info is None for r in rets)


def _in_place(n) -> bool:
    t = getattr(n, "target", None)
    return (isinstance(t, torch._ops.OpOverload) and t._opname.endswith("_")
            and not t._opname.startswith("_"))


def _functional(g: torch.fx.Graph) -> None:
    """An op written in place on a fresh tensor nothing else reads (``scores.div_(s)`` after
    a matmul, as Falcon writes its attention) becomes its functional form: the same values,
    and the spelling the family patterns are written in."""
    for n in g.nodes:
        if n.op != "call_function" or not _in_place(n) or not n.args:
            continue
        base = n.args[0]
        if not _fresh(base) or len(base.users) != 1:
            continue
        name, overload = n.target._opname[:-1], n.target._overloadname
        packet = getattr(torch.ops.aten, name, None)
        fn = getattr(packet, overload, None) if packet is not None else None
        if fn is None or [a.name for a in fn._schema.arguments] != [a.name for a in n.target._schema.arguments]:
            continue
        n.target = fn


def _drop_empty_cats(g: torch.fx.Graph) -> None:
    """``cat([past, k])`` with an empty ``past`` (a key/value cache on its first call: Falcon,
    hand-written decoders) is ``k``: its readers read ``k`` itself, so the attention around it
    is the pattern it is. Kept where a reader or a later op writes in place into either."""
    for n in list(g.nodes):
        if not (n.op == "call_function" and getattr(n.target, "_opname", None) == "cat"
                and n.args and isinstance(n.args[0], (list, tuple))):
            continue
        vals = [(a, val(a)) for a in n.args[0]]
        if not all(isinstance(a, torch.fx.Node) and isinstance(v, torch.Tensor) for a, v in vals):
            continue
        full = [(a, v) for a, v in vals if v.numel() > 0]
        out = val(n)
        if len(full) != 1 or not isinstance(out, torch.Tensor):
            continue
        src, sv = full[0]
        if sv.shape != out.shape or sv.dtype != out.dtype:
            continue
        if any(_in_place(u) for u in list(n.users) + list(src.users)):
            continue
        n.replace_all_uses_with(src)
        g.erase_node(n)


# what a factory of a shape fills it with, from its arguments (x.new_full's kin: _NEW_FULL)
_FILLS = {"zeros": lambda a: 0.0, "zeros_like": lambda a: 0.0,
          "full": lambda a: a[1], "full_like": lambda a: a[1]}


def _is_zeros(n) -> bool:
    """``n`` is all zeros: a factory of zeros or a folded constant that holds only zeros."""
    if not isinstance(n, torch.fx.Node):
        return False
    if n.op == "get_attr":
        mod = n.graph.owning_module
        t = getattr(mod, n.target, None) if mod is not None else None
        return isinstance(t, torch.Tensor) and t.numel() > 0 and not bool(t.any())
    fill = _NEW_FULL.get(n.target) or _FILLS.get(_op(n))
    return fill is not None and fill(n.args) == 0


def _exclusive_scans(g: torch.fx.Graph) -> None:
    """An exclusive prefix sum spelled as its definition, ``cat([zeros, cumsum(x[..., :-1])])``
    along the scan's dim (KernelBench's cumsum_exclusive: x narrowed by its last element, its
    running sum shifted by one behind a block of zeros), reads as ``cumsum(x) - x``: the same
    values (x[0] - x[0] is exactly 0, and cumsum(x)[i] - x[i] is the sum before i, up to one
    rounding), one scan region that reads x once and writes once, where the spelling took a
    scan, a copy into the concatenation and a block of zeros the region ops do not hold."""
    aten = torch.ops.aten
    for n in list(g.nodes):
        if _op(n) != "cat" or not n.args or not isinstance(n.args[0], (list, tuple)) \
                or len(n.args[0]) != 2 or n.kwargs:
            continue
        out = val(n)
        zero, scan = n.args[0]
        if not (isinstance(out, torch.Tensor) and isinstance(scan, torch.fx.Node)
                and _op(scan) == "cumsum" and len(scan.users) == 1 and _is_zeros(zero)):
            continue
        d = (n.args[1] if len(n.args) > 1 else 0) % out.dim()
        part = scan.args[0]
        sdim = scan.args[1] % out.dim() if len(scan.args) > 1 and isinstance(scan.args[1], int) else None
        zv = val(zero)
        if (sdim != d or set(scan.kwargs) - {"dtype"} or scan.kwargs.get("dtype") not in (None, out.dtype)
                or not isinstance(zv, torch.Tensor) or zv.dim() != out.dim() or zv.shape[d] != 1
                or not isinstance(part, torch.fx.Node) or len(part.users) != 1):
            continue
        # part = x[..., 0:L-1] along d, by narrow or slice
        x = part.args[0] if part.args else None
        xv = val(x) if isinstance(x, torch.fx.Node) else None
        if not isinstance(xv, torch.Tensor) or xv.shape != out.shape or xv.dtype != out.dtype:
            continue
        L = xv.shape[d]
        pa = list(part.args) + [None] * 4
        if _op(part) == "narrow":
            ok = (pa[1] or 0) % xv.dim() == d and pa[2] == 0 and pa[3] == L - 1
        elif _op(part) == "slice":
            end = pa[3] if pa[3] is not None else L
            end = end + L if end < 0 else end
            ok = ((pa[1] or 0) % xv.dim() == d and pa[2] in (None, 0) and end == L - 1
                  and pa[4] in (None, 1))
        else:
            ok = False
        mode = getattr(out, "fake_mode", None)
        if not ok or mode is None:
            continue
        made: list = []
        with g.inserting_before(n):
            made.append(emit(g, aten.cumsum.default, (x, d), mode))
            made.append(emit(g, aten.sub.Tensor, (made[0], x), mode))
        _replace_or_undo(g, n, made[-1], made)      # what only the cat read: _drop_dead


# Composite ops kept whole: a family's spellings or the matcher name them as one node
# (tests/test_graph.py checks that no other composite appears in a spelling), and recurrent
# layers, whose decomposition is a loop of steps where eager runs one vendor kernel; einsum
# has its own pass (_split_einsums).
_WHOLE = {"scaled_dot_product_attention", "rms_norm", "cross_entropy_loss", "nll_loss_nd",
          "nll_loss", "nll_loss2d", "repeat_interleave", "einsum", "lstm", "gru", "rnn_tanh",
          "rnn_relu"}
# what a decomposition may hold besides the ops regions hold (kernels/region.py OPS), views
# and in-place forms of those ops: constants (a scalar, a filled tensor) made where it runs
_FACTORIES = {"scalar_tensor", "full", "new_full", "zeros_like", "ones_like", "empty_like",
              "full_like", "fill_", "fill"}
_DECOMPOSED_MAX = 32        # nodes a decomposition may add
# x.new_full(size, v) and its kin in a decomposition: size and fill value from their arguments
_NEW_FULL = {torch.ops.aten.new_full.default: lambda a: a[2],
             torch.ops.aten.new_zeros.default: lambda a: 0.0,
             torch.ops.aten.new_ones.default: lambda a: 1.0}
# ops with their own kernel (not composite) that PyTorch's decomposition table writes as ops
# regions hold: pointwise ops and losses spelled as one name (F.glu's halves, nn.PReLU, addcmul,
# lerp, logit, binary cross entropy). None is in a family's spelling (tests/test_graph.py)
_DECOMPOSED_TOO = {"glu", "_prelu_kernel", "addcmul", "addcdiv", "lerp", "logit", "xlogy",
                   "xlog1py", "sinc", "deg2rad", "rad2deg", "nan_to_num", "softsign",
                   "tanhshrink", "binary_cross_entropy", "binary_cross_entropy_with_logits",
                   "soft_margin_loss", "hinge_embedding_loss", "special_xlog1py"}
_COPIES = {"clone", "contiguous", "_to_copy", "to", "alias", "detach", "copy", "copy_"}


def _decomposition(n, held: set):
    """The ops a composite aten op at ``n`` runs (its CompositeImplicitAutograd kernel,
    traced on meta tensors), as (GraphModule, the node arguments its placeholders stand for),
    when every one of them is an op regions hold, a view, or a constant; else None."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.node import map_aggregate, map_arg
    t = n.target
    nodes: list = []

    def slot(a):                       # a node argument -> the index of its meta tensor
        nodes.append(a)
        return _Slot(len(nodes) - 1)
    args, kwargs = map_arg(n.args, slot), map_arg(dict(n.kwargs), slot)
    vals = [a.meta.get("val") for a in nodes]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    metas = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta") for v in vals]

    run = _decomposer(t)

    def call(*ts):
        real = lambda x: ts[x.i] if isinstance(x, _Slot) else x   # noqa: E731
        return run(*map_aggregate(args, real), **map_aggregate(kwargs, real))
    try:
        sub = make_fx(call, decomposition_table=_inner_decompositions())(*metas)
    except Exception:
        return None
    sub.graph.eliminate_dead_code()       # a decomposition's unread buffers
    body = [m for m in sub.graph.nodes if m.op not in ("placeholder", "output")]
    if not body or len(body) > _DECOMPOSED_MAX:
        return None
    computes = False
    for m in body:
        mt = m.target
        if m.op != "call_function":
            return None
        if mt is operator.getitem:
            continue
        if not isinstance(mt, torch._ops.OpOverload) or mt.namespace != "aten":
            return None
        name = mt._opname
        rets = mt._schema.returns
        view = bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write
        if not (name in held or name.removesuffix("_") in held or view or name in _FACTORIES):
            return None
        computes |= name.removesuffix("_") in held and name not in _COPIES
    return (sub, nodes) if computes else None       # views and copies alone: nothing for a region


def _log_sigmoid_forward(x):
    # log sigmoid(x) = -softplus(-x): the op regions hold, where PyTorch's decompositions call
    # the forward that also returns a buffer (read by its backward only)
    return torch.ops.aten.neg(torch.ops.aten.softplus(torch.ops.aten.neg(x))), x.new_empty((0,))


_INNER: dict = {}


def _inner_decompositions() -> dict:
    """What a decomposition's own ops become as it is traced: _DECOMPOSED_TOO's ops (prelu's
    composite calls _prelu_kernel) and the log-sigmoid forward."""
    if not _INNER:
        from torch._decomp import decomposition_table
        _INNER.update({op: f for op, f in decomposition_table.items()
                       if isinstance(op, torch._ops.OpOverload) and op._opname in _DECOMPOSED_TOO})
        _INNER[torch.ops.aten.log_sigmoid_forward.default] = _log_sigmoid_forward
    return _INNER


def _decomposer(t):
    """The function that writes aten op ``t`` as other aten ops (its composite kernel, or
    PyTorch's decomposition of an op in _DECOMPOSED_TOO), else None."""
    if t._opname in _WHOLE:
        return None
    if t.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
        return t.decompose
    return _inner_decompositions().get(t) if t._opname in _DECOMPOSED_TOO else None


class _Slot:
    """Where the i-th tensor argument goes in a traced call's arguments."""
    def __init__(self, i):
        self.i = i


def _decompose(g: torch.fx.Graph) -> None:
    """A composite op the export kept whole (``triplet_margin_loss``, ``cosine_similarity``,
    ``pairwise_distance``, ``margin_ranking_loss``, ``relu6``, ...: ops PyTorch itself writes
    as other aten ops), and an op of _DECOMPOSED_TOO (``glu``, PReLU's kernel, ``lerp``),
    becomes those ops, where regions hold each one: the same computation, now visible to the
    region finder, whatever the op is called. Ops a family
    spells whole and views stay; so does an op whose decomposition needs anything else
    (gathers, index arithmetic), which no region would hold."""
    from kernels.region import OPS
    held = set(OPS)
    for n in list(g.nodes):
        t = n.target
        if (n.op != "call_function" or not isinstance(t, torch._ops.OpOverload)
                or t.namespace != "aten" or t._opname in held or _decomposer(t) is None):
            continue
        rets = t._schema.returns
        if not rets or rets[0].alias_info is not None or t._schema.is_mutable:
            continue
        vo = val(n)
        mode = getattr(vo, "fake_mode", None)
        if not isinstance(vo, torch.Tensor) or mode is None:
            continue
        found = _decomposition(n, held)
        if found is None:
            continue
        sub, ins = found[0], iter(found[1])
        env, made = {}, []
        with g.inserting_before(n):
            for m in sub.graph.nodes:
                if m.op == "placeholder":
                    env[m] = next(ins)
                    continue
                if m.op == "output":
                    out = env[m.args[0]] if isinstance(m.args[0], torch.fx.Node) else None
                    continue
                args = torch.fx.node.map_arg(m.args, lambda a: env[a])
                kwargs = dict(torch.fx.node.map_arg(m.kwargs, lambda a: env[a]))
                target = m.target
                if target in _NEW_FULL:
                    # a constant of its input's dtype: made from literals alone, so that
                    # _fold_factories computes it once and no region is cut at it
                    like = m.args[0].meta["val"]
                    target, args = torch.ops.aten.full.default, (list(args[1]), _NEW_FULL[target](args))
                    kwargs = {"dtype": kwargs.get("dtype") or like.dtype, "device": vo.device}
                if kwargs.get("device") is not None:
                    kwargs["device"] = vo.device          # traced on meta: made where it runs
                new = g.call_function(target, tuple(args), kwargs)
                try:
                    with mode:
                        new.meta["val"] = target(
                            *[_in_mode(fake_of(a), mode) for a in args],
                            **{k: _in_mode(fake_of(v), mode) for k, v in kwargs.items()})
                except Exception:
                    out = None
                    made.append(new)
                    break
                for k in ("stack_trace", "nn_module_stack", "source_fn_stack"):
                    if k in n.meta:
                        new.meta[k] = n.meta[k]
                env[m] = new
                made.append(new)
        _replace_or_undo(g, n, out, made)


def _same_value(a, b) -> bool:
    """Fake values of one shape and dtype: a rewrite's result may stand for the node it replaces."""
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.shape == b.shape and a.dtype == b.dtype)


def _replace_or_undo(g: torch.fx.Graph, n, new, made: list) -> bool:
    """``n``'s readers read ``new`` and ``n`` leaves the graph where their values agree in shape
    and dtype; else the nodes ``made`` for the rewrite leave it. True when replaced."""
    if new is not None and _same_value(val(new), val(n)):
        n.replace_all_uses_with(new)
        g.erase_node(n)
        return True
    for m in reversed(made):
        g.erase_node(m)
    return False


def fake_of(v):
    """A node argument's fake value (the node's), anything else as it is."""
    return v.meta.get("val") if isinstance(v, torch.fx.Node) else v


def _in_mode(v, mode):
    """``v`` as a value of fake ``mode`` (call under it): a tensor of another mode (a re-captured
    graph's nodes can hold values of several) remade there, same shape, strides, dtype, device."""
    if isinstance(v, torch.Tensor) and getattr(v, "fake_mode", None) is not mode:
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
    return v


def emit(g: torch.fx.Graph, target, args, mode):
    """A call of ``target`` on ``args`` added at ``g``'s insertion point, its value computed on
    the arguments' fake values under ``mode`` (none where that fails or there is no mode)."""
    n = g.call_function(target, tuple(args))
    if mode is not None:
        try:
            with mode:
                n.meta["val"] = target(*[_in_mode(fake_of(a), mode) for a in args])
        except Exception:
            pass
    return n


_SOFTMAX = {"softmax", "_softmax"}


def _ancestors(n, stop: int = 400) -> set:
    seen, todo = set(), [n]
    while todo and len(seen) < stop:
        x = todo.pop()
        for a in x.all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return seen


def _op(n) -> str | None:
    return getattr(n.target, "_opname", None) if isinstance(n, torch.fx.Node) and n.op == "call_function" else None


def _feeds_softmax(n, hops: int = 6) -> bool:
    """``n``'s value reaches a softmax within ``hops`` single-reader steps."""
    for _ in range(hops):
        if len(n.users) != 1:
            return False
        n = next(iter(n.users))
        if _op(n) in _SOFTMAX:
            return True
    return False


# ops returning two reductions of one input over the same dims: the two ops they are, each
# called as (x, dims, keepdim, correction) -> (target, args, kwargs)
_HALVES = {
    "var": lambda x, d, k, c: (torch.ops.aten.var.correction, (x, d), {"correction": c, "keepdim": k}),
    "std": lambda x, d, k, c: (torch.ops.aten.std.correction, (x, d), {"correction": c, "keepdim": k}),
    "mean": lambda x, d, k, c: (torch.ops.aten.mean.dim, (x, d), {"keepdim": k}),
    "amin": lambda x, d, k, c: (torch.ops.aten.amin.default, (x, d), {"keepdim": k}),
    "amax": lambda x, d, k, c: (torch.ops.aten.amax.default, (x, d), {"keepdim": k}),
}
_PAIRS = {"var_mean": ("var", "mean"), "std_mean": ("std", "mean"), "aminmax": ("amin", "amax")}


def _split_pairs(g: torch.fx.Graph) -> None:
    """``torch.var_mean(x, dims)`` (``std_mean``, ``aminmax``): one aten op returning two
    reductions, read through getitems, is the two ops it computes (``var`` and ``mean`` of
    ``x`` over the same dims), each a reduction a region holds (a hand-written norm's
    statistics). Values as torch computes each alone."""
    for n in list(g.nodes):
        name = _op(n)
        if name not in _PAIRS or not all(u.target is operator.getitem for u in n.users):
            continue
        vo = val(n)
        mode = getattr(vo[0], "fake_mode", None) if isinstance(vo, (tuple, list)) and vo else None
        if mode is None:
            continue
        a = {arg.name: v for arg, v in zip(n.target._schema.arguments[1:], n.args[1:])}
        a.update(n.kwargs)
        dims = a.get("dim")
        dims = [] if dims is None else ([dims] if isinstance(dims, int) else list(dims))
        correction = a.get("correction", 1)
        if "unbiased" in a:                      # the .dim overload's spelling of it
            correction = 1 if a["unbiased"] else 0
        made = []
        with g.inserting_before(n):
            for half in _PAIRS[name]:
                target, args, kw = _HALVES[half](n.args[0], dims, a.get("keepdim", False), correction)
                m = g.call_function(target, args, kw)
                try:
                    with mode:
                        m.meta["val"] = target(*[_in_mode(fake_of(x), mode) for x in args], **kw)
                except Exception:
                    pass
                made.append(m)
        if not all(_same_value(m.meta.get("val"), v) for m, v in zip(made, vo)):
            for m in reversed(made):
                g.erase_node(m)
            continue
        for u in list(n.users):
            u.replace_all_uses_with(made[u.args[1]])
            g.erase_node(u)
        g.erase_node(n)
        for m in made:
            if not m.users:                      # the half nothing read
                g.erase_node(m)


def _split_baddbmm(g: torch.fx.Graph) -> None:
    """``baddbmm(bias, a, b, beta=β, alpha=α)`` whose value reaches a softmax (BLOOM's ALiBi
    scores: the bias added by the batched GEMM) reads as ``(a @ b) * α + bias * β``: the GEMM,
    its scale and a bias, the spelling attention's patterns are written in. The values are
    the same up to the rounding of the scale and the add, done apart."""
    aten = torch.ops.aten
    for n in list(g.nodes):
        if _op(n) != "baddbmm" or len(n.args) != 3 or not _feeds_softmax(n):
            continue
        bias, a, b = n.args
        beta, alpha = n.kwargs.get("beta", 1), n.kwargs.get("alpha", 1)
        if set(n.kwargs) - {"beta", "alpha"} or not all(isinstance(x, torch.fx.Node) for x in (bias, a, b)):
            continue
        vo = val(n)
        mode = getattr(vo, "fake_mode", None)
        if mode is None:
            continue
        made = []

        def add(target, args):
            made.append(emit(g, target, args, mode))
            return made[-1]
        with g.inserting_before(n):
            s = add(aten.matmul.default, (a, b))
            if alpha != 1:
                s = add(aten.mul.Tensor, (s, alpha))
            if beta != 0:
                s = add(aten.add.Tensor, (s, add(aten.mul.Tensor, (bias, beta)) if beta != 1 else bias))
        _replace_or_undo(g, n, s, made)


def _einsum_terms(eq: str, n_ops: int) -> tuple[list[str], str] | None:
    """("bhid,bhjd->bhij", 2) -> (["bhid", "bhjd"], "bhij"); an implicit output is the letters
    used once, sorted (torch's rule). None for what the decomposition leaves to torch: an
    ellipsis, a letter twice in one term (a diagonal), a wrong operand count."""
    eq = eq.replace(" ", "")
    if "." in eq:
        return None
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if not arrow:
        letters = "".join(terms)
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if len(terms) != n_ops or any(len(set(t)) != len(t) for t in terms + [out]):
        return None
    if not all(t.isalpha() for t in terms if t) or set(out) - set("".join(terms)):
        return None
    return terms, out


def _split_einsums(g: torch.fx.Graph) -> None:
    """``einsum`` in any spelling reads as the GEMMs it is: every pair of operands (left to
    right, what a later operand or the output still needs kept) becomes a permute to [batch...,
    M..., K...] @ [batch..., K..., N...], a reshape where a side has several M, K or N letters,
    a ``matmul`` (a ``mul`` where nothing is contracted) and a permute to the output's order;
    a letter only one side has and nothing after needs is summed first. Attention written as
    ``einsum("bhid,bhjd->bhij", q, k)`` then reads as ``q @ k.transpose(-2, -1)``, the
    spelling the families' patterns hold, and a multi-operand einsum (Mamba-2's
    "bclhn,bcshn,bhcls,bcshp->bclhp") as two batched GEMMs and a product. Left as it is: an
    ellipsis, a diagonal, operands that broadcast a letter, and a chain whose pairwise
    intermediate would be more than 4x the largest operand or output (torch's own path then
    contracts in a better order)."""
    aten = torch.ops.aten
    for n in list(g.nodes):
        if _op(n) != "einsum" or len(n.args) < 2 or not isinstance(n.args[0], str):
            continue
        ops = list(n.args[1])
        vo = val(n)
        mode = getattr(vo, "fake_mode", None)
        got = _einsum_terms(n.args[0], len(ops))
        if (got is None or mode is None or not ops or not all(isinstance(o, torch.fx.Node) for o in ops)
                or not all(isinstance(val(o), torch.Tensor) for o in ops)):
            continue
        terms, out = got
        size: dict[str, int] = {}
        if any(size.setdefault(c, int(d)) != int(d)
               for t, o in zip(terms, ops) for c, d in zip(t, val(o).shape)) or any(
                len(t) != val(o).dim() for t, o in zip(terms, ops)):
            continue                                  # a broadcast letter: torch's own rules
        cap = 4 * max([val(o).numel() for o in ops] + [vo.numel(), 1])
        made: list = []

        def add(target, args):
            made.append(emit(g, target, args, mode))
            if not isinstance(val(made[-1]), torch.Tensor):
                raise ValueError(f"{target} has no fake value here")
            return made[-1]

        def permuted(x, have: str, want: str):
            if have == want:
                return x
            if len(have) >= 2 and have[:-2] == want[:-2] and have[-2:] == want[-2:][::-1]:
                return add(aten.transpose.int, (x, -2, -1))
            return add(aten.permute.default, (x, [have.index(c) for c in want]))

        def shaped(x, dims: list[int]):
            return x if list(val(x).shape) == dims else add(aten.reshape.default, (x, dims))

        def summed(x, have: str, keep: set) -> tuple:
            gone = [i for i, c in enumerate(have) if c not in keep]
            if not gone:
                return x, have
            return add(aten.sum.dim_IntList, (x, gone)), "".join(c for c in have if c in keep)

        def pair(x, xs: str, y, ys: str, want: set) -> tuple:
            """x (letters xs) times y (ys), the letters in ``want`` kept: (node, letters)."""
            x, xs = summed(x, xs, want | set(ys))
            y, ys = summed(y, ys, want | set(xs))
            batch = [c for c in xs if c in ys and c in want]
            con = [c for c in xs if c in ys and c not in want]
            mf, nf = [c for c in xs if c not in ys], [c for c in ys if c not in xs]
            prod = lambda cs: math.prod(size[c] for c in cs)
            bd = [size[c] for c in batch]
            a = permuted(x, xs, "".join(batch + mf + con))
            b = permuted(y, ys, "".join(batch + con + nf))
            a = shaped(a, bd + [prod(mf), prod(con)] if con else bd + [prod(mf), 1])
            b = shaped(b, bd + [prod(con), prod(nf)] if con else bd + [1, prod(nf)])
            r = add(aten.matmul.default if con else aten.mul.Tensor, (a, b))
            r = shaped(r, bd + [size[c] for c in mf + nf])
            return r, "".join(batch + mf + nf)

        ok = True
        try:
            with g.inserting_before(n):
                x, xs = ops[0], terms[0]
                if len(ops) == 1:
                    x, xs = summed(x, xs, set(out))
                for i in range(1, len(ops)):
                    later = set(out).union(*[set(t) for t in terms[i + 1:]])
                    x, xs = pair(x, xs, ops[i], terms[i], later)
                    if val(x).numel() > cap:
                        ok = False
                        break
                if ok:
                    x = permuted(x, xs, out)
        except Exception:                             # an op its fake values refuse: torch's
            ok = False                                # einsum stays
        if not (ok and made and _same_value(val(x), vo)):
            for m in reversed(made):
                if not m.users:
                    g.erase_node(m)
            continue
        n.replace_all_uses_with(x)
        g.erase_node(n)


_VIEWS = {"view", "reshape", "_unsafe_view"}
# ops a [B, H, S, T] stretch of scores may hold between its views (each one reader)
_STRETCH = {"add", "sub", "mul", "div", "masked_fill", "where", "softmax", "_softmax", "to",
            "_to_copy", "dropout", "clone", "contiguous"}


def _merged_heads(g: torch.fx.Graph) -> None:
    """Attention written over [B*H, S, D] whose scores are viewed as [B, H, S, T] for the mask
    and the softmax and back to [B*H, S, T] for the second GEMM (BLOOM) reads as one 3-D
    attention over B*H heads: the views go, a 4-D operand of the stretch (the mask) is viewed
    or expanded to [B*H, S, T], and the batched GEMMs read as matmul, the spelling the
    patterns are written in. Only a stretch that holds a softmax over its last dim."""
    for v4 in list(g.nodes):
        if _op(v4) not in _VIEWS or not isinstance(v4.args[0], torch.fx.Node):
            continue
        x = v4.args[0]
        vx, vo = val(x), val(v4)
        if not (isinstance(vx, torch.Tensor) and isinstance(vo, torch.Tensor)
                and vx.dim() == 3 and vo.dim() == 4 and vo.shape[0] * vo.shape[1] == vx.shape[0]
                and tuple(vo.shape[2:]) == tuple(vx.shape[1:]) and vo.shape[1] > 1):
            continue
        B, H, S, T = (int(d) for d in vo.shape)
        chain, cur, end = [], v4, None
        while len(cur.users) == 1:
            u = next(iter(cur.users))
            vu = val(u)
            if not isinstance(vu, torch.Tensor):
                break
            if _op(u) in _VIEWS and u.args[0] is cur:
                if tuple(vu.shape) == tuple(vx.shape):
                    end = u
                break
            if _op(u) not in _STRETCH or tuple(vu.shape) != (B, H, S, T):
                break
            if _op(u) in _SOFTMAX and u.args[1] not in (-1, 3):
                break
            chain.append(u)
            cur = u
        if end is None or not any(_op(u) in _SOFTMAX for u in chain):
            continue
        if any(isinstance(a, torch.fx.Node) for u in chain for a in u.kwargs.values()):
            continue                          # tensors passed by keyword: left as written
        # the stretch's other tensors, each as [B*H, S, T] (a view where its B and H are 1)
        # (a 0-dim one, masked_fill's value, broadcasts as it is and must stay 0-dim)
        others = {a for u in chain for a in u.all_input_nodes if a is not v4 and a not in chain
                  and not (isinstance(val(a), torch.Tensor) and val(a).dim() == 0)}
        if any(not isinstance(val(a), torch.Tensor) or val(a).dim() > 4 for a in others):
            continue
        shapes = {a: (1,) * (4 - val(a).dim()) + tuple(val(a).shape) for a in others}
        try:
            for shp in shapes.values():
                torch.broadcast_shapes(shp, (B, H, S, T))
        except RuntimeError:
            continue
        mode = getattr(vo, "fake_mode", None)
        if mode is None:
            continue
        new = {}
        for a, shp in shapes.items():
            with g.inserting_after(a):
                if shp[0] == 1 and shp[1] == 1:       # no batch or head dim: a view
                    new[a] = emit(g, torch.ops.aten.reshape.default, (a, [1, *shp[2:]]), mode)
                    continue
                e = emit(g, torch.ops.aten.expand.default, (a, [B, H, *shp[2:]]), mode)
            with g.inserting_after(e):
                new[a] = emit(g, torch.ops.aten.reshape.default, (e, [B * H, *shp[2:]]), mode)
        for u in chain:
            u.args = tuple(x if a is v4 else new.get(a, a) if isinstance(a, torch.fx.Node) else a
                           for a in u.args)
            if _op(u) in _SOFTMAX:
                u.args = (u.args[0], -1, *u.args[2:])
            u.meta["val"] = u.meta["val"].reshape(B * H, S, T)
        end.replace_all_uses_with(chain[-1])
        g.erase_node(end)
        if not v4.users:
            g.erase_node(v4)
        # the GEMMs on either side: batched, so matmul computes them as bmm does
        for n in [*chain[-1].users, *_ancestors(x, stop=8)]:
            if _op(n) == "bmm":
                n.target = torch.ops.aten.matmul.default


def _after_softmax(n, hops: int = 3) -> bool:
    """``n`` is a softmax's value, through up to ``hops`` single-reader casts or dropouts."""
    for _ in range(hops + 1):
        if _op(n) in _SOFTMAX:
            return True
        if _op(n) not in ("dropout", "to", "_to_copy", "clone", "contiguous") or len(n.users) != 1:
            return False
        n = n.args[0]
    return False


def _batched_scores(g: torch.fx.Graph) -> None:
    """Attention written over [B*H, S, D] with ``torch.bmm`` (nn.MultiheadAttention when it
    returns its weights): the GEMM whose value reaches a softmax and the one that reads the
    softmax's value read as matmul, which computes 3-D operands as bmm does and is the
    spelling the patterns are written in. Other bmms stay as written."""
    for n in g.nodes:
        if _op(n) == "bmm" and (_feeds_softmax(n) or _after_softmax(n.args[0])):
            n.target = torch.ops.aten.matmul.default


def _fold_biases(g: torch.fx.Graph) -> None:
    """``softmax((s + b1) + b2)`` with two biases of the scores' dtype that do not depend on the
    scores (T5's relative-position bias and its mask, added one after the other) reads as
    ``softmax(s + (b1 + b2))``: one bias, the spelling attention's runtime mask is written in.
    The biases' sum is what the second add would have read anyway; in the scores' own dtype the
    result differs by the rounding of one add."""
    for outer in list(g.nodes):
        if not (_op(outer) == "add" and len(outer.args) == 2 and outer.kwargs.get("alpha", 1) == 1
                and any(_op(u) in _SOFTMAX for u in outer.users)):
            continue
        inner, b2 = outer.args
        if not (_op(inner) == "add" and isinstance(b2, torch.fx.Node) and len(inner.args) == 2
                and len(inner.users) == 1 and inner.kwargs.get("alpha", 1) == 1):
            continue
        x, b1 = inner.args
        if not (isinstance(x, torch.fx.Node) and isinstance(b1, torch.fx.Node)):
            continue
        vx, v1, v2 = val(x), val(b1), val(b2)
        if not all(isinstance(v, torch.Tensor) for v in (vx, v1, v2)):
            continue
        if not (vx.dtype == v1.dtype == v2.dtype and vx.is_floating_point()):
            continue
        if vx.shape != val(outer).shape:
            continue                           # the biases would widen the scores
        if x in _ancestors(b1) or x in _ancestors(b2) or x is b1 or x is b2:
            continue                           # a bias computed from the scores
        with g.inserting_before(outer):
            both = emit(g, torch.ops.aten.add.Tensor, (b1, b2), getattr(v1, "fake_mode", None))
        if "val" not in both.meta:
            g.erase_node(both)
            continue
        outer.args = (x, both)
        g.erase_node(inner)


def export_graph(fn: nn.Module, args: tuple, kwargs: dict | None = None) -> torch.fx.GraphModule:
    """``fn``'s forward on these inputs as an aten GraphModule (torch.export, non-strict), with
    parameters and buffers as get_attr nodes. Raises what torch.export raises."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(fn, tuple(args), kwargs or {}, strict=False)
    gm = ep.module()
    for name, t in list(gm.named_buffers()) + [(k, v) for k, v in vars(gm).items()
                                                if isinstance(v, torch.Tensor)]:
        if isinstance(t, torch._subclasses.fake_tensor.FakeTensor):
            # a value the trace could not follow, kept as a constant with no data: running
            # the graph would fail; the caller takes the next road
            raise RuntimeError(f"the export holds a fake constant ({name})")
    return _clean(gm)


def capture(model: nn.Module, inputs, kwargs: dict | None = None, allow_dynamo: bool = True) -> Capture:
    """The model's forward on ``inputs`` as aten graphs; see the module doc for the order tried.
    Runs under no_grad and leaves the model as it was."""
    inputs = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    kwargs = dict(kwargs or {})
    t0 = time.perf_counter()
    why_export = ""
    try:
        with torch.no_grad():
            gm = export_graph(model, inputs, kwargs)
        _fold_factories(gm)
        _real_strides(gm, inputs, kwargs)
        return Capture("export", [Graph(gm, "export")], "", time.perf_counter() - t0, model,
                       inputs, kwargs)
    except Exception as e:
        why_export = f"torch.export failed: {type(e).__name__}: {_one_line(e)}"
    if not allow_dynamo:
        return Capture("none", [], why_export, time.perf_counter() - t0, model, inputs, kwargs)
    try:
        graphs = _dynamo_capture(model, inputs, kwargs)
    except Exception as e:
        return Capture("none", [], f"{why_export}; dynamo capture failed: {type(e).__name__}: "
                       f"{_one_line(e)}", time.perf_counter() - t0, model, inputs, kwargs)
    if not graphs:
        return Capture("none", [], f"{why_export}; dynamo captured no graph",
                       time.perf_counter() - t0, model, inputs, kwargs)
    return Capture("dynamo", graphs, f"{why_export}; captured by dynamo as {len(graphs)} graph(s)",
                   time.perf_counter() - t0, model, inputs, kwargs)


_FOLD_MAX = 1 << 24       # elements: a constant larger than this is computed where it was


def _fold_factories(gm: torch.fx.GraphModule) -> None:
    """Values the forward builds from nothing but literals and shapes (a causal mask as
    ``torch.triu(torch.full((T, T), -inf), 1)``, Mamba-2's ``tril(ones(T, T))``, an
    ``arange`` of positions) are computed once here and read as constants: the graph stops
    rebuilding them every call, and the matchers see the constant mask they are. Nothing
    that reads an input, a parameter or a buffer, draws random numbers or is written in
    place is folded."""
    g = gm.graph
    pure: set = set()
    for n in g.nodes:
        if n.op != "call_function":
            continue
        t = n.target
        ok = t is operator.getitem or (
            isinstance(t, torch._ops.OpOverload) and not t._schema.is_mutable
            and torch.Tag.nondeterministic_seeded not in t.tags
            and t not in getattr(torch.fx.node, "_side_effectful_functions", ()))
        v = n.meta.get("val")
        small = not isinstance(v, torch.Tensor) or v.numel() <= _FOLD_MAX   # every step held at once
        if ok and small and all(a in pure for a in n.all_input_nodes):
            pure.add(n)
    if not pure:
        return
    for n in g.nodes:                    # an op writing into one of them: fold nothing
        t = n.target
        if (n.op == "call_function" and isinstance(t, torch._ops.OpOverload)
                and t._schema.is_mutable and any(a in pure for a in n.all_input_nodes)):
            return
    frontier = [n for n in g.nodes if n in pure and any(u not in pure for u in n.users)]
    env: dict = {}
    try:
        for n in g.nodes:
            if n in pure:
                env[n] = n.target(*torch.fx.node.map_arg(n.args, env.get),
                                  **torch.fx.node.map_arg(n.kwargs, env.get))
    except Exception:
        return                           # left as the model computes it
    k = 0
    for n in frontier:
        v = env[n]
        if not isinstance(v, torch.Tensor) or v.numel() > _FOLD_MAX or "val" not in n.meta:
            continue
        while hasattr(gm, f"_folded_{k}"):
            k += 1
        name = f"_folded_{k}"
        gm.register_buffer(name, v, persistent=False)
        with g.inserting_before(n):
            c = g.get_attr(name)
        c.meta.update(n.meta)
        n.replace_all_uses_with(c)
    _drop_dead(g)
    gm.recompile()


def _real_strides(gm: torch.fx.GraphModule, inputs: tuple, kwargs: dict) -> None:
    """Each node's value with the strides the real run gives it, where the graph's fake values
    say otherwise. A reshape's fake value can give a size-1 dim another stride than the real
    one, and a convolution reads that as a channels-last input: its fake output is channels-last
    where the real one is not (SegFormer at batch 1), and every guard placed after it would
    miss. One forward of the graph, node by node, values freed after their last reader."""
    if any(n.op == "call_function" and _in_place(n) for n in gm.graph.nodes):
        return                      # a run would change the model's state (buffers, caches)
    diff = {}

    class _Strides(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            v = n.meta.get("val")
            if (isinstance(out, torch.Tensor) and isinstance(v, torch.Tensor)
                    and tuple(out.shape) == tuple(v.shape) and out.stride() != v.stride()):
                diff[n] = tuple(out.stride())
            return out
    try:
        with torch.no_grad():
            _Strides(gm).run(*gm.graph._codegen.process_inputs(*inputs, **kwargs))
    except Exception:
        return                      # the fake values stand (a graph that does not run here)
    for n, stride in diff.items():
        v = n.meta["val"]
        mode = getattr(v, "fake_mode", None)
        if mode is None:
            continue
        with mode:
            n.meta["val"] = torch.empty_strided(tuple(v.shape), stride, dtype=v.dtype, device=v.device)


def _static_names(gm, example, model) -> dict:
    """Placeholders of a dynamo graph that are the model's parameters or buffers."""
    ids = {id(t) for t in list(model.parameters()) + list(model.buffers())}
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    return {name: t for name, t in zip(names, example) if isinstance(t, torch.Tensor) and id(t) in ids}


def _data_as_detach(gm: torch.fx.GraphModule) -> None:
    """``x.data`` (older code's way to leave autograd: ``target.data.unsqueeze(1)`` in a
    label-smoothing loss) reaches dynamo's graph as ``_get_data_attr(x)``, which the export
    turns into a constant fake tensor; for a forward's values it is ``x.detach()``."""
    get_data = getattr(torch._C._autograd, "_get_data_attr", None)
    hit = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and get_data is not None and n.target is get_data:
            n.target, hit = torch.ops.aten.detach.default, True
    if hit:
        gm.recompile()


def _dynamo_capture(model, inputs, kwargs) -> list[Graph]:
    graphs: list[Graph] = []
    failures: list[str] = []

    def backend(gm, example):
        try:
            example = tuple(example)
            _data_as_detach(gm)
            agm = export_graph(gm, example)
            _fold_factories(agm)
            graphs.append(Graph(agm, "dynamo", len(graphs), example, _static_names(gm, example, model)))
        except Exception as e:          # a graph export refuses stays out; its ops run as "other"
            failures.append(f"{type(e).__name__}: {_one_line(e)}")
        return gm.forward

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=backend, dynamic=False)
        with torch.no_grad(), _quiet():
            compiled(*inputs, **kwargs)
    finally:
        torch._dynamo.reset()
    if failures and not graphs:
        raise RuntimeError("; ".join(failures[:3]))
    return graphs


def _dynamo_runner(cap: Capture, wrap):
    """torch.compile(model) whose backend returns wrap(graph) for the graphs in capture order
    (dynamo compiles the same frames in the same order on the same inputs)."""
    queue = list(cap.graphs)

    def backend(gm, example):
        if not queue:
            return gm.forward             # a graph not seen at capture: run as traced
        return _flat(wrap(queue.pop(0)))

    torch._dynamo.reset()
    compiled = torch.compile(cap.model, backend=backend, dynamic=False)

    def run(*args, **kwargs):
        with _quiet():
            return compiled(*args, **kwargs)
    return run


def _flat(fn):
    # a dynamo backend's callable takes the flat inputs and returns a tuple/list of outputs
    def call(*args):
        out = fn(*args)
        return out if isinstance(out, (tuple, list)) else (out,)
    return call


@contextlib.contextmanager
def _quiet():
    # graph-break warnings are expected on this road: the capture note already says so
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import logging
        log = logging.getLogger("torch._dynamo")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            yield
        finally:
            log.setLevel(level)


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text[:limit] + ("..." if len(text) > limit else "")


def val(node):
    """The FakeTensor (or value) a node produces, or None."""
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def tensor_meta(node) -> dict | None:
    """{shape, dtype, stride, device} of a node's tensor value, plain Python, or None."""
    v = val(node)
    if not isinstance(v, torch.Tensor):
        return None
    try:
        return {"shape": tuple(int(s) for s in v.shape), "dtype": v.dtype,
                "stride": tuple(int(s) for s in v.stride()), "device": v.device.type}
    except Exception:                     # symbolic sizes: not a static graph
        return None


__all__ = ["Capture", "Graph", "capture", "export_graph", "val", "tensor_meta"]
