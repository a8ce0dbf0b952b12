"""How a family file says which subgraphs compute it: spellings, and what a match fixes.

A ``Spelling`` is a small function written the way model code writes the operation
(``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w``). The engine traces it to an aten
graph with example arguments (engine/match.py), the same way it traces a model, and looks for that
graph inside the model's graph. What the matcher is lenient about, so one spelling covers the
variants real code has:

- casts (``.float()``, ``.to(dtype)``), aliases, clones, ``contiguous()`` and dropout with p = 0
  between the spelled ops, and upcasts in front of an input, are looked through; casts right
  after the output join the match (HF's norms compute in fp32 and cast back);
- ``add`` and ``mul`` match in either argument order; a ``Tensor`` and a ``Scalar`` overload of
  the same arithmetic op are the same op;
- scalar arguments named by ``Scalar("eps")`` are captured, whatever their value (the spelling is
  traced with a sentinel value that marks where they sit);
- dims of reductions, softmax, cat, slices and transposes compare counted from the end (``-1`` on
  a rank-2 example matches ``2`` on a rank-3 model tensor); with ``free_dims=True`` the reduction
  dims are captured instead (``m.captures["dims"]``: the same set at every reduction of the
  spelling), for norms and sums over any dim set;
- sizes in view/reshape/expand are not compared (``from_match`` checks them from the shapes it
  reads); slice bounds compare as small offsets from either end or as fractions of the dim;
- op arguments named in ``loose`` (``weight``, ``is_causal``, ...) are captured as they are,
  node or literal, so one spelling covers every combination and ``from_match`` decides.

A family file lists its spellings in ``SPELLINGS`` and gives ``from_match(m)``: what the match
means under the family's contract (a ``Fit``: the spec, the family shape, each kernel argument as
a ``Ref`` to a matched input), ``NoFit(why)`` when it is the family but no contract serves it
(recorded, with the reason, under the family in the profile), or None when it only looks like
the family (a decoy). The ``Match`` object it gets (engine/match.py) offers ``meta(name)``
(shape, dtype, stride of a bound input), ``const(name)`` (the input's value when it is a
constant of the model, e.g. a causal-mask buffer) and ``scalar(name)`` (a captured number).

This module imports torch only: family files import it, and nothing of the engine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class T:
    """An example tensor argument of a spelling: its shape, dtype ("float32", "bool", "int64")."""
    shape: tuple
    dtype: str = "float32"


@dataclass(frozen=True)
class Scalar:
    """A scalar argument the match captures (eps, a scale, a count), traced with a sentinel."""
    name: str
    kind: str = "float"          # "float" | "int"


@dataclass(frozen=True)
class Spelling:
    name: str                    # e.g. "rsqrt_mean", unique within its family
    fn: Callable                 # the spelling: positional arguments as in ``args``
    args: tuple                  # (("x", T((4, 8))), ("w", T((8,))), ("eps", Scalar("eps"))), ...
    free_dims: bool = False      # reduction dims captured as "dims" instead of compared
    # schema names of op arguments captured as they are (a node or a literal) instead of compared:
    # ("weight", "bias", "is_causal", "scale", ...); from_match reads them as m.captures[name]
    loose: tuple = ()
    note: str = ""


@dataclass(frozen=True)
class Ref:
    """One kernel argument of a placement: the matched input ``name`` (a pattern argument)
    with ``views`` applied in order (aten view ops by name: ("t",), ("reshape", [-1]),
    ("select", 0, 0), ("squeeze", 1), ("transpose", 1, 2)), or a literal ``value``."""
    name: str | None = None
    views: tuple = ()
    value: object = None

    @staticmethod
    def lit(value) -> "Ref":
        return Ref(None, (), value)


@dataclass
class Fit:
    """What a match means under the family's contract."""
    spec: dict                   # {} for the plain contract; JSON
    shape: tuple                 # the family shape (kernels/<family>.py convention)
    args: dict                   # kernel argument name -> Ref
    post: tuple = ()             # ops after the kernel, e.g. (("add", Ref("bias")), ("reshape", [..]))
    note: str = ""
    # Values the model reads beside the match's output that the kernel computes too:
    # ((input name, views), ...). The node bound to the name joins the match, and its readers
    # outside it read the kernel's result with the views applied instead (a residual add
    # x + r feeding an RMSNorm: the fused kernel writes the sum beside the norm, out[0] and
    # out[1], and the next residual add reads out[0]).
    outputs: tuple = ()
    # The contract to place where no kernel serves this one: a fused residual norm's plain
    # norm of the sum (its add left as it is), for a run whose kept kernel is the plain norm's
    fallback: "Fit | None" = None


class NoFit(Exception):
    """The match is the family, but no contract of it serves this case; the message says why."""


# ---- helpers family files share ------------------------------------------------------------

def from_end(dims, rank: int) -> tuple:
    """Dims as negative indices (counted from the end), sorted: (1,) on rank 3 -> (-2,)."""
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted(int(d) - rank if int(d) >= 0 else int(d) for d in dims))


def trailing_run(dims: tuple) -> bool:
    """(-3, -2) and (-1,) are runs of adjacent dims; (-3, -1) is not."""
    return bool(dims) and list(dims) == list(range(dims[0], dims[0] + len(dims)))


def odi(shape, dims: tuple) -> tuple[int, int, int]:
    """[O, D, I] view of ``shape`` for a reduction over the adjacent ``dims`` (from the end):
    O the dims before, D the reduced ones, I the ones after."""
    shape = tuple(int(s) for s in shape)
    r = len(shape)
    lo, hi = r + dims[0], r + dims[-1] + 1
    return math.prod(shape[:lo]), math.prod(shape[lo:hi]), math.prod(shape[hi:])


def residual_fit(m, pair, spec: dict, shape, args: dict) -> Fit:
    """A norm's Fit (``spec``, ``shape``, ``args`` with x the norm's input) as the fused residual
    contract, where x is the sum ``pair`` = (a, b, add) (``m.sum_of("x")``): the kernel reads a as x
    and b as ``residual`` and returns [h; y]; y goes on to the norm's readers (select 0, 1), h
    to the sum's (``outputs``); the plain fit of the norm of h is the fallback."""
    a, b, add = pair
    m.rebind("h", m.node("x"))
    m.rebind("x", a, through=[add] if add is not None else [])
    m.rebind("r", b)
    # under a view of the sum (OPT's), both terms are read through the view's shape
    views = (("reshape", [int(d) for d in m.node("h").meta["val"].shape]),) if add is not None else ()
    plain = Fit(spec, tuple(shape), dict(args, x=Ref("h")))
    return Fit(dict(spec, residual=True), tuple(shape), dict(args, x=Ref("x", views), residual=Ref("r", views)),
               post=(("select", 0, 1),), outputs=(("h", (("select", 0, 0),)),), fallback=plain)


def spec_key(spec: dict | None) -> str:
    """The canonical text of a spec: how targets, kernels and sites are joined."""
    import json
    return json.dumps(spec or {}, sort_keys=True)


__all__ = ["T", "Scalar", "Spelling", "Ref", "Fit", "NoFit", "from_end", "trailing_run", "odi",
           "residual_fit", "spec_key"]
