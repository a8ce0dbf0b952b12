"""The worker: a sandboxed, reusable process that runs candidates; and the engine's handle on it.

Candidate code is untrusted. It runs only in the worker (the *runner*), never in the engine: a
crash, a hang, an illegal memory access or a corrupted GPU context ends or poisons that process
alone. The runner holds nothing that decides a verdict: it builds a case's inputs from the seed it
is given, calls the candidate under the guard and sends back the outputs; it runs the timing loop
the judge asks for and sends back the samples. The judge (engine/judge.py), in the process that
owns this handle, computes the expected outputs itself, compares, checks the timings and decides.

The runner starts inside the OS sandbox (engine/sandbox.py): another uid, no network, its own
PID namespace (nothing it starts outlives it), the engine's files out of sight, resource limits.
Its environment is built from an allow list (``clean_env``): no API keys, tokens or secrets.

Protocol: requests are JSON lines on the runner's stdin; replies are JSON lines on a private copy
of its stdout taken before any candidate loads (file descriptor 1 then points at stderr, so
nothing a candidate prints can corrupt the protocol). A call's outputs travel through a shared
memory buffer the judge creates (a memfd passed to the runner; the reply gives offsets and
sizes), or, where there is none, as raw bytes after the reply line (``"payload"``: byte counts).
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
    r"OPENBLAS_[A-Z_]+|XDG_CACHE_HOME|CC|CXX|NIGHTSHIFT_SANDBOX)$")
_ENV_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
MEMORY_POLL_S = 0.25
# The runner's share of host memory (resident, all its processes) and of the GPU's memory
# (PyTorch's allocator): beyond it a candidate fails, the machine does not.
HOST_MEMORY_SHARE = 0.5
GPU_MEMORY_SHARE = 0.5


def clean_env(extra: dict | None = None) -> dict:
    """The worker's environment: allow-listed names only, and never anything that looks secret."""
    env = {k: v for k, v in os.environ.items() if _ENV_ALLOW.match(k) and not _ENV_SECRET.search(k)}
    env.update(extra or {})
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return {k: v for k, v in env.items() if not _ENV_SECRET.search(k)}


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 << 30


def _tree(root: int):
    """``root`` and every process under it (pids), each once, for as long as /proc shows them."""
    todo, seen = [root], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        yield p
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue


def _status_line(pid: int, key: str) -> list[str]:
    """The fields of /proc/<pid>/status's ``key:`` line ([] when gone or absent)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line.split()[1:] for line in f if line.startswith(key + ":")), [])
    except OSError:
        return []


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every process under it (the runner and anything it forked)."""
    return sum(int((_status_line(p, "VmRSS") or ["0"])[0]) * 1024 for p in _tree(pid))


def _host_pid(root: int, inner: int | None) -> int:
    """The host's pid of the runner that calls itself ``inner`` (its pid inside the sandbox's
    PID namespace): the process under ``root`` whose NSpid line ends with it. ``root`` itself
    (the launcher, whose death takes the namespace with it) when none is found."""
    if inner is None:
        return root
    for p in _tree(root):
        ns = _status_line(p, "NSpid")
        if ns and int(ns[-1]) == inner and (p != root or len(ns) == 1):
            return p
    return root


class WorkerDied(RuntimeError):
    """The worker process crashed or was killed after a hang; ``stage`` is where it was."""

    def __init__(self, message: str, stage: str | None, timed_out: bool = False):
        super().__init__(message)
        self.stage = stage
        self.timed_out = timed_out


