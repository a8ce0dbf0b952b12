"""The judge: decides what a candidate is worth, from a process no candidate code runs in.

It drives a runner (engine/worker.py) through the five stages and the benchmark, and keeps
everything a verdict rests on on its own side: the cases and their seeds, the expected outputs
(the family's reference on its own copies of the inputs, in float64), the comparison, the
machine's ceilings (measured by a runner before any candidate was loaded), the speed-of-light
bound and the checks on the timings. A runner sends outputs and timing samples; what it says
about itself is cross-checked from here:

- the wall clock: the judge times every batch of samples it asks for; device times that do not
  account for the wall time they took (a forged clock, a skipped kernel that still ran long)
  reject the candidate;
- a fresh process: a would-be best is timed again in a runner no candidate has touched (a spare
  started ahead of time), and the two timings must agree;
- the speed of light: faster than bytes / measured copy rate (or flops / matmul rate) is
  impossible.

The reply has the shape the loop expects: stages (one row each), failed_stage, error, restart,
timing (latency_us, noise, shape_times, sol_us, timing_mode) and, for a candidate timed but not
verified further because it is slower than the best (bench-first), gated.
"""
from __future__ import annotations

import time

import kernels
from engine import bench, verify

ROUNDS = 3
# Per timed call, what the protocol spends besides the call itself (on a GPU the L2 flush, the
# spin and the event sync, ~200 us on an H200; under the interpreter the host clock around the
# call, ~1 us). The rounds' own check allows twice the reported time plus this and a slack; the
# audit of a would-be best is the sharp one.
OVERHEAD_US = {"gpu": 300.0, "interpreter": 50.0}
BATCH_SLACK_S = 0.25
WALL_TRIES = 3        # batches in a row that must miss the wall clock before a verdict
# The audit: one batch sized from the claimed time to last AUDIT_S on the judge's clock; more
# than AUDIT_FACTOR times that (plus AUDIT_SLACK_S) and the claim is false. A call reported
# at 1 us that really takes 3.8 ms runs past the limit by a factor of ten: the judge stops
# waiting there.
AUDIT_S = 0.5
AUDIT_SLACK_S = 0.1
# how many times the claimed time a batch may take: on a GPU twice; under the interpreter the
# host's other processes (a second test worker on two cores) stretch an honest batch past two
# (seen: 11 calls of 43 ms in 1.04 s), and a false claim is off by ten or more
AUDIT_FACTOR = {"gpu": 2.0, "interpreter": 4.0}
AUDIT_MAX_CALLS = 20_000
# A would-be best timed again in a fresh runner must not be slower than its first timing by
# more than this (or three times the noise): else the first timing is not believed.
FRESH_AGREEMENT = 0.25
SOL_SLACK = 1.15
# After a case whose inputs or output are at least this large, the judge hands its cached GPU
# blocks back (the runners on the same GPU need them). A case whose inputs are this large and
# whose expected output is not judged in rows has that expected output computed after the
# runner's reply, not beside it: its float64 copies and temporaries take several times the
# inputs (KernelBench's HuberLoss, two 4 GiB inputs and a scalar output: on an 80 GB H100 the
# runner, computing beside it, ran out of memory in every candidate's smoke test).
BIG_CASE_BYTES = 1 << 28


class Rejected(Exception):
    """A candidate is out at ``stage``; ``restart`` when its runner must not be reused."""

    def __init__(self, stage: str, message: str, restart: bool = False):
        super().__init__(message)
        self.stage = stage
        self.restart = restart


class JudgeError(RuntimeError):
    """The runner refused a request of the judge's own making (an engine bug, not the
    candidate's fault)."""


def judge_device(worker) -> str:
    """The device the judge builds inputs and references on: the runner's GPU, seen from here."""
    if worker.interpret:
        return "cpu"
    return f"cuda:{worker.device_index}" if worker.device_index is not None else "cuda"


def _timing_mode(worker) -> str:
    return "interpreter" if worker.interpret else "gpu"


