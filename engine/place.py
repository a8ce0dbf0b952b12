"""Place verified kernels by rewriting the captured graph.

``place(capture, kernels)`` matches the families in every captured graph again (engine/match.py)
and, for each match a kernel was verified for (same family, same contract spec, the exact family
shape, dtype and device), replaces the matched subgraph with one call of the kernel; each
fusible region beside the matches (engine/regions.py) that a region kernel was verified for
becomes one call the same way, its inputs the kernel's arguments:

    [views of the match's inputs] -> site_call(site, *kernel args) -> [post ops] -> consumers

(engine/kernel_runtime.py ``site_call``: the kernel eagerly, its custom op under torch.compile).
The views are the ones the family's ``from_match`` asked for (a linear's weight transposed, a
causal rotary table's batch row, a norm's weight flattened); the post ops put the result in the
shape and dtype the consumers read (a GEMM's folded rows unfolded, a bias added back, a loss
cast to the logits' dtype). Nodes of the match nothing reads any more are removed; the rest of
the graph is untouched. A match no kernel serves keeps its original ops, and ``skipped`` says
why (the profile and the report quote it).

``optimized(capture, placement, compile_mode)`` is the model that runs the rewritten graphs:
eagerly (``compile_mode=None``) or through torch.compile with the kernels opaque to inductor;
inputs with other shapes or dtypes than the captured ones run the original model
(kernel_runtime.Optimized).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

import kernels as families
from engine import capture as cap
from engine import kernel_runtime as rt
from engine import match
from kernels.patterns import Ref

aten = torch.ops.aten

# aten ops for the views and post ops a Fit names (kernels/patterns.py Ref.views, Fit.post)
_VIEW_ATEN = {
    "t": lambda x: (aten.t.default, (x,)),
    "reshape": lambda x, s: (aten.reshape.default, (x, list(s))),
    "select": lambda x, d, i: (aten.select.int, (x, d, i)),
    "squeeze": lambda x, d: (aten.squeeze.dim, (x, d)),
    "unsqueeze": lambda x, d: (aten.unsqueeze.default, (x, d)),
    "transpose": lambda x, a, b: (aten.transpose.int, (x, a, b)),
    # aten.clone keeps a transposed input's strides (preserve_format): contiguous() does not
    "contiguous": lambda x: (aten.contiguous.default, (x,)),
    "to": lambda x, d: (aten.to.dtype, (x, getattr(torch, d) if isinstance(d, str) else d)),
    "long": lambda x: (aten.to.dtype, (x, torch.int64)),
    "expand": lambda x, s: (aten.expand.default, (x, list(s))),
    "slice": lambda x, d, a, b: (aten.slice.Tensor, (x, d, a, b)),
    "permute": lambda x, p: (aten.permute.default, (x, list(p))),
    "view_as_real": lambda x: (aten.view_as_real.default, (x,)),
    "repeat_interleave": lambda x, r, d: (aten.repeat_interleave.self_int, (x, r, d)),
    "repeat": lambda x, r: (aten.repeat.default, (x, list(r))),
}


@dataclass
class Placement:
    graphs: list                               # rewritten GraphModules, one per captured graph
    sites: list = field(default_factory=list)    # {"family", "spec", "shape", "kernel", "site", "pattern"}
    skipped: list = field(default_factory=list)  # {"family", "spec", "shape", "why", "pattern"}

    def record(self, row: dict, k, ok: bool, why: str) -> None:
        """A rewrite's outcome: a site (``why`` names it) or a skip with its reason."""
        if ok:
            self.sites.append(dict(row, kernel=k.name, site=why))
        else:
            self.skipped.append(dict(row, why=why))

    def families(self) -> dict:
        out: dict = {}
        for s in self.sites:
            out[s["kernel"]] = out.get(s["kernel"], 0) + 1
        return out


def _fake_mode(gm: fx.GraphModule):
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor) and hasattr(v, "fake_mode"):
            return v.fake_mode
    return None


