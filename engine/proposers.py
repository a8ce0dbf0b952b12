"""Proposers only propose: they read a target's history and return a candidate with a hypothesis.

They never time, verify or write to the database. ``search`` is the embedded default: a seeded local
search over the family's space of variants, starting at the family's starter kernel and mutating the
current best by one or two parameters at a time, never proposing the same source twice.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

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
        keys = [k for k, vals in family.space.items() if len(vals) > 1]
        for attempt in range(200):
            n_changes = 1 if rng.random() < 0.65 or attempt > 150 else 2
            point = dict(base)
            changed = []
            for k in rng.sample(keys, min(n_changes, len(keys))):
                choices = [v for v in family.space[k] if v != base[k]]
                point[k] = rng.choice(choices)
                changed.append(f"{k} {base[k]}->{point[k]}")
            if attempt > 120:  # the neighbourhood is used up: jump anywhere in the space
                point = {k: rng.choice(v) for k, v in family.space.items()}
                changed = ["random restart"]
            src = family.render(point)
            if source_hash(src) not in tried:
                parent = best["id"] if best else None
                what = ", ".join(changed)
                return Proposal(src, f"{what} (from {'#' + str(best['seq']) if best else 'starter'})",
                                params=point, parent_id=parent)
        raise SpaceExhausted(f"{family.name}: no untried point found in its search space")


class SpaceExhausted(RuntimeError):
    pass


def make(name: str, seed: int = 0, **options):
    if name == "search":
        return SearchProposer(seed)
    raise ValueError(f"unknown proposer {name!r}; known: search")
