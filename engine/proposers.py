"""Proposers only propose: they read a target's history and return a candidate with a hypothesis.

They never time, verify or write to the database. ``search`` is the embedded default: a seeded local
search over the family's space of variants, starting at the family's starter kernel, then the
family's openers (its structural choices worth trying first), then mutating the current best by one
or two parameters at a time, never proposing the same source twice.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from engine.verify import source_hash


@dataclass
class Proposal:
    source: str
    hypothesis: str
    params: dict | None = None
    parent_id: int | None = None
    proposer: str = "search"
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None
    # A proposal that failed before there was a candidate (an LLM reply with no code block, a
    # refused request...): the loop records it as failed at stage "proposal", at no device cost.
    error: str | None = None
    latency_s: float | None = None


class SearchProposer:
    name = "search"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def propose(self, family, history: list[dict], best: dict | None) -> Proposal:
        """history: this target's experiments (params, source_hash, state), oldest first.
        best: the kept experiment currently best, or None."""
        if not history:
            return Proposal(family.starter(), "starter kernel for " + family.name,
                            params=dict(family.default))
        tried = {h["source_hash"] for h in history}
        # Deterministic given (seed, family, how far the target got): a resumed run continues
        # exactly where it would have gone.
        rng = random.Random(f"{self.seed}:{family.name}:{len(history)}")
        base = dict(best["params"]) if best and best.get("params") else dict(family.default)
        base = {k: base.get(k, family.default[k]) for k in family.space}
        parent = best["id"] if best else None
        for change in getattr(family, "openers", ()):
            point = dict(base, **change)
            if point == base or any(v not in family.space.get(k, (v,)) for k, v in change.items()):
                continue                 # a no-op, or a point outside the space: never rendered
            src = family.render(point)
            if source_hash(src) not in tried:
                what = ", ".join(f"{k} {base[k]}->{v}" for k, v in change.items() if base[k] != v)
                return Proposal(src, f"{what} (opener, from {'#' + str(best['seq']) if best else 'starter'})",
                                params=point, parent_id=parent)
        keys = [k for k, vals in family.space.items() if len(vals) > 1]
        bad = losing_moves(history)
        for attempt in range(200):
            n_changes = 1 if rng.random() < 0.65 or attempt > 150 else 2
            point = dict(base)
            changed = []
            for k in rng.sample(keys, min(n_changes, len(keys))):
                choices = [v for v in family.space[k] if v != base[k] and (k, v) not in bad]
                if not choices:
                    continue
                point[k] = rng.choice(choices)
                changed.append(f"{k} {base[k]}->{point[k]}")
            if attempt > 120:  # the neighbourhood is used up: jump anywhere in the space
                point = {k: rng.choice(v) for k, v in family.space.items()}
                changed = ["random restart"]
            src = family.render(point)
            if source_hash(src) not in tried:
                what = ", ".join(changed)
                return Proposal(src, f"{what} (from {'#' + str(best['seq']) if best else 'starter'})",
                                params=point, parent_id=parent)
        raise SpaceExhausted(f"{family.name}: no untried point found in its search space")


# A one-parameter move that made its parent this much slower, or that failed the verifier, is
# not proposed again as a mutation (random restarts still reach it): on the H200 a fp32 GEMM
# target spent two of its six experiments on such moves (block_m 128->32 at 2.6x slower; the
# operand split tf32x3_split at 1.16x), in budgets that hold six.
LOSING_RATIO = 1.3
_NOT_THE_KERNELS_FAULT = (None, "worker", "proposal", "recheck")


def losing_moves(history: list[dict]) -> set:
    """{(param, value)}: single-parameter moves from a parent that lost (LOSING_RATIO slower than
    the parent, or failed a verifier stage; a worker's death or a proposal error says nothing of
    the point)."""
    by_id = {h["id"]: h for h in history if h.get("id") is not None}
    bad = set()
    for h in history:
        parent = by_id.get(h.get("parent_id"))
        if parent is None or not h.get("params") or not parent.get("params"):
            continue
        diff = [(k, v) for k, v in h["params"].items() if parent["params"].get(k) != v]
        if len(diff) != 1:
            continue
        failed = h.get("state") == "failed" and h.get("failed_stage") not in _NOT_THE_KERNELS_FAULT
        slower = (h.get("latency_us") and parent.get("latency_us")
                  and h["latency_us"] > LOSING_RATIO * parent["latency_us"])
        if failed or slower:
            bad.add(diff[0])
    return bad


class SpaceExhausted(RuntimeError):
    pass


class ProposerStopped(RuntimeError):
    """The proposer will propose nothing more in this run (an LLM token or cost cap was reached,
    or the model rejected the key): the loop ends the run cleanly with an event saying why."""


@dataclass
class ProposalContext:
    """What a proposer with ``takes_context = True`` gets besides the target's history."""
    run: dict | None = None            # the run row: device, ceilings, timing_mode
    target: dict | None = None         # the target row: dtype, shapes, reference and SOL times
    experiments: list = field(default_factory=list)   # the whole run's experiments, no sources
    stop: object = None                # the run's stop Event: a proposer waiting on a model checks it


NAMES = ("search", "llm", "hybrid")


def make(name: str, seed: int = 0, cfg=None, api_key: str | None = None):
    """The proposer ``name``. "llm" and "hybrid" read their settings from ``cfg`` (a RunConfig);
    ``api_key`` (e.g. from the dashboard's secrets) overrides litellm's environment variables."""
    if name == "search":
        return SearchProposer(seed)
    if name in ("llm", "hybrid"):
        from engine import llm   # litellm itself is imported only when a request is sent
        return llm.make(cfg, api_key=api_key, hybrid=name == "hybrid")
    raise ValueError(f"unknown proposer {name!r}; known: {', '.join(NAMES)}")