def _meta_tuple(v) -> tuple | None:
    if not isinstance(v, torch.Tensor):
        return None
    return (tuple(int(s) for s in v.shape), v.dtype, tuple(int(s) for s in v.stride()), v.device.type)


def _kernel_for(kernels: list, m: match.Match, dtype, device_type):
    """(kernel, the Fit it serves): for the match's own contract, else for its fallback (a
    fused residual's plain norm, where only the plain norm has a kernel: a run recorded before
    the fusion existed), else (None, None)."""
    for fit in (m.fit, m.fit.fallback):
        for k in kernels:
            if fit is not None and k.family == m.family and k.serves(fit.spec, fit.shape, dtype,
                                                                      device_type):
                return k, fit
    return None, None


def _live(env: dict, src: fx.Node):
    """What the rewritten graph holds for the original node ``src``. A match reads its inputs
    through casts and aliases (match.transparent): its input can be a node inside a site placed
    before it (Falcon's LM head reads the final layer norm through an alias: the layer norm's
    site replaced the alias and removed the node behind it). Then the site's result stands for
    it, when it is the same value (the aliases in between keep shape and dtype)."""
    node = env.get(src, src)
    at = src
    while isinstance(node, fx.Node) and getattr(node, "_erased", False):
        nxt = [u for u in at.users if match.transparent(u)]
        if len(nxt) != 1:
            break
        at = nxt[0]
        cand = env.get(at, at)
        want, got = src.meta.get("val"), getattr(cand, "meta", {}).get("val")
        if not (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)
                and want.shape == got.shape and want.dtype == got.dtype):
            break                         # not the same value: the caller refuses the site
        node = cand
    return node


def _rewrite_one(g: fx.Graph, env: dict, m: match.Match, k: rt.Kernel, mode,
                 fit=None) -> tuple[bool, str]:
    """Replace the copy of match ``m`` in ``g`` (``env``: original node -> copy) by a site
    computing ``fit`` (default: the match's own)."""
    fit = fit or m.fit
    fam = families.get(m.family, fit.spec or None)
    out_orig = env[m.output]
    args, metas = [], []
    with g.inserting_before(out_orig):
        for name in fam.arg_names:
            ref = fit.args[name]
            if ref.name is None:
                args.append(ref.value)
                metas.append(None)
                continue
            src = m.node(ref.name)
            node = _live(env, src) if isinstance(src, fx.Node) else src
            if isinstance(node, fx.Node) and getattr(node, "_erased", False):
                return False, f"the argument {name} went with a site placed before this one"
            for v in ref.views:
                target, vargs = _VIEW_ATEN[v[0]](node, *v[1:])
                node = cap.emit(g, target, vargs, mode)
            args.append(node)
            metas.append(_meta_tuple(node.meta.get("val")) if isinstance(node, fx.Node) else None)
        if any(isinstance(a, fx.Node) and a.meta.get("val") is None for a in args):
            return False, "no shape information for an argument of the kernel"
        y, site = _site_node(g, fam, k, args, metas, mode)
        if y is None:
            return False, site
        result = y
        for op in fit.post:
            name, rest = op[0], op[1:]
            if name == "add":
                other = rest[0]
                if isinstance(other, Ref):
                    src = m.node(other.name)
                    other = _live(env, src)
                y = cap.emit(g, aten.add.Tensor, (y, other), mode)
            else:
                target, vargs = _VIEW_ATEN[name](y, *rest)
                y = cap.emit(g, target, vargs, mode)
        handed = _hand_on(g, env, m, fit, result, mode)
    if isinstance(handed, str):
        _drop(g, y)
        return False, handed
    ok, why = _swap(g, env, m.output, m.nodes, y, site)
    if ok:
        env.update(handed)        # later sites that read the sum read the kernel's copy of it
    return ok, why