class Worker:
    """Engine-side handle on one runner process, and the judge's channel to it. Not thread-safe:
    one request at a time. ``request`` answers the loop's requests (hello, evaluate,
    time_reference) by driving the runner through engine/judge.py."""

    def __init__(self, interpret: bool, device_index: int | None = None, name: str = "w0",
                 db_path: str | None = None, fresh_retime: bool | None = None):
        self.interpret = interpret
        self.device_index = device_index
        self.name = name
        self.index = int(re.sub(r"\D", "", name) or 0) if name else 0
        self.db_path = db_path
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._lines: queue.Queue = queue.Queue()
        self._stderr_path: str | None = None
        self.hello: dict | None = None
        self.ceilings: dict | None = None      # measured once, by a runner no candidate touched
        self.tainted = False                   # a candidate has been loaded into this runner
        self.stage: str | None = None          # what the judge is doing (for WorkerDied)
        self.memory_cap = int(_host_memory_bytes() * HOST_MEMORY_SHARE)
        # Every would-be best is timed again in a fresh runner (a spare started ahead of time);
        # by default where timings are real (a GPU).
        self.fresh_retime = (not interpret) if fresh_retime is None else fresh_retime
        self._lifeline_r: int | None = None
        self._lifeline_w: int | None = None
        self.shared_fd: int | None = None
        self._spare: Worker | None = None
        self._spare_thread: threading.Thread | None = None
        self.is_spare = False

    # -- lifecycle ----------------------------------------------------------------------------
    def _command(self) -> tuple[list, dict]:
        from engine import sandbox
        extra = {}
        if self.interpret:
            extra["TRITON_INTERPRET"] = "1"
        if self.device_index is not None:
            extra["CUDA_VISIBLE_DEVICES"] = str(self.device_index)
        policy = sandbox.default_policy(self.index, self.db_path, gpu=not self.interpret,
                                        address_space_bytes=self.memory_cap)
        self._lifeline_r, self._lifeline_w = sandbox.lifeline()
        policy.lifeline_fd = self._lifeline_r
        if hasattr(os, "memfd_create"):
            # outputs come back through shared memory (tens of MB a call at real shapes)
            self.shared_fd = os.memfd_create(f"nightshift-{self.name}-outputs")
            extra["NIGHTSHIFT_SHARED_FD"] = str(self.shared_fd)
        cmd = sandbox.command(policy, [sys.executable, "-u", "-m", "engine.worker"])
        return cmd, clean_env(extra)

    def reserve_shared(self, nbytes: int) -> None:
        """Grow the output buffer to at least ``nbytes`` (from this side: the runner's sandbox
        caps the size of files it writes; a runner never shrinks it below what it was given)."""
        if self.shared_fd is not None and os.fstat(self.shared_fd).st_size < nbytes:
            os.ftruncate(self.shared_fd, nbytes)

    def shared_read(self, offset: int, nbytes: int) -> bytearray:
        """``nbytes`` of the runner's output buffer from ``offset``, copied out. Read with
        pread, not a mapping: a runner that shrinks the buffer under the reader makes a short
        read here (rejected), where a mapping would kill this process."""
        if self.shared_fd is None:
            raise ValueError("this worker has no shared output buffer")
        buf = bytearray(nbytes)
        got, view = 0, memoryview(buf)
        while got < nbytes:
            n = os.preadv(self.shared_fd, [view[got:]], offset + got)
            if n <= 0:
                raise ValueError(f"the worker's output buffer ends at {offset + got} bytes; "
                                 f"it said {offset + nbytes}")
            got += n
        return buf

    def start(self, timeout_s: float = 300.0) -> dict:
        cmd, env = self._command()
        fd, self._stderr_path = tempfile.mkstemp(prefix="nightshift-worker-", suffix=".log")
        os.close(fd)
        stderr = open(self._stderr_path, "w")
        keep = tuple(fd for fd in (self._lifeline_r, self.shared_fd) if fd is not None)
        try:
            self.proc = subprocess.Popen(cmd, cwd=tempfile.gettempdir(), env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, start_new_session=True, bufsize=0,
                                         pass_fds=keep)
        finally:
            stderr.close()
            if self._lifeline_r is not None:
                os.close(self._lifeline_r)       # the launcher holds it now
                self._lifeline_r = None
        self._lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self._lines), daemon=True).start()
        self.tainted = False
        msg = {"op": "hello", "measure": self.ceilings is None}
        self.hello = self.rpc(msg, deadline=time.monotonic() + timeout_s)[0]
        if "error" in self.hello:
            raise RuntimeError(f"worker failed to start: {self.hello['error']}")
        # the runner reports its pid as its own PID namespace sees it; the engine and the
        # dashboard show (and a person kills) the host's
        self.hello["pid"] = _host_pid(self.proc.pid, self.hello.get("pid"))
        if self.ceilings is None:
            self.ceilings = self.hello.get("ceilings") or {}
        self.hello["ceilings"] = self.ceilings
        if self.fresh_retime and not self.is_spare:
            self._start_spare()
        return self.hello

    @staticmethod
    def _read(proc, lines):
        out = proc.stdout
        try:
            while True:
                line = out.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except json.JSONDecodeError:
                    continue
                payloads = []
                for n in msg.get("payload", []):
                    buf = bytearray(n)
                    view, got = memoryview(buf), 0
                    while got < n:
                        k = out.readinto(view[got:])
                        if not k:
                            raise EOFError
                        got += k
                    payloads.append(buf)
                lines.put((msg, payloads))
        except (EOFError, OSError, ValueError):
            pass
        lines.put(None)  # EOF: the process is gone

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        self._drop_spare()
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"op": "exit"}\n')
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
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is not None:
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except Exception:
                    pass
        if self._lifeline_w is not None:
            os.close(self._lifeline_w)
            self._lifeline_w = None
        if self.shared_fd is not None:
            os.close(self.shared_fd)
            self.shared_fd = None
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

    # -- the fresh spare for re-timing would-be bests -----------------------------------------
    def _start_spare(self) -> None:
        if self._spare_thread is not None and self._spare_thread.is_alive():
            return
        spare = Worker(self.interpret, self.device_index, self.name, self.db_path,
                       fresh_retime=False)
        spare.is_spare = True
        spare.ceilings = self.ceilings
        self._spare = None

        def boot():
            try:
                spare.start()
                self._spare = spare
            except Exception:
                spare.kill()
        self._spare_thread = threading.Thread(target=boot, daemon=True,
                                              name=f"nightshift-{self.name}-spare")
        self._spare_thread.start()

    def take_spare(self, timeout_s: float) -> "Worker | None":
        """A fresh runner no candidate has touched (waits for the one starting); a new spare
        starts behind it. None if none could start in time."""
        t = self._spare_thread
        if t is None:
            self._start_spare()
            t = self._spare_thread
        t.join(timeout=max(timeout_s, 0.1))
        spare, self._spare, self._spare_thread = self._spare, None, None
        self._start_spare()
        return spare

    def _drop_spare(self) -> None:
        t, self._spare_thread = self._spare_thread, None
        if t is not None:
            t.join(timeout=60)
        if self._spare is not None:
            self._spare.kill()
            self._spare = None

    # -- the channel ------------------------------------------------------------------------
    def send(self, msg: dict) -> None:
        if not self.alive():
            raise WorkerDied("worker is not running", self.stage)
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the reader will see EOF and report the death

    def receive(self, deadline: float) -> tuple[dict, list]:
        """The next reply and its payloads. Raises WorkerDied on a crash, a timeout or when the
        runner's memory passes its cap (it is killed)."""
        timeout_s = max(deadline - time.monotonic(), 0)
        while True:
            left = deadline - time.monotonic()
            try:
                item = self._lines.get(timeout=max(min(left, MEMORY_POLL_S), 0.01))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    self.kill()
                    raise WorkerDied(f"timed out after {timeout_s:.0f} s (killed)", self.stage,
                                     timed_out=True)
                if self.proc is not None:
                    rss = _tree_rss(self.proc.pid)
                    if rss > self.memory_cap:
                        self.kill()
                        raise WorkerDied(f"used {rss / 2**30:.1f} GiB of host memory, over its "
                                         f"limit of {self.memory_cap / 2**30:.1f} GiB (killed)",
                                         self.stage)
                continue
            if item is None:
                code = self.proc.wait() if self.proc else None
                why = (f"killed by signal {-code}" if code is not None and code < 0
                       else f"exited with code {code}")
                tail = self.stderr_tail()
                self.kill()
                raise WorkerDied(f"worker process {why}" + (f"\n{tail}" if tail else ""),
                                 self.stage)
            return item

    def rpc(self, msg: dict, deadline: float) -> tuple[dict, list]:
        self.send(msg)
        return self.receive(deadline)

    # -- the loop's requests ------------------------------------------------------------------
    def request(self, msg: dict, timeout_s: float = 300.0) -> dict:
        """Answer one of the loop's requests; raises WorkerDied on crash or timeout."""
        from engine import judge
        deadline = time.monotonic() + timeout_s
        self.stage = None
        op = msg.get("op")
        if op == "evaluate":
            return judge.evaluate(self, msg, deadline)
        if op == "time_reference":
            return judge.time_reference(self, msg, deadline)
        if op == "hello":
            return dict(self.hello or {})
        return {"error": f"unknown op {op!r}"}