def _checked(reply: dict, stage: str) -> dict:
    if "ok" not in reply:
        raise JudgeError(f"the worker rejected the request: {reply.get('error')}")
    if not reply["ok"]:
        raise Rejected(stage, reply.get("error") or "failed", bool(reply.get("restart")))
    return reply


def _decode(meta: dict, buf, device: str):
    import torch
    dtype = getattr(torch, meta["dtype"])
    shape = tuple(meta["shape"])
    if len(buf) == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    t = torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(shape)
    return t.to(device, copy=True)      # a copy: the buffer is the runner's to overwrite


def judge_case(worker, fam, case: verify.Case, device: str, deadline: float,
               repeats: int = 1) -> float:
    """One case: the judge builds its inputs (the output buffer is sized from them before the
    runner starts), then computes the expected output while the runner runs, and compares.
    Returns the worst error; raises verify.CandidateError or Rejected."""
    inputs = verify.case_inputs(fam, case, device)
    native = verify.reference_meta(fam, inputs)
    # the output buffer is sized here, for the reference's outputs: a runner may not grow a
    # file past its sandbox's file-size limit (8 GB), and one 4096 x 393216 fp32 softmax
    # output is 6.4 GB (the runner compares determinism's repeats itself and sends the first)
    worker.reserve_shared(native.numel() * native.element_size())
    worker.send({"op": "call", "case": case.row(), "repeats": repeats})
    # a large case is judged in chunks of rows once its output is in (less memory); a small
    # one's reference is computed while the runner runs
    sliced = verify.case_slicer(fam, inputs, native) if native.numel() > verify.CHUNK_ELEMS else None
    in_bytes = sum(v.numel() * v.element_size() for v in inputs.values()
                   if hasattr(v, "element_size"))
    after = sliced is None and in_bytes >= BIG_CASE_BYTES
    exp = verify.expect(fam, case, device, inputs, native) if sliced is None and not after else None
    reply, payloads = worker.receive(deadline)
    if "ok" not in reply:
        raise JudgeError(f"the worker rejected the request: {reply.get('error')}")
    if not reply["ok"]:
        if reply.get("restart"):
            raise Rejected(worker.stage or "smoke", reply["error"], True)
        raise verify.CandidateError("", reply["error"])
    metas = reply.get("outputs")
    try:
        if not isinstance(metas, list) or not metas or not all(isinstance(m, dict) for m in metas):
            raise ValueError("no output descriptions")
        if not reply.get("shared") and len(payloads) != len(metas):
            raise ValueError(f"{len(payloads)} payloads for {len(metas)} outputs")

        def read(i):
            m = metas[i]
            return (worker.shared_read(int(m["offset"]), int(m["nbytes"])) if reply.get("shared")
                    else payloads[i])
        first_buf = read(0)
        first = _decode(metas[0], first_buf, device)
    except (ValueError, TypeError, KeyError, RuntimeError, OSError) as e:
        raise Rejected(worker.stage or "smoke", f"unreadable outputs: {e}", True) from None
    if after:                          # the runner is done: its memory and ours not at once
        exp = verify.expect(fam, case, device, inputs, native)
    worst = (verify.judge_outputs(exp, [first]) if exp is not None
             else verify.judge_in_rows(fam, case, sliced[1], native, first, sliced[0]))
    del inputs, sliced
    # determinism: the runner compared its repeats with the first bitwise (verify.run_case)
    # and sent the first; anything after it is not read
    big = max(first.numel() * first.element_size(), in_bytes) >= BIG_CASE_BYTES
    del first, first_buf, exp
    if big and device.startswith("cuda"):
        import torch
        torch.cuda.empty_cache()     # a large case's blocks back to the GPU, for the runners
    return worst