def _hand_on(g: fx.Graph, env: dict, m: match.Match, fit, result: fx.Node, mode):
    """The match's other outputs (kernels/patterns.py ``Fit.outputs``: a fused residual add's
    sum): each of their readers outside the match reads the kernel's result, through the
    Fit's views, instead. {original node: its replacement}, or why not (the graph is left as
    it was): a reader that runs before the kernel, or a view that is not the same value."""
    inside = {env.get(n) for n in m.nodes}
    order = {n: i for i, n in enumerate(g.nodes)}
    out, moves = {}, []

    def refuse(why):
        for _, v, _ in moves:
            _drop(g, v)
        return why
    for name, views in fit.outputs:
        src = m.node(name)
        old = env.get(src)
        if old is None or getattr(old, "_erased", False):
            return refuse(f"the value {name} went with a site placed before this one")
        alias = match.aliases(src)
        same = [old] + [env[a] for a in alias if a in env]
        readers = [(u, x) for x in same for u in x.users if u not in inside]
        if any(order[u] < order[result] for u, _ in readers):
            return refuse(f"the value {name} is read before the kernel would run")
        v = result
        for view in views:
            target, vargs = _VIEW_ATEN[view[0]](v, *view[1:])
            v = cap.emit(g, target, vargs, mode)
        moves.append((old, v, readers))
        want = old.meta.get("val")
        if not _same_value(want, v.meta.get("val")):
            return refuse(f"the kernel's copy of {name} is not the value the graph reads")
        v.meta["orig_val"] = want
        out.update((a, v) for a in [src] + alias)
    for _, v, readers in moves:
        for u, x in readers:
            u.replace_input_with(x, v)
    return out


def _same_value(want, got) -> bool:
    """Whether the fake value ``got`` can stand where the graph read ``want``: both tensors, of
    one shape and dtype."""
    return (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)
            and tuple(want.shape) == tuple(got.shape) and want.dtype == got.dtype)


def _swap(g: fx.Graph, env: dict, output: fx.Node, nodes: list, y: fx.Node, site: int):
    """Let the graph read ``y`` (the site's result) where it read ``output``'s copy, and drop
    the replaced nodes nothing reads any more."""
    out_orig = env[output]
    want, got = out_orig.meta.get("val"), y.meta.get("val")
    if not _same_value(want, got):
        _drop(g, y)
        return False, (f"the kernel's result would be {tuple(getattr(got, 'shape', ()))} "
                       f"{getattr(got, 'dtype', None)}, the graph reads {tuple(getattr(want, 'shape', ()))} "
                       f"{getattr(want, 'dtype', None)}")
    y.meta["orig_val"] = want     # the layout the graph's readers were written for
    out_orig.replace_all_uses_with(y)
    # the replaced nodes nothing reads any more go, the output's copy first (so env must still
    # map the output to it here: else the original op runs beside the kernel, unread); the
    # rest of the graph stays as it was
    for n in reversed(nodes):
        c = env.get(n)
        if c is not None and c.graph is g and not c.users:
            g.erase_node(c)
    env[output] = y               # later sites that read this output read the kernel's result
    return True, f"site {site}"


def _rewrite_region(g: fx.Graph, env: dict, r, k: rt.Kernel, mode) -> tuple[bool, str]:
    """Replace the copy of region ``r`` (engine/regions.py) by a site: its inputs in0, in1, ...
    are the kernel's arguments as the graph has them (the kernel was verified on the layouts
    the graph passes: the site guards them)."""
    fam = families.get("region", r.spec)
    out_orig = env[r.output]
    args = [env.get(n, n) for n in r.inputs]
    if any(not isinstance(a, fx.Node) or a.meta.get("val") is None for a in args):
        return False, "no shape information for an input of the region"
    metas = [_meta_tuple(a.meta["val"]) for a in args]
    with g.inserting_before(out_orig):
        y, site = _site_node(g, fam, k, args, metas, mode)
    if y is None:
        return False, site
    return _swap(g, env, r.output, r.nodes, y, site)