# =============================================================================================
# the runner process (inside the sandbox)
# =============================================================================================
def _main() -> None:
    proto = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)                      # candidate prints go to stderr, not into the protocol
    sys.stdout = sys.stderr

    def send(obj, payloads=()):
        views = [memoryview(p).cast("B") for p in payloads]
        if views:
            obj = dict(obj, payload=[v.nbytes for v in views])
        proto.write((json.dumps(obj, default=_jsonable) + "\n").encode())
        for v in views:
            proto.write(v)

    import torch  # noqa: F401  (imported before any candidate, as are the clocks in bench)
    from engine import bench, hw  # noqa: F401
    from engine import verify
    import kernels
    verify.install_launch_counter()
    verify.warm_imports()  # modules torch imports lazily re-bind torch attributes on first import
    for name in kernels.FAMILY_NAMES:
        kernels.get(name)
    if torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(GPU_MEMORY_SHARE)
    workdir = tempfile.mkdtemp(prefix="cand-")
    state = {"fn": None, "fam": None, "tainted": False, "sets": {}, "snapshot": None}
    if os.environ.get("NIGHTSHIFT_SHARED_FD"):
        state["shared"] = _Shared(int(os.environ["NIGHTSHIFT_SHARED_FD"]))
    state["snapshot"] = verify.tamper_snapshot()

    for line in sys.stdin.buffer:
        try:
            req = json.loads(line)
        except json.JSONDecodeError:
            send({"error": "bad request"})
            continue
        op = req.get("op")
        if op == "exit":
            break
        try:
            handler = _OPS.get(op)
            if handler is None:
                send({"error": f"unknown op {op!r}"})
            else:
                handler(req, state, send, workdir)
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


