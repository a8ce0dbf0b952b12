"""The planner: Amdahl's law decides what to work on next.

projected end-to-end speedup = 1 / ((1 - sum f) + sum f / s), with f a family's share of the model's
time and s its kernel speedup over eager (a kernel slower than eager is never swapped in, so s >= 1).
The next target is the one with the most end-to-end time still to win: f x (1 - speed of light /
current best). A target rests after ``patience`` experiments in a row without improvement, or when
it is within 10% of its speed of light; when every target rests, they all come back for another round.
"""
from __future__ import annotations

NEAR_SOL = 1.10


def amdahl(parts) -> float:
    """parts: iterable of (fraction f, speedup s). Returns the projected end-to-end speedup."""
    parts = [(f, max(1.0, s or 1.0)) for f, s in parts]
    covered = sum(f for f, _ in parts)
    denom = (1.0 - covered) + sum(f / s for f, s in parts)
    return 1.0 / denom if denom > 0 else float("inf")


def projected(targets: list[dict]) -> float:
    return amdahl((t["fraction"], t.get("speedup") or 1.0) for t in targets)


def current_latency(t: dict) -> float | None:
    return t.get("best_latency_us") or t.get("ref_latency_us")


def near_sol(t: dict) -> bool:
    best, sol = t.get("best_latency_us"), t.get("sol_latency_us")
    return bool(best and sol and best <= sol * NEAR_SOL)


def gain_left(t: dict) -> float | None:
    """Fraction of end-to-end time this target could still save; None without a roofline."""
    cur, sol = current_latency(t), t.get("sol_latency_us")
    if not cur or not sol:
        return None
    return t["fraction"] * max(0.0, 1.0 - sol / cur)


def choose_next(targets: list[dict], patience: int) -> tuple[dict | None, str, bool]:
    """(target, why, new_round). new_round=True means every target rested: reset their streaks."""
    open_ = [t for t in targets if t["state"] != "done" and not near_sol(t)]
    if not open_:
        return None, "every target is within 10% of its speed of light", False
    fresh = [t for t in open_ if t["no_improve"] < patience]
    new_round = not fresh
    pool = fresh or open_

    def score(t):
        g = gain_left(t)
        return (g if g is not None else t["fraction"], -t["experiments"])

    t = max(pool, key=score)
    return t, reason(t, new_round), new_round


def reason(t: dict, new_round: bool = False) -> str:
    parts = [f"{t['family']}: {t['fraction']:.1%} of model time"]
    if t.get("speedup"):
        parts.append(f"best {t['speedup']:.2f}x eager")
    g = gain_left(t)
    if g is not None:
        parts.append(f"{100 * t['sol_latency_us'] / current_latency(t):.0f}% of speed of light, "
                     f"up to {g:.1%} of end-to-end time left")
    else:
        parts.append("largest share among open targets (no GPU roofline under the interpreter)")
    if t["experiments"] == 0:
        parts.append("not tried yet")
    if new_round:
        parts.append("every target rested: new round")
    return "; ".join(parts)
