"""Timing, fixed and apart from what is optimized.

GPU: device events around each call, warm-up first, L2 flushed before every repetition by writing a
buffer larger than the cache, inputs rotated among several fresh sets (so no repetition finds its
inputs in cache), median of many repetitions, repeated in independent rounds so that the spread of
the round medians gives the measurement's noise. Between the flush and the start event the GPU
spins (torch.cuda._sleep) for about 100 us, or for the call's own host time (measured on an
untimed call once the warm-up is done) and 50 us more where that is longer: the host meanwhile
queues the call, so the events bracket the kernels' device time and not the Python launch path
(tens of us per call for a Triton launch, 65-136 us for the Gluon attention launcher on an H100's
host, more for a candidate that launches several kernels; it varies from process to process and
would otherwise show up whenever it outlasts the spin).

CPU: kernels run under Triton's interpreter; the same protocol runs with a host clock and few
repetitions, and every figure it produces is labelled an interpreter timing, never GPU performance.

The clock functions are bound here at import, before any candidate is loaded in the worker, and the
verifier checks after each candidate that none of the clocks (or this module) was replaced.
"""
from __future__ import annotations

import statistics
import time

import torch

_perf_counter = time.perf_counter          # bound before any candidate code runs
_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_sleep = getattr(torch.cuda, "_sleep", None)     # spins the GPU for a number of clock cycles
SPIN_CYCLES = 200_000                             # ~100 us at ~2 GHz: longer than a Python launch
# The spin outlasts the call's host time by SPIN_MARGIN_US, up to MAX_SPIN_US: with the flush
# (~60-90 us) a repetition then takes at most ~500 us before the call's device time, inside the
# judge's wall-clock check (2 x (device time + 300 us) a call, engine/judge.py OVERHEAD_US), which
# a launch-heavy honest candidate must pass; a launch longer than that shows in its timing, as
# it did before the spin grew
SPIN_MARGIN_US = 50.0
MAX_SPIN_US = 400.0

_flush_buf: torch.Tensor | None = None
_cycles_per_us: list = []                         # the GPU's spin rate, measured once a process


def _flush_l2(spin: int = SPIN_CYCLES) -> None:
    """Overwrite a 256 MiB buffer: evicts inputs and outputs of the last call from L2 (<=~256 MB);
    then spin ``spin`` GPU cycles while the host queues the call."""
    global _flush_buf
    if _flush_buf is None:
        _flush_buf = torch.empty(64 * 2**20, dtype=torch.int32, device="cuda")
    _flush_buf.zero_()
    if _sleep is not None:
        _sleep(spin)


def spin_cycles(host_us: float, cycles_per_us: float) -> int:
    """GPU cycles to spin before a timed call whose launch path costs ``host_us`` of host time:
    that and SPIN_MARGIN_US more, at most MAX_SPIN_US, never below SPIN_CYCLES."""
    want = min(host_us + SPIN_MARGIN_US, MAX_SPIN_US) * cycles_per_us
    return int(max(SPIN_CYCLES, want))


def _spin_for(call) -> int:
    """The spin that covers ``call()``'s host time, from one untimed call after a sync (the call
    returns once its kernels are queued: what it took is the launch path)."""
    if _sleep is None:
        return SPIN_CYCLES
    if not _cycles_per_us:
        _synchronize()
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        start.record()
        _sleep(SPIN_CYCLES)
        end.record()
        end.synchronize()
        _cycles_per_us.append(SPIN_CYCLES / max(start.elapsed_time(end) * 1e3, 1.0))
    _synchronize()
    t0 = _perf_counter()
    call()
    host_us = (_perf_counter() - t0) * 1e6
    _synchronize()
    return spin_cycles(host_us, _cycles_per_us[0])