def _op_hello(req, state, send, workdir):
    from engine import hw
    info = hw.detect()
    info["ceilings"] = hw.measure_ceilings() if info["timing_mode"] == "gpu" and req.get(
        "measure", True) else {}
    info["pid"] = os.getpid()
    info["uid"] = os.getuid()
    info["env_names"] = sorted(os.environ)
    try:
        info["sandbox"] = json.loads(os.environ.get("NIGHTSHIFT_SANDBOX_REPORT", "{}"))
    except json.JSONDecodeError:
        info["sandbox"] = {"mode": "unknown"}
    send(info)


def _fatal(msg: str) -> bool:
    m = msg.lower()
    return any(s in m for s in ("cuda error", "illegal memory", "device-side assert", "hip error",
                                "unspecified launch failure", "misaligned address"))


def _tampered(state) -> str | None:
    from engine import verify
    return verify.tamper_check(state["snapshot"])


def _op_load(req, state, send, workdir):
    """Check (again, here: the allow list is the first line) and import a candidate."""
    import kernels
    from engine import verify
    fam = kernels.get(req["family"], req.get("spec"))
    state.update(fn=None, fam=fam, tainted=True)
    why = verify.static_check(req["source"], fam.arg_names)
    if why:
        return send({"ok": False, "error": f"static check failed: {why}"})
    try:
        fn = verify.load_candidate(req["source"], workdir)
    except Exception as e:
        return send({"ok": False, "error": f"import failed: {type(e).__name__}: {str(e)[:500]}"})
    tampered = _tampered(state)
    if tampered:
        return send({"ok": False, "error": tampered, "restart": True})
    state["fn"] = fn
    send({"ok": True})


