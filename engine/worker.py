"""The worker: a separate, reusable process that compiles, verifies and times candidates.

Candidate code is untrusted. It runs only here, never in the engine: a crash (segfault, os.kill), a
hang, an illegal memory access or a corrupted GPU context ends or poisons this process alone. The
engine (``Worker``) then records the experiment as failed, with the stage it was in and the tail of
the worker's stderr, starts a fresh worker and goes on.

Protocol: one JSON object per line. Requests on the worker's stdin; replies and progress lines
(``{"progress": "<stage>"}``) on a private copy of its stdout taken before any candidate loads, while
file descriptor 1 is pointed at stderr, so whatever a candidate prints cannot corrupt the protocol.

The worker's environment is built from an allow-list (``clean_env``): no API keys, tokens or other
secrets reach candidate code.
"""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_ENV_ALLOW = re.compile(
    r"^(PATH|HOME|USER|LANG|LC_[A-Z]+|TZ|TMPDIR|PYTHONPATH|PYTHONHASHSEED|LD_LIBRARY_PATH|"
    r"CUDA_[A-Z_]+|NVIDIA_[A-Z_]+|HIP_[A-Z_]+|ROCR_[A-Z_]+|ROCM_[A-Z_]+|HSA_[A-Z_]+|"
    r"TRITON_[A-Z_]+|TORCH_[A-Z_]+|PYTORCH_[A-Z_]+|OMP_NUM_THREADS|MKL_NUM_THREADS|"
    r"OPENBLAS_[A-Z_]+|XDG_CACHE_HOME|CC|CXX)$")
_ENV_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)


def clean_env(extra: dict | None = None) -> dict:
    """The worker's environment: allow-listed names only, and never anything that looks secret."""
    env = {k: v for k, v in os.environ.items() if _ENV_ALLOW.match(k) and not _ENV_SECRET.search(k)}
    env.update(extra or {})
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return {k: v for k, v in env.items() if not _ENV_SECRET.search(k)}


class WorkerDied(RuntimeError):
    """The worker process crashed or was killed after a hang; ``stage`` is where it was."""

    def __init__(self, message: str, stage: str | None, timed_out: bool = False):
        super().__init__(message)
        self.stage = stage
        self.timed_out = timed_out


class Worker:
    """Engine-side handle on one worker process. Not thread-safe: one request at a time."""

    def __init__(self, interpret: bool, device_index: int | None = None, name: str = "w0"):
        self.interpret = interpret
        self.device_index = device_index
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._lines: queue.Queue = queue.Queue()
        self._stderr_path: str | None = None
        self.hello: dict | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, timeout_s: float = 300.0) -> dict:
        extra = {}
        if self.interpret:
            extra["TRITON_INTERPRET"] = "1"
        if self.device_index is not None:
            extra["CUDA_VISIBLE_DEVICES"] = str(self.device_index)
        fd, self._stderr_path = tempfile.mkstemp(prefix="nightshift-worker-", suffix=".log")
        os.close(fd)
        stderr = open(self._stderr_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "engine.worker"], cwd=str(ROOT), env=clean_env(extra),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
            start_new_session=True, text=True, bufsize=1)
        stderr.close()
        self._lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self._lines), daemon=True).start()
        self.hello = self.request({"op": "hello"}, timeout_s=timeout_s)
        return self.hello

    @staticmethod
    def _read(proc, lines):
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # EOF: the process is gone

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except Exception:
                pass
        self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait()
        if self.proc is not None:
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except Exception:
                    pass
        self.proc = None

    def restart(self) -> dict:
        self.kill()
        self.restarts += 1
        return self.start()

    def stderr_tail(self, n: int = 1500) -> str:
        try:
            return Path(self._stderr_path).read_text(errors="replace")[-n:]
        except Exception:
            return ""

    # -- requests -----------------------------------------------------------------------------
    def request(self, msg: dict, timeout_s: float = 300.0) -> dict:
        """Send one request and wait for its reply. Raises WorkerDied on crash or timeout."""
        if not self.alive():
            raise WorkerDied("worker is not running", None)
        stage = None
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the reader will see EOF and report the death below
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                self.kill()
                raise WorkerDied(f"timed out after {timeout_s:.0f} s (killed)", stage, timed_out=True)
            if line is None:
                code = self.proc.wait() if self.proc else None
                why = (f"killed by signal {-code}" if code is not None and code < 0
                       else f"exited with code {code}")
                tail = self.stderr_tail()
                self.kill()
                raise WorkerDied(f"worker process {why}" + (f"\n{tail}" if tail else ""), stage)
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "progress" in reply:
                stage = reply["progress"]
                continue
            return reply