def run_stage(worker, fam, plan: verify.Verifier, stage: str, device: str,
              deadline: float) -> verify.StageResult:
    t0 = time.perf_counter()
    worker.stage = stage
    worst = 0.0
    cases = plan.cases(stage)
    for case in cases:
        try:
            w = judge_case(worker, fam, case, device, deadline,
                           repeats=3 if stage == "determinism" else 1)
            worst = max(worst, w if w == w else 0.0)
        except verify.CandidateError as e:
            return verify.StageResult(stage, "failed", worst_error=worst, failed_case=str(case),
                                      detail=str(e), duration_s=time.perf_counter() - t0)
    return verify.StageResult(stage, "passed", worst_error=worst, detail=f"{len(cases)} case(s)",
                              duration_s=time.perf_counter() - t0)


def _sol_us(fam, shape, dtype: str, ceilings: dict | None, tf32: bool = False) -> tuple:
    """(speed of light at the dtype's rate, the machine's floor) of one shape, microseconds;
    (None, None) without measured ceilings (engine/hw.py)."""
    import torch
    from engine import hw
    if not ceilings:
        return None, None
    nbytes, flops = fam.cost(tuple(shape), getattr(torch, dtype))
    return hw.sol_us(nbytes, flops, dtype, ceilings, tf32), hw.floor_us(nbytes, flops, ceilings)


def time_shapes(worker, fam, req: dict, deadline: float, prep: dict | None = None,
                keep: bool = False) -> dict:
    """Time the loaded candidate (or, with ``prep``, the reference) over the target's shapes:
    the runner runs batches of samples the judge sizes and times from outside. With ``keep``
    the input sets stay in the runner (for ``audit``; ``drop_sets`` frees them)."""
    mode = _timing_mode(worker)
    gpu = mode == "gpu"
    rows, total = [], 0.0
    for i, s in enumerate(req["shapes"]):
        key = f"s{i}"
        msg = {"op": "prep", "key": key, "shape": s["shape"], "dtype": req["dtype"],
               "seed": int(req.get("seed", 0))}
        if prep:
            msg.update(prep)
        _checked(worker.rpc(msg, deadline)[0], "benchmark")
        # the judge's own estimate of a call: three samples on its clock
        t0 = time.perf_counter()
        r = _checked(worker.rpc({"op": "sample", "key": key, "n": 3}, deadline)[0], "benchmark")
        est_us = min((time.perf_counter() - t0) / 3 * 1e6,
                     max(r["samples"]) + OVERHEAD_US[mode] + 2000.0)
        reps = bench.reps_for(est_us, gpu, ROUNDS)
        rounds = []
        for k in range(ROUNDS):
            # a batch whose reported times fall far short of the judge's clock is timed again:
            # a stall of the machine passes on a second try, a forged timer never does
            for attempt in range(WALL_TRIES):
                t0 = time.perf_counter()
                got = _samples(worker, key, reps, 3 + k * reps, deadline)
                wall = time.perf_counter() - t0
                allowed = 2 * (sum(got) + reps * OVERHEAD_US[mode]) / 1e6 + BATCH_SLACK_S
                if wall <= allowed:
                    break
            else:
                raise Rejected("benchmark", f"timings do not account for the wall clock: "
                                            f"{reps} calls reported {sum(got) / 1e3:.2f} ms in all "
                                            f"but took {wall * 1e3:.1f} ms ({WALL_TRIES} tries)",
                               True)
            rounds.append(got)
        if not keep:
            worker.rpc({"op": "drop", "key": key}, deadline)
        t = bench.summarize(rounds)
        sol, floor = _sol_us(fam, s["shape"], req["dtype"], worker.ceilings if gpu else None,
                             bool(req.get("tf32")))
        rows.append({"shape": s["shape"], "count": s["count"], "us": t["us"], "noise": t["noise"],
                     "sol_us": sol, "floor_us": floor,
                     "pct_sol": (100.0 * sol / t["us"]) if sol else None})
        total += s["count"] * t["us"]
    noise = bench.total_noise(rows)
    sol_total = sum(r["count"] * r["sol_us"] for r in rows) if gpu and worker.ceilings else None
    return {"latency_us": total, "noise": noise, "shape_times": rows, "sol_us": sol_total,
            "timing_mode": mode}