def _tensor_bytes(t):
    """(meta, contiguous host bytes) of a tensor, any dtype."""
    t = t.detach()
    meta = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
    flat = t.contiguous().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    return meta, flat.view(__import__("torch").uint8).numpy()


class OutputTooLarge(Exception):
    """A candidate's outputs do not fit the buffer and the buffer cannot grow to them."""


class _Shared:
    """The runner's end of the output buffer the judge handed it (a memfd): outputs are copied
    straight from the device into it, with no pipe in between."""

    def __init__(self, fd: int):
        self.fd, self.map, self.size = fd, None, 0

    def put(self, outs) -> list[dict]:
        import mmap
        import torch
        flats = [o.detach().contiguous().reshape(-1).view(torch.uint8) for o in outs]
        total = sum(f.numel() for f in flats)
        if total > self.size:
            if self.map is not None:
                self.map.close()
                self.map, self.size = None, 0
            have = os.fstat(self.fd).st_size        # the judge sized it for the expected outputs
            if total > have:
                try:
                    os.ftruncate(self.fd, total)
                except OSError as e:                # past the sandbox's file-size limit
                    raise OutputTooLarge(f"returned {total} bytes of outputs, more than the "
                                         f"{have} the reference's outputs take ({e.strerror})") from None
                have = total
            self.map, self.size = mmap.mmap(self.fd, have), have
        metas, off = [], 0
        for o, f in zip(outs, flats):
            n = f.numel()
            if n:
                torch.frombuffer(self.map, dtype=torch.uint8, count=n, offset=off).copy_(f)
            metas.append({"shape": list(o.shape), "dtype": str(o.dtype).replace("torch.", ""),
                          "offset": off, "nbytes": n})
            off += n
        return metas


def _op_call(req, state, send, workdir):
    """Run the loaded candidate on one case; send its outputs (the judge compares them)."""
    from engine import verify
    import torch
    case = verify.Case.from_row(req["case"])
    try:
        outs = verify.run_case(state["fn"], state["fam"], case, _device(),
                               int(req.get("repeats", 1)))
    except verify.CandidateError as e:
        tampered = _tampered(state)
        return send({"ok": False, "error": tampered or str(e),
                     "restart": bool(tampered) or _fatal(str(e))})
    except (torch.OutOfMemoryError, MemoryError) as e:   # making the case's inputs ran out
        return send({"ok": False, "error": f"out of memory at {case}: {str(e)[:300]}",
                     "restart": True})
    tampered = _tampered(state)
    if tampered:
        return send({"ok": False, "error": tampered, "restart": True})
    shared = state.get("shared")
    if shared is not None:
        try:
            metas = shared.put(outs)
        except OutputTooLarge as e:                  # a wrong answer, told as one
            return send({"ok": False, "error": str(e), "restart": False})
        send({"ok": True, "outputs": metas, "shared": True})
        return
    metas, bufs = zip(*(_tensor_bytes(o) for o in outs))
    send({"ok": True, "outputs": list(metas)}, bufs)