def device_time_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median device time of ``fn()`` in ms (events, L2 flushed). Used for ceilings and references."""
    for _ in range(warmup):
        fn()
    _synchronize()
    spin = _spin_for(fn)
    times = []
    for _ in range(reps):
        _flush_l2(spin)
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def warm_up(fn, input_sets: list[dict], gpu: bool) -> int:
    """Compile, autotune and fill caches before anything is timed. Returns the spin that covers
    the call's launch path (``samples``' spin), measured once the caches are warm."""
    k = len(input_sets)
    if gpu:
        for i in range(max(3, k)):
            fn(**input_sets[i % k])
        _synchronize()
        return _spin_for(lambda: fn(**input_sets[0]))
    fn(**input_sets[0])                               # the interpreter rewrites the kernel once
    return SPIN_CYCLES


def samples(fn, input_sets: list[dict], gpu: bool, n: int, offset: int = 0,
            spin: int | None = None) -> list[float]:
    """``n`` timed calls in microseconds, each on the next input set (from ``offset``): on a GPU
    device events around the call after an L2 flush and a spin that covers the call's host time
    (``warm_up``'s; None: one more, untimed, call measures it); else the host clock."""
    k = len(input_sets)
    out = []
    if spin is None:
        spin = _spin_for(lambda: fn(**input_sets[offset % k])) if gpu and n else SPIN_CYCLES
    for i in range(n):
        inputs = input_sets[(offset + i) % k]
        if gpu:
            _flush_l2(spin)
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            start.record()
            fn(**inputs)
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = _perf_counter()
            fn(**inputs)
            out.append((_perf_counter() - t0) * 1e6)
    return out


def reps_for(est_us: float, gpu: bool, rounds: int = 3, target_ms: float = 60.0,
             max_reps: int = 200) -> int:
    """Repetitions per round for a call of about ``est_us``: ~target_ms a round on a GPU, a few
    under the interpreter (each is already long)."""
    est_ms = max(est_us / 1e3, 1e-3)
    if gpu:
        return int(min(max_reps, max(10, target_ms / est_ms / rounds)))
    return int(min(5, max(2, 300.0 / est_ms / rounds)))


def summarize(round_samples: list[list[float]]) -> dict:
    """{"us": median of every sample, "noise": spread of the round medians / median, "samples"}."""
    every = [x for r in round_samples for x in r]
    med = statistics.median(every)
    medians = [statistics.median(r) for r in round_samples]
    noise = (max(medians) - min(medians)) / med if med > 0 else 0.0
    return {"us": med, "noise": noise, "samples": len(every)}


def total_noise(rows: list[dict]) -> float:
    """The relative noise of a target's total time, sum(count * us) over its shapes, from each
    shape's own: sum(count * us * noise) / total, the spread the total has when every shape's
    timing moves the same way (the worst case; independent shapes would spread less). Not the
    largest shape's noise: a 190 us shape whose rounds spread 10% says little about a 27 ms total
    of which a 23.5 ms shape spread 2% (the LLaMA-3-8B-shaped matmul target, H100)."""
    total = sum(r["count"] * r["us"] for r in rows)
    if total <= 0:
        return max((r["noise"] for r in rows), default=0.0)
    return sum(r["count"] * r["us"] * r["noise"] for r in rows) / total


def time_call(fn, input_sets: list[dict], gpu: bool, rounds: int = 3,
              target_ms: float = 60.0, max_reps: int = 200) -> dict:
    """Time ``fn(**inputs)`` rotating through ``input_sets``, all in this process (our own
    kernels and references: the tools; candidates are timed through engine/judge.py, which
    drives ``warm_up`` and ``samples`` in the worker and checks them from outside).

    Returns {"us": median microseconds over all samples, "noise": (max - min) / median of the
    per-round medians, "samples": n}. ``target_ms`` sizes the repetitions per round from a first
    estimate; under the interpreter a few repetitions are enough (each is already long).
    """
    spin = warm_up(fn, input_sets, gpu)
    if gpu:
        est_us = device_time_ms(lambda: fn(**input_sets[0]), reps=3, warmup=0) * 1e3
    else:
        est_us = samples(fn, input_sets, gpu, 1)[0]
    reps = reps_for(est_us, gpu, rounds, target_ms, max_reps)
    return summarize([samples(fn, input_sets, gpu, reps, r * reps, spin) for r in range(rounds)])


def input_set_count(bytes_per_set: int, l2_bytes: int, gpu: bool, cap_bytes: int = 2 * 2**30) -> int:
    """How many distinct input sets to rotate: enough that together they exceed twice the L2."""
    if not gpu:
        return 2
    want = max(2, -(-2 * l2_bytes // max(bytes_per_set, 1)))
    return int(max(2, min(want, 16, cap_bytes // max(bytes_per_set, 1))))