def _site_node(g: fx.Graph, fam, k: rt.Kernel, args: list, metas: list, mode):
    """(the site_call node, its site id), or (None, why not): what the kernel returns is the
    family's reference under its contract on fake inputs."""
    try:
        with mode:
            fake_out = fam.reference(**{n: cap.fake_of(a) for n, a in zip(fam.arg_names, args)})
    except Exception as e:
        return None, f"the {fam.name} reference does not run on these inputs: {type(e).__name__}"
    shape = tuple(int(s) for s in fake_out.shape)
    stride = rt.ordered_strides(shape, fam.out_order)
    site = rt.add_site(k, tuple(metas), (shape, fake_out.dtype, stride))
    y = g.call_function(rt.site_call, (site,) + tuple(args))
    with mode:                                       # what site_call returns
        y.meta["val"] = torch.empty_strided(shape, stride, dtype=fake_out.dtype, device=fake_out.device)
    return y, site


def _region_plan(graph: cap.Graph, ms: list, region_kernels: list) -> tuple[list, set]:
    """([(region, its kernel or None)], ids of the family matches to leave out): the regions of
    ``graph`` beside the matches ``ms``; a match a GEMM region absorbed (engine/regions.py) is
    left out where that region has a kernel, and placed by its family's kernel where not."""
    from engine import regions
    found = regions.find(graph, ms)
    plan = []
    for r in found.regions:
        meta = cap.tensor_meta(r.inputs[0]) if r.inputs else None
        device_type = meta["device"] if meta else "cpu"
        plan.append((r, next((x for x in region_kernels
                              if x.serves(r.spec, r.shape, r.dtype, device_type)), None)))
    placed = {n for r, k in plan if k is not None for n in r.nodes}
    return plan, {id(m) for m in found.absorbed if set(m.nodes) & placed}


def _place_regions(g: fx.Graph, env: dict, plan: list, mode, out: "Placement") -> None:
    """Each region a region kernel was verified for becomes one site; the others keep their ops
    (a GEMM among them that its family's kernel replaced is no region any more)."""
    for r, k in plan:
        row = {"family": "region", "spec": r.spec, "pattern": r.name, "shape": list(r.shape)}
        if k is None:
            out.skipped.append(dict(row, why="no kept kernel verified for this region"))
            continue
        out.record(row, k, *_rewrite_region(g, env, r, k, mode))