def _op_prep(req, state, send, workdir):
    """Inputs for timing one shape (rotated sets: together more than twice the L2) and the
    warm-up: compile, autotune, caches. Kept until "drop"."""
    import torch
    from engine import bench
    fam = state["fam"] if req.get("candidate", True) else _reference_family(req)
    fn = state["fn"] if req.get("candidate", True) else fam.baseline_op()
    device = _device()
    gpu = device == "cuda"
    gen = torch.Generator(device=device)
    gen.manual_seed(int(req.get("seed", 0)) + 7919)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20) if gpu else 0
    dtype = getattr(torch, req["dtype"])
    nbytes, _ = fam.cost(tuple(req["shape"]), dtype)
    k = bench.input_set_count(nbytes, l2, gpu)
    sets = [fam.make_inputs(tuple(req["shape"]), dtype, device, gen) for _ in range(k)]
    try:
        spin = bench.warm_up(fn, sets, gpu)
    except Exception as e:
        return send({"ok": False, "error": f"raised during timing: {type(e).__name__}: "
                                           f"{str(e)[:400]}", "restart": _fatal(str(e))})
    state["sets"][req["key"]] = (fn, sets, spin)
    tampered = _tampered(state)
    if tampered:
        return send({"ok": False, "error": tampered, "restart": True})
    send({"ok": True, "sets": k})


def _op_sample(req, state, send, workdir):
    """``n`` timed calls (bench.samples) on the prepared sets; the judge computes the rest."""
    from engine import bench
    fn, sets, spin = state["sets"][req["key"]]
    try:
        out = bench.samples(fn, sets, _device() == "cuda", int(req["n"]), int(req.get("offset", 0)),
                            spin)
    except Exception as e:
        return send({"ok": False, "error": f"raised during timing: {type(e).__name__}: "
                                           f"{str(e)[:400]}", "restart": _fatal(str(e))})
    tampered = _tampered(state)
    if tampered:
        return send({"ok": False, "error": tampered, "restart": True})
    send({"ok": True, "samples": out})


def _op_drop(req, state, send, workdir):
    state["sets"].pop(req["key"], None)
    if _device() == "cuda":
        import torch
        torch.cuda.empty_cache()
    send({"ok": True})


def _reference_family(req):
    import kernels
    return kernels.get(req["family"], req.get("spec"))


def _op_compile_reference(req, state, send, workdir):
    """torch.compile of the family's baseline op in one mode (the user's alternative): the
    compiled function replaces the reference for the next prep with "compiled": true."""
    import torch
    fam = _reference_family(req)
    if state["tainted"]:
        return send({"ok": False, "error": "a candidate was loaded in this runner"})
    try:
        fn = torch.compile(fam.baseline_op(), mode=req["mode"], dynamic=False)
    except Exception as e:
        return send({"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"})
    state["compiled"] = fn
    send({"ok": True})


def _op_prep_reference(req, state, send, workdir):
    """Like prep, for the reference (eager, or its compiled form); refused once a candidate ran
    here: a candidate must not be able to slow the baseline it is measured against."""
    if state["tainted"]:
        return send({"ok": False, "error": "a candidate was loaded in this runner"})
    fam = _reference_family(req)
    fn = state.get("compiled") if req.get("compiled") else fam.baseline_op()
    saved = state["fn"], state["fam"]
    state["fn"], state["fam"] = fn, fam
    try:
        _op_prep(dict(req, candidate=True), state, send, workdir)
    finally:
        state["fn"], state["fam"] = saved


def _op_release_reference(req, state, send, workdir):
    """The compiled references go, with dynamo's caches and CUDA graph pools (each
    cudagraph mode keeps static copies of the inputs and outputs): the candidates' stages
    after the baselines get that memory back (KernelBench's 7 GB FrobeniusNorm input ran out
    of GPU memory in the shape sweep after four compile modes of its reference)."""
    import gc
    import torch
    state.pop("compiled", None)
    torch._dynamo.reset()
    gc.collect()
    if _device() == "cuda":
        torch.cuda.empty_cache()
    send({"ok": True})


_OPS = {"hello": _op_hello, "load": _op_load, "call": _op_call, "prep": _op_prep,
        "sample": _op_sample, "drop": _op_drop, "prep_reference": _op_prep_reference,
        "compile_reference": _op_compile_reference, "release_reference": _op_release_reference}


if __name__ == "__main__":
    _main()