def _samples(worker, key: str, n: int, offset: int, deadline: float) -> list:
    r = _checked(worker.rpc({"op": "sample", "key": key, "n": n, "offset": offset},
                            deadline)[0], "benchmark")
    got = r.get("samples")
    if not isinstance(got, list) or len(got) != n or not all(
            isinstance(x, (int, float)) and 0 < x < 1e12 for x in got):
        raise Rejected("benchmark", f"the worker returned impossible timing samples "
                                    f"({len(got) if isinstance(got, list) else got!r} for {n})",
                       True)
    return got


def audit(worker, timing: dict, deadline: float) -> None:
    """The sharp check of a would-be best's timing, per shape: one batch of calls sized to take
    AUDIT_S at the claimed speed, on the judge's clock. A runner that under-reports cannot
    finish it in time; the judge stops waiting at the limit (the runner is killed)."""
    from engine.worker import WorkerDied
    mode = _timing_mode(worker)
    for i, row in enumerate(timing["shape_times"]):
        per_call = row["us"] + OVERHEAD_US[mode]
        n = int(min(AUDIT_MAX_CALLS, max(3, AUDIT_S * 1e6 / per_call)))
        limit = AUDIT_FACTOR[mode] * n * per_call / 1e6 + AUDIT_SLACK_S
        t0 = time.perf_counter()
        try:
            _samples(worker, f"s{i}", n, 0, min(deadline, time.monotonic() + limit))
        except WorkerDied as e:
            if not e.timed_out or time.monotonic() >= deadline:
                raise
            raise Rejected("benchmark", f"timing audit at shape {row['shape']}: {n} calls "
                                        f"claimed at {row['us']:.1f} us each did not finish in "
                                        f"{limit:.2f} s; the reported timings are false",
                           True) from None
        wall = time.perf_counter() - t0
        if wall > limit:
            raise Rejected("benchmark", f"timing audit at shape {row['shape']}: {n} calls "
                                        f"claimed at {row['us']:.1f} us each took {wall:.2f} s",
                           True)


def drop_sets(worker, req: dict, deadline: float) -> None:
    for i in range(len(req["shapes"])):
        worker.rpc({"op": "drop", "key": f"s{i}"}, deadline)


def _skip_rest(stages: list) -> None:
    done = {s["stage"] for s in stages}
    for st in verify.STAGES:
        if st not in done:
            stages.append(verify.StageResult(st, "skipped", detail="an earlier stage failed").row())


def _load(worker, fam_name: str, spec, source: str, deadline: float) -> None:
    worker.stage = "smoke"
    reply = worker.rpc({"op": "load", "family": fam_name, "spec": spec, "source": source},
                       deadline)[0]
    worker.tainted = True
    _checked(reply, "smoke")


