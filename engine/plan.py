"""The planner: Amdahl's law decides what to work on next, against the baseline a user would run.

Every target has two references: PyTorch eager (``ref_latency_us``) and torch.compile of the same
op (``compile_latency_us``, the fastest of its modes, when it was timed). The **baseline** is the
faster of the two: a kernel counts as a gain only where it beats it, it is placed only then
(engine/integrate.py), and the reports say "slower than the baseline" otherwise.

projected end-to-end speedup = 1 / ((1 - sum f) + sum f / s), with f a target's share of the
model's time under the baseline and s its kernel's speedup over the baseline (a kernel slower than
its baseline is never placed, so s >= 1). f is the profiled (eager) share scaled by
baseline / eager: an op torch.compile already runs 3x faster takes a third of its eager share of
the compiled model.

The next target is the one with the most end-to-end time still to win: f x (1 - speed of light /
current), where current is the faster of the baseline and the best kernel. A target rests after
``patience`` experiments in a row without improvement, or when it is within 10% of its speed of
light and beats its baseline; when every target rests, they all come back for another round.
"""
from __future__ import annotations

NEAR_SOL = 1.10


def amdahl(parts) -> float:
    """parts: iterable of (fraction f, speedup s). Returns the projected end-to-end speedup."""
    parts = [(f, max(1.0, s or 1.0)) for f, s in parts]
    covered = sum(f for f, _ in parts)
    denom = (1.0 - covered) + sum(f / s for f, s in parts)
    return 1.0 / denom if denom > 0 else float("inf")


def baseline_us(t: dict) -> float | None:
    """The faster of eager and torch.compile of the target's op (eager alone until compile is timed)."""
    vals = [v for v in (t.get("ref_latency_us"), t.get("compile_latency_us")) if v]
    return min(vals) if vals else None


def baseline_name(t: dict) -> str:
    ref, comp = t.get("ref_latency_us"), t.get("compile_latency_us")
    if comp and (not ref or comp < ref):
        return f"torch.compile ({t.get('compile_mode') or 'best mode'})"
    return "eager"


def baseline_noise(t: dict) -> float:
    ref, comp = t.get("ref_latency_us"), t.get("compile_latency_us")
    if comp and (not ref or comp < ref):
        return t.get("compile_noise") or 0.0
    return t.get("ref_noise") or 0.0


def speedup_vs_baseline(t: dict) -> float | None:
    base, best = baseline_us(t), t.get("best_latency_us")
    return base / best if base and best else None


def beats_baseline(t: dict, min_margin: float = 0.01) -> tuple[bool, str]:
    """(True, "") when the target's best kernel is faster than its baseline by more than the
    noise of both timings (the loop's keep rule: engine/verify.not_faster), else (False, why)."""
    from engine.verify import not_faster
    best, base = t.get("best_latency_us"), baseline_us(t)
    if not best:
        return False, "no verified kernel"
    if not base:
        return True, ""
    why = not_faster(best, t.get("best_noise"), base, baseline_noise(t), min_margin)
    if why:
        return False, f"slower than its baseline, {baseline_name(t)} {base:.1f} us: {why}"
    return True, ""


def base_fraction(t: dict) -> float:
    """The target's share of the model's time under the baseline (see the module doc)."""
    ref, base = t.get("ref_latency_us"), baseline_us(t)
    f = t["fraction"]
    return f * base / ref if ref and base else f


def projected(targets: list[dict]) -> float:
    """Amdahl against the baseline: kernels that do not beat theirs count as not placed."""
    return amdahl((base_fraction(t), speedup_vs_baseline(t) if beats_baseline(t)[0] else 1.0)
                  for t in targets)


def projected_compiled(targets: list[dict], compile_us: float | None) -> float | None:
    """Amdahl for the compiled optimized model against torch.compile of the model: each placed
    target's share of compile's forward is its op's compiled time over ``compile_us`` (the
    measured compiled forward), sped up by its kernel against that compiled op. The eager-share
    projection (``projected``) leaves the rest of the model at eager's shares, which a compiled
    forward does not have: GPT-2 small (H200) projected 1.087x there and measured 1.426x
    compiled, where this one gives 1.41x. None without a compiled forward or compiled ops."""
    if not compile_us:
        return None
    parts = [(t["compile_latency_us"] / compile_us, t["compile_latency_us"] / t["best_latency_us"])
             for t in targets if beats_baseline(t)[0] and t.get("compile_latency_us")
             and t.get("best_latency_us")]
    return amdahl(parts) if parts else None


def current_latency(t: dict) -> float | None:
    vals = [v for v in (t.get("best_latency_us"), baseline_us(t)) if v]
    return min(vals) if vals else None


def near_sol(t: dict) -> bool:
    """The target's best is within 10% of its speed of light and beats its baseline. A kernel
    near the roofline that torch.compile still beats keeps its target open: on the H200,
    KernelBench's MinGPT GELU region stopped after its starter at 94% of the speed of light,
    0.983x compile's 96%, with two thirds of its budget left."""
    best, sol = t.get("best_latency_us"), t.get("sol_latency_us")
    return bool(best and sol and best <= sol * NEAR_SOL and beats_baseline(t)[0])


def gain_left(t: dict) -> float | None:
    """Fraction of end-to-end time this target could still save; None without a roofline."""
    cur, sol = current_latency(t), t.get("sol_latency_us")
    if not cur or not sol:
        return None
    return base_fraction(t) * max(0.0, 1.0 - sol / cur)


def choose_next(targets: list[dict], patience: int) -> tuple[dict | None, str, bool]:
    """(target, why, new_round). new_round=True means every target rested: reset their streaks."""
    open_ = [t for t in targets if t["state"] != "done" and not near_sol(t)]
    if not open_:
        return None, "every target is within 10% of its speed of light and beats its baseline", False
    fresh = [t for t in open_ if t["no_improve"] < patience]
    new_round = not fresh
    pool = fresh or open_

    def score(t):
        g = gain_left(t)
        return (g if g is not None else base_fraction(t), -t["experiments"])

    t = max(pool, key=score)
    return t, reason(t, new_round), new_round


def reason(t: dict, new_round: bool = False) -> str:
    parts = [f"{t['family']}: {t['fraction']:.1%} of model time"]
    if t.get("speedup"):
        parts.append(f"best {t['speedup']:.2f}x eager")
    if t.get("compile_latency_us") and t.get("best_latency_us"):
        parts.append(f"{t['compile_latency_us'] / t['best_latency_us']:.2f}x torch.compile")
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