# =============================================================================================
# the worker process
# =============================================================================================
def _main() -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                      # candidate prints go to stderr, not into the protocol
    sys.stdout = sys.stderr

    def send(obj):
        proto.write(json.dumps(obj, default=_jsonable) + "\n")
        proto.flush()

    import torch  # noqa: F401  (imported before any candidate, as are the clocks in bench)
    from engine import bench, hw  # noqa: F401
    from engine import verify
    import kernels
    verify.install_launch_counter()
    verify.warm_imports()  # modules torch imports lazily re-bind torch attributes on first import
    for name in kernels.FAMILY_NAMES:
        kernels.get(name)
    snapshot = verify.tamper_snapshot()
    workdir = tempfile.mkdtemp(prefix="nightshift-cand-")
    state = {"ceilings": None}

    for line in sys.stdin:
        try:
            req = json.loads(line)
        except json.JSONDecodeError:
            send({"error": "bad request"})
            continue
        op = req.get("op")
        if op == "exit":
            break
        try:
            if op == "hello":
                info = hw.detect()
                if info["timing_mode"] == "gpu" and state["ceilings"] is None:
                    state["ceilings"] = hw.measure_ceilings()
                info["ceilings"] = state["ceilings"] or {}
                info["pid"] = os.getpid()
                info["env_names"] = sorted(os.environ)
                send(info)
            elif op == "time_reference":
                send(_time_reference(req, state))
            elif op == "evaluate":
                send(_evaluate(req, state, snapshot, workdir, send))
            else:
                send({"error": f"unknown op {op!r}"})
        except Exception as e:  # a bug in the engine's request, not the candidate's fault
            import traceback
            send({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]})


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def _device():
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sets(fam, shape, dtype, device, gen, l2_bytes, gpu):
    import torch
    from engine import bench
    nbytes, _ = fam.cost(tuple(shape), getattr(torch, dtype))
    k = bench.input_set_count(nbytes, l2_bytes, gpu)
    return [fam.make_inputs(tuple(shape), getattr(torch, dtype), device, gen) for _ in range(k)]


def _sol_us(fam, shape, dtype, ceilings) -> float | None:
    import torch
    if not ceilings:
        return None
    nbytes, flops = fam.cost(tuple(shape), getattr(torch, dtype))
    t_mem = nbytes / (ceilings["copy_gbps"] * 1e3)
    t_flop = flops / (ceilings["matmul_tflops"] * 1e6) if ceilings.get("matmul_tflops") else 0.0
    return max(t_mem, t_flop)


def _time_target(fn, fam, req, state):
    """Time fn over the target's shapes; per-shape figures and the count-weighted total."""
    import torch
    from engine import bench
    device = _device()
    gpu = device == "cuda"
    gen = torch.Generator(device=device)
    gen.manual_seed(int(req.get("seed", 0)) + 7919)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20) if gpu else 0
    ceilings = state["ceilings"] if gpu else None
    rows, total, noise = [], 0.0, 0.0
    for s in req["shapes"]:
        sets = _sets(fam, s["shape"], req["dtype"], device, gen, l2, gpu)
        t = bench.time_call(fn, sets, gpu)
        sol = _sol_us(fam, s["shape"], req["dtype"], ceilings)
        rows.append({"shape": s["shape"], "count": s["count"], "us": t["us"], "noise": t["noise"],
                     "sol_us": sol, "pct_sol": (100.0 * sol / t["us"]) if sol else None})
        total += s["count"] * t["us"]
        noise = max(noise, t["noise"])
        del sets
    sol_total = (sum(r["count"] * r["sol_us"] for r in rows) if ceilings else None)
    return {"latency_us": total, "noise": noise, "shape_times": rows, "sol_us": sol_total,
            "timing_mode": "gpu" if gpu else "interpreter"}


def _time_reference(req, state) -> dict:
    import kernels
    fam = kernels.get(req["family"])
    return _time_target(fam.reference, fam, req, state)