def evaluate(worker, req: dict, deadline: float) -> dict:
    """Load, verify (5 stages), time, re-check, re-time a would-be best fresh. Returns stages,
    timing and the verdict; with a gate (bench-first), "gated" (why) when the candidate was timed
    but, being slower than the best, not verified further."""
    fam = kernels.get(req["family"], req.get("spec"))
    device = judge_device(worker)
    plan = verify.Verifier(fam, req, device, worker.interpret)
    stages: list[dict] = []
    result = {"stages": stages, "failed_stage": None, "error": None, "restart": False}
    # verify=False: a re-time on the reference worker of a candidate that passed all five stages on
    # another worker; it is still loaded, timed and re-checked after timing here.
    # gate={"best_us", "best_noise", "min_margin"} (bench-first order): smoke, then the timing, and
    # the four costly stages only for a candidate faster than the best by more than the noise; a
    # slower one is reverted whatever the rest would say, so verifying it is wasted (on the H200
    # those four stages, the shape sweep most of all, were 86% of the recorded experiments' time).
    gate = req.get("gate") if req.get("verify", True) and req.get("time", True) else None

    def fail(stage, msg, restart=False):
        result.update(failed_stage=stage, error=msg, restart=result["restart"] or restart)
        if verify.STAGES[0] not in {s["stage"] for s in stages} and stage in verify.STAGES:
            stages.append(verify.StageResult(stage, "failed", detail=msg).row())
        _skip_rest(stages)
        return result

    def run_stages(names) -> bool:
        for stage in names:
            try:
                r = run_stage(worker, fam, plan, stage, device, deadline)
            except Rejected as e:
                stages.append(verify.StageResult(stage, "failed", detail=str(e)).row())
                fail(stage, str(e), e.restart)
                return False
            stages.append(r.row())
            if r.status == "failed":
                fail(stage, r.detail)
                return False
        return True

    try:
        _load(worker, req["family"], req.get("spec"), req["source"], deadline)
    except Rejected as e:
        return fail("smoke", str(e), e.restart)
    todo = verify.STAGES if req.get("verify", True) else ()
    if not run_stages(todo[:1] if gate else todo):
        return result
    if not req.get("time", True):
        return result

    worker.stage = "benchmark"

    def timed() -> dict:
        timing = time_shapes(worker, fam, req, deadline, keep=True)
        for row in timing["shape_times"]:
            # Faster than bytes / measured copy rate, or flops / the machine's fastest matmul
            # rate (with 15% slack for measurement), is impossible: the candidate skipped
            # work, or the timing was gamed. Not the dtype's own rate: an fp32 GEMM on tensor
            # cores (tf32x3) beats the fp32 units honestly.
            floor = row.get("floor_us")
            if floor and row["us"] < floor / SOL_SLACK:
                raise Rejected("benchmark", f"faster than the speed of light at shape "
                                            f"{row['shape']}: {row['us']:.2f} us < "
                                            f"{floor:.2f} us minimum")
        return timing

    def not_faster(timing, own_noise=True):
        return gate and verify.not_faster(timing["latency_us"],
                                          timing["noise"] if own_noise else 0.0,
                                          gate["best_us"], gate["best_noise"], gate["min_margin"])
    try:
        timing = timed()
        # a median that beats the best, kept out only by its own rounds' spread (one round
        # off: a GPT-2 attention candidate on the H200 ran 678 us against the best's 763 with
        # rounds 89% apart) is timed once more, and the repeat stands, whatever it says
        if not_faster(timing) and not not_faster(timing, own_noise=False):
            first = timing
            drop_sets(worker, req, deadline)
            timing = timed()
            timing["repeated"] = (f"timed again: the first timing's rounds spread "
                                  f"{first['noise']:.0%} (median {first['latency_us']:.1f} us)")
    except Rejected as e:
        if gate:
            _skip_rest(stages)
        return fail(e.stage, str(e), e.restart)
    result["timing"] = timing
    slower = not_faster(timing)
    try:
        if not slower:         # a would-be best: its timing is audited on the judge's clock
            audit(worker, timing, deadline)
        drop_sets(worker, req, deadline)
    except Rejected as e:
        if gate:
            _skip_rest(stages)
        return fail(e.stage, str(e), e.restart)
    if gate:
        if slower:
            why = "not verified further: " + slower
            stages.extend(verify.StageResult(st, "slower", detail=why).row()
                          for st in verify.STAGES[1:])
            result["gated"] = why
            return result
        if not run_stages(verify.STAGES[1:]):
            return result

    worker.stage = "recheck"
    try:
        judge_case(worker, fam, plan.recheck_case(), device, deadline)
    except verify.CandidateError as e:
        return fail("recheck", f"wrong after timing: {e}")
    except Rejected as e:
        return fail("recheck", f"wrong after timing: {e}", e.restart)

    # (not for the loop's re-time of another worker's result: that one was fresh-timed there)
    if req.get("fresh_retime", worker.fresh_retime and req.get("verify", True)):
        worker.stage = "benchmark"
        try:
            fresh = _fresh_timing(worker, fam, req, deadline)
        except Rejected as e:
            return fail(e.stage, str(e), e.restart)
        if isinstance(fresh, str):
            result["retime_note"] = fresh
        else:
            first = timing["latency_us"]
            tol = max(FRESH_AGREEMENT, 3 * max(timing["noise"], fresh["noise"]))
            if first < fresh["latency_us"] * (1 - tol):
                return fail("benchmark", f"timed {first:.1f} us here but {fresh['latency_us']:.1f}"
                                         f" us in a fresh process: the first timing is not "
                                         f"believed", True)
            fresh["first_latency_us"] = first
            result["timing"] = fresh
    return result