def _drop(g: fx.Graph, node: fx.Node) -> None:
    """Remove ``node`` and the nodes inserted for it (they have no other reader)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.users or n.op != "call_function":
            continue
        ins = list(n.all_input_nodes)
        g.erase_node(n)
        stack.extend(i for i in ins if i.op == "call_function" and not i.users
                     and (i.target in (rt.site_call,) or "val" in i.meta))


def _val(a):
    return a.meta.get("val") if isinstance(a, fx.Node) else a


def _changed(old, new) -> bool:
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        return (tuple(old.shape) != tuple(new.shape) or old.dtype != new.dtype
                or not rt.same_layout(tuple(old.shape), tuple(old.stride()), tuple(new.stride())))
    return True


# ops that hold on some layouts only: a view valid on the original layout may fail on the
# one a site returns (its values, where it holds, do not depend on the layout); as_strided
# (handled apart) reads memory, not values, and always needs the original strides
_VIEWS = {aten.view.default, aten._unsafe_view.default}
_STRIDED_READS = {aten.view_as_complex.default, aten.view_as_real.default}


def _fake_run(n: fx.Node, mode):
    """``n``'s value computed again from its inputs' (fake) values, or None where it fails."""
    from torch.utils._pytree import tree_map
    try:
        with mode:
            return n.target(*tree_map(_val, n.args), **tree_map(_val, n.kwargs))
    except Exception:
        return None


def _dense(shape, stride) -> bool:
    """Does ``stride`` lay ``shape`` out with no gap and no element twice?"""
    from engine.verify import overlaps
    span = 1 + sum((n - 1) * abs(st) for n, st in zip(shape, stride) if n > 1)
    return not overlaps(shape, stride) and span == max(1, torch.Size(shape).numel())


def _restride(g: fx.Graph, n: fx.Node, mode) -> None:
    """Give ``n``'s first input back the layout it had in the original graph, where a site
    upstream changed it: a copy into those strides (empty_strided + copy_), which is what the
    original op had written; ``n`` then reads that copy."""
    x = n.args[0]
    old = x.meta.get("orig_val", x.meta.get("val"))
    cur = x.meta.get("val")
    if (not isinstance(old, torch.Tensor) or not isinstance(cur, torch.Tensor)
            or rt.same_layout(tuple(cur.shape), tuple(old.stride()), tuple(cur.stride()))
            or not _dense(tuple(old.shape), tuple(old.stride()))):
        return
    with g.inserting_before(n):
        y = g.call_function(rt.restrided, (x, tuple(int(s) for s in old.shape),
                                           tuple(int(s) for s in old.stride())))
    with mode:
        y.meta["val"] = rt.restrided(cur, tuple(old.shape), tuple(old.stride()))
    n.replace_input_with(x, y)


def _repropagate(g: fx.Graph, mode) -> None:
    """Fake values downstream of the sites again: a kernel returns its result contiguous where
    the replaced op may have returned another layout, and every later guard must hold the strides
    the graph will really pass (a rotary site's output is the next attention site's q)."""
    if mode is None:
        return
    dirty = set()
    for n in g.nodes:
        if n.op != "call_function":
            continue
        if n.target is rt.site_call:
            site = rt.SITES[n.args[0]]
            site.args = tuple(_meta_tuple(_val(a)) if isinstance(a, fx.Node) else None
                              for a in n.args[1:])
            site.op = rt._site_op(site)
            dirty.add(n)
            continue
        if not any(i in dirty for i in n.all_input_nodes):
            continue
        old = n.meta.get("val")
        if n.target is aten.as_strided.default:
            _restride(g, n, mode)   # reads memory, not values: the original strides back
        new = _fake_run(n, mode)
        if new is None and n.target in _VIEWS:
            # valid on the original layout only (a view after a permute of attention's output,
            # which CPU's SDPA returns [B, S, H, D]-major): a reshape holds the same values,
            # copied where this layout needs it
            n.target = aten.reshape.default
            new = _fake_run(n, mode)
        elif new is None and n.target in _STRIDED_READS:
            _restride(g, n, mode)
            new = _fake_run(n, mode)
        if new is None:
            continue
        if _changed(old, new):      # else the value keeps its strides (the real run's)
            n.meta.setdefault("orig_val", old)
            n.meta["val"] = new
            dirty.add(n)


def place(capture: cap.Capture, kernels: list, matches: dict | None = None,
          families=None) -> Placement:
    """Rewrite each captured graph with the ``kernels`` (rt.Kernel, loaded with their spec and
    schema) that serve its matches (found here, among ``families``, when not given); the
    original GraphModules are left as they were."""
    out = Placement([])
    for graph in capture.graphs:
        ms = matches.get(graph.index) if matches is not None else None
        if ms is None:
            ms = match.find(graph, families=families)
        gm = graph.gm
        g = fx.Graph()
        env: dict = {}
        ret = g.graph_copy(gm.graph, env)
        g.output(ret)
        g._codegen = gm.graph._codegen
        mode = _fake_mode(gm)
        # regions (kernels/region.py): found beside the family matches, placed the same way
        region_kernels = [k for k in kernels if k.family == "region"]
        plan, absorbed = (_region_plan(graph, ms, region_kernels) if region_kernels
                          and mode is not None else ([], set()))
        for m in ms:
            row = {"family": m.family, "spec": (m.fit.spec if m.fit else {}), "pattern": m.pattern,
                   "shape": list(m.fit.shape) if m.fit else []}
            if id(m) in absorbed:
                continue                  # its op runs inside a region's kernel (below)
            if not m.placeable:
                out.skipped.append(dict(row, why=m.why_not or "no contract"))
                continue
            meta = m.meta(next((r.name for r in m.fit.args.values() if r.name is not None), None) or "")
            dtype = meta["dtype"] if meta else None
            device_type = meta["device"] if meta else "cpu"
            k, fit = _kernel_for(kernels, m, dtype, device_type)
            if k is None:
                have = [x.name for x in kernels if x.family == m.family]
                out.skipped.append(dict(row, why=(f"no kept kernel verified for this shape/spec "
                                                  f"(kept: {', '.join(have)})") if have else
                                        "no kept kernel of this family"))
                continue
            if mode is None:
                out.skipped.append(dict(row, why="the graph carries no fake tensors to guard on"))
                continue
            if fit is not m.fit:
                row = dict(row, spec=fit.spec)            # placed as its fallback contract
            out.record(row, k, *_rewrite_one(g, env, m, k, mode, fit))
        _place_regions(g, env, plan, mode, out)
        _repropagate(g, mode)
        g.lint()
        new = fx.GraphModule(gm, g)
        out.graphs.append(new)
    return out


def optimized(capture: cap.Capture, placement: Placement, compile_mode: str | None = None):
    """The model running the rewritten graphs: eagerly, or compiled with ``compile_mode``
    ("default", "max-autotune", ...; the kernels stay opaque custom ops)."""
    graphs = {g.index: new for g, new in zip(capture.graphs, placement.graphs)}

    def wrap(graph):
        gm = graphs[graph.index]
        if compile_mode is None:
            return gm
        return torch.compile(gm, mode=None if compile_mode == "default" else compile_mode,
                             dynamic=False)
    run = capture.runner(wrap)
    label = "rewritten graph" + (f", torch.compile({compile_mode})" if compile_mode else ", eager")
    return rt.Optimized(capture.model, run, capture.inputs, capture.kwargs, label)


__all__ = ["Placement", "place", "optimized"]


class Specializing(torch.nn.Module):
    """The optimized model for any input signature: the rewritten graph of each signature seen
    (captured, matched and placed on its first call: a zoo LM called with ids alone returns
    logits, with ids and targets a loss: two graphs), the original model where capture fails.
    ``placements`` maps each signature to its Placement (None: not captured)."""

    def __init__(self, model, kernels: list, compile_mode: str | None = None, first=None,
                 families=None):
        super().__init__()
        object.__setattr__(self, "original", model)
        object.__setattr__(self, "kernels", list(kernels))
        self.compile_mode = compile_mode
        self.families = families
        self.cache: dict = {}
        self.placements: dict = {}
        if first is not None:
            capture, matches = first
            self._add(rt._signature(capture.inputs, capture.kwargs), capture, matches)

    def _add(self, sig, capture, matches=None):
        if capture is None or not capture.ok:
            self.cache[sig], self.placements[sig] = None, None
            return
        pl = place(capture, self.kernels, matches, self.families)
        # a signature no kernel serves runs the model itself, not a copy of its graph
        self.cache[sig] = optimized(capture, pl, self.compile_mode) if pl.sites else None
        self.placements[sig] = pl

    def forward(self, *args, **kwargs):
        sig = rt._signature(args, kwargs)
        if sig not in self.cache:
            self._add(sig, cap.capture(self.original, args, kwargs))
        mod = self.cache[sig]
        if mod is None:
            self.unplaced_calls += 1
            return self.original(*args, **kwargs)
        return mod.call(sig, args, kwargs)

    unplaced_calls = 0

    def stats(self) -> dict:
        return self.calls

    def remove(self) -> None:
        """Nothing to undo: the original model was never modified."""

    @property
    def calls(self) -> dict:
        out = {"placed": 0, "original": self.unplaced_calls, "guard_miss": 0}
        for m in self.cache.values():
            if m is not None:
                for k, v in m.calls.items():
                    out[k] += v
        return out