def _evaluate(req, state, snapshot, workdir, send) -> dict:
    """Load, verify (5 stages), time, re-check. Returns stages, timing and the verdict; with a
    gate, "gated" (why) when the candidate was timed but, being slower, not verified further."""
    import kernels
    from engine import verify
    fam = kernels.get(req["family"])
    device = _device()
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    v = verify.Verifier(fam, req, device, interpret)
    stages: list[dict] = []
    result = {"stages": stages, "failed_stage": None, "error": None, "restart": False}
    # verify=False: a re-time on the reference worker of a candidate that passed all five stages on
    # another worker; it is still loaded, tamper-checked, timed and re-checked after timing here.
    # gate={"best_us", "best_noise", "min_margin"} (bench-first order): smoke, then the timing, and
    # the four costly stages only for a candidate faster than the best by more than the noise; a
    # slower one is reverted whatever the rest would say, so verifying it is wasted (on the H200
    # those four stages, the shape sweep most of all, were 86% of the recorded experiments' time).
    gate = req.get("gate") if req.get("verify", True) and req.get("time", True) else None

    def fail(stage, msg):
        result.update(failed_stage=stage, error=msg)
        if gate:
            _skip_rest(stages)    # failed at the timing of the bench-first order: the rest not run
        if _looks_fatal(msg):
            result["restart"] = True  # a broken GPU context: this process must not go on
        return result

    send({"progress": "smoke"})
    try:
        fn = verify.load_candidate(req["source"], workdir)
    except Exception as e:
        stages.append(verify.StageResult("smoke", "failed", detail=f"import failed: "
                                         f"{type(e).__name__}: {str(e)[:500]}").row())
        _skip_rest(stages)
        return fail("smoke", f"import failed: {type(e).__name__}: {str(e)[:500]}")
    tampered = verify.tamper_check(snapshot)
    if tampered:
        result["restart"] = True
        stages.append(verify.StageResult("smoke", "failed", detail=tampered).row())
        _skip_rest(stages)
        return fail("smoke", tampered)

    def run_stages(names) -> bool:
        for stage in names:
            send({"progress": stage})
            r = v.run_stage(fn, stage)
            tampered = verify.tamper_check(snapshot)
            if tampered and r.status == "passed":
                r = verify.StageResult(stage, "failed", detail=tampered, duration_s=r.duration_s)
            stages.append(r.row())
            if tampered:
                result["restart"] = True
            if r.status == "failed":
                _skip_rest(stages)
                fail(stage, r.detail)
                return False
        return True

    todo = verify.STAGES if req.get("verify", True) else ()
    if not run_stages(todo[:1] if gate else todo):
        return result

    if not req.get("time", True):
        return result
    send({"progress": "benchmark"})
    try:
        timing = _time_target(fn, fam, req, state)
    except Exception as e:
        return fail("benchmark", f"raised during timing: {type(e).__name__}: {str(e)[:400]}")
    tampered = verify.tamper_check(snapshot)
    if tampered:
        result["restart"] = True
        return fail("benchmark", tampered)
    result["timing"] = timing
    for row in timing["shape_times"]:
        # Faster than bytes / measured copy rate (with 15% slack for measurement) is impossible:
        # the candidate skipped work, or the timing was gamed. Rejected, not celebrated.
        if row["sol_us"] and row["us"] < row["sol_us"] / 1.15:
            return fail("benchmark", f"faster than the speed of light at shape {row['shape']}: "
                                     f"{row['us']:.2f} us < {row['sol_us']:.2f} us minimum")
    if gate:
        slower = verify.not_faster(timing["latency_us"], timing["noise"], gate["best_us"],
                                   gate["best_noise"], gate["min_margin"])
        if slower:
            why = "not verified further: " + slower
            stages.extend(verify.StageResult(st, "slower", detail=why).row()
                          for st in verify.STAGES[1:])
            result["gated"] = why
            return result
        if not run_stages(verify.STAGES[1:]):
            return result

    send({"progress": "recheck"})
    try:
        case = verify.Case(tuple(req["shapes"][0]["shape"]), req["dtype"])
        if v.size(case.shape) > v.numel_cap:
            case = v.cases("smoke")[0]
        v.check(fn, case)
    except verify.CandidateError as e:
        return fail("recheck", f"wrong after timing: {e}")
    return result


def _skip_rest(stages):
    from engine import verify
    done = {s["stage"] for s in stages}
    for st in verify.STAGES:
        if st not in done:
            stages.append(verify.StageResult(st, "skipped", detail="an earlier stage failed").row())


def _looks_fatal(msg: str) -> bool:
    m = msg.lower()
    return any(s in m for s in ("cuda error", "illegal memory", "device-side assert", "hip error",
                                "unspecified launch failure", "misaligned address"))


if __name__ == "__main__":
    _main()