def _fresh_timing(worker, fam, req: dict, deadline: float):
    """The candidate timed in a runner no candidate has touched; a note (str) if none started."""
    spare = worker.take_spare(max(deadline - time.monotonic(), 1.0))
    if spare is None:
        return "no fresh worker could be started for the re-time; the first timing stands"
    from engine.worker import WorkerDied
    try:
        _load(spare, req["family"], req.get("spec"), req["source"], deadline)
        return time_shapes(spare, fam, req, deadline)
    except Rejected as e:
        raise Rejected("benchmark", f"in a fresh process: {e}", e.restart) from None
    except WorkerDied as e:
        # the candidate took down a fresh process that only timed it: not a best to keep
        raise Rejected("benchmark", f"the fresh process timing it died: {e}") from None
    finally:
        spare.kill()


def time_reference(worker, req: dict, deadline: float) -> dict:
    """The family's reference timed over the target's shapes in a runner no candidate has
    touched (restarted first if one was loaded): eager, and, with "compile_modes", torch.compile
    of it in each mode (the fastest kept: the baseline a user would otherwise run)."""
    if worker.tainted:
        worker.restart()
    fam = kernels.get(req["family"], req.get("spec"))
    worker.stage = "reference"
    base = {"family": req["family"], "spec": req.get("spec")}
    out = time_shapes(worker, fam, req, deadline, prep=dict(base, op="prep_reference"))
    modes = [m for m in req.get("compile_modes") or () if not worker.interpret]
    compiled = {}
    # "budget_s": the share of the run's budget the baselines may take; the first mode always
    # runs, a later one only when the time left holds it (estimated from the one before:
    # max-autotune tunes, so three times as long)
    until = time.monotonic() + float(req["budget_s"]) if req.get("budget_s") is not None else None
    last = 0.0
    for mode in modes:
        left = (until - time.monotonic()) if until is not None else float("inf")
        if compiled and left < (3.0 if mode.startswith("max-autotune") else 1.5) * last:
            compiled[mode] = {"skipped": f"{max(left, 0):.0f} s left in the run's budget"}
            continue
        t0 = time.monotonic()
        try:
            _checked(worker.rpc(dict(base, op="compile_reference", mode=mode), deadline)[0],
                     "reference")
            compiled[mode] = time_shapes(worker, fam, req, deadline,
                                         prep=dict(base, op="prep_reference", compiled=True))
        except (Rejected, JudgeError) as e:
            compiled[mode] = {"error": str(e)[:300]}
        last = time.monotonic() - t0
    if compiled:
        try:                                  # their memory back before any candidate runs
            _checked(worker.rpc(dict(base, op="release_reference"), deadline)[0], "reference")
        except (Rejected, JudgeError):
            pass
    ok = {m: t for m, t in compiled.items() if "latency_us" in t}
    if ok:
        best = min(ok, key=lambda m: ok[m]["latency_us"])
        out["compile"] = dict(ok[best], mode=best,
                              modes={m: t.get("latency_us") for m, t in compiled.items()})
    elif compiled:
        out["compile"] = {"error": "; ".join(f"{m}: {t.get('error') or t.get('skipped')}"
                                             for m, t in compiled.items())}
    skipped = [m for m, t in compiled.items() if "skipped" in t]
    if skipped and "compile" in out:
        out["compile"]["skipped"] = skipped
    return out
