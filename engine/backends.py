"""Evaluation backends: where candidates are verified and timed.

One interface, ``Pool``, over a list of slots; each slot is one worker process (engine/worker.py)
that candidate code runs in. The loop submits ``Job``s and collects ``Done``s; it never learns which
backend runs them, and the proposers and the store do not know there is more than one worker.

    single   one local worker, unpinned (the default; what a run has always been)
    local    one local worker per visible GPU, pinned by CUDA_VISIBLE_DEVICES=<index>; on a machine
             without a GPU, N unpinned interpreter workers
    ray      Ray actors holding one GPU each (one CPU each when the cluster has no GPU), on any
             number of nodes; each actor owns a worker process, so a candidate that crashes takes
             down that process, not the actor; an actor that is lost with its node is re-created

A thread per slot takes the first queued job it may run (``only``: the reference worker re-times;
``avoid``: a retry goes elsewhere), blocks on the worker, and puts the result on one queue. A worker
that dies or hangs is restarted by its own thread before it takes the next job; the loop decides
whether the job is retried. Slot state lives in memory here; the loop writes ``snapshot()`` to the
store about once a second (the store has one writer).
"""
from __future__ import annotations

import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.worker import Worker, WorkerDied

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("single", "local", "ray")
MAX_WORKERS = 256
RESTART_TRIES = 3            # a slot whose worker fails to start this many times in a row is dead
# From this many live workers on, the reference worker only re-times would-be bests: with N workers
# sending it a share p of their results, a reference that also evaluates saturates near
# N = t_eval / (p x t_retime) (docs/scaling.md); dedicated, it costs one worker of N.
DEDICATED_REFERENCE_FROM = 5
# What a Ray job uploads to the cluster: the engine and the kernels, not runs or docs.
RAY_EXCLUDES = ["data/", "docs/", "tests/", ".git/", "*.db", "*.db-wal", "*.db-shm", "__pycache__/",
                ".whl/", ".ci/"]


@dataclass
class Job:
    key: int                                   # the loop's handle on it
    req: dict                                  # the worker request (op evaluate)
    timeout_s: float
    only: str | None = None                    # run on this slot alone (re-timing on the reference)
    avoid: frozenset = frozenset()             # not on these slots (a retry after a worker died)
    attempt: int = 1
    meta: dict = field(default_factory=dict)   # the loop's bookkeeping, untouched here


@dataclass
class Done:
    job: Job
    slot: str
    reply: dict | None          # the worker's reply; None when the worker died under the job
    died: WorkerDied | None
    elapsed_s: float


# ---------------------------------------------------------------------------------------------
# slots
# ---------------------------------------------------------------------------------------------
class LocalSlot:
    """A worker process on this machine, pinned to one GPU index (or unpinned)."""

    def __init__(self, name: str, interpret: bool, device_index: int | None,
                 db_path: str | None = None, fresh_retime: bool | None = None):
        self.name = name
        self.worker = Worker(interpret=interpret, device_index=device_index, name=name,
                             db_path=db_path, fresh_retime=fresh_retime)
        self.device_index = device_index
        self.host = socket.gethostname()

    def start(self, timeout_s: float = 300.0) -> dict:
        return self.worker.start(timeout_s=timeout_s)

    def restart(self) -> dict:
        return self.worker.restart()

    def request(self, req: dict, timeout_s: float) -> dict:
        return self.worker.request(req, timeout_s=timeout_s)

    def close(self) -> None:
        self.worker.close()


class RayWorkerActor:
    """Runs inside a Ray actor: owns one worker process on the actor's node and GPU.

    Ray sets CUDA_VISIBLE_DEVICES for an actor with num_gpus=1, and the worker's allow-listed
    environment passes it on, so the worker sees exactly the actor's GPU."""

    def __init__(self, interpret: bool, name: str, fresh_retime: bool | None = None):
        self.worker = Worker(interpret=interpret, device_index=None, name=name,
                             fresh_retime=fresh_retime)

    def start(self, timeout_s: float) -> dict:
        hello = self.worker.start(timeout_s=timeout_s)
        hello["host"] = socket.gethostname()
        return hello

    def request(self, req: dict, timeout_s: float) -> dict:
        # a WorkerDied crosses the Ray boundary as data, so the driver can tell a candidate that
        # killed its worker (the actor is fine) from an actor lost with its node
        try:
            return {"reply": self.worker.request(req, timeout_s=timeout_s)}
        except WorkerDied as e:
            return {"died": str(e), "stage": e.stage, "timed_out": e.timed_out}

    def restart(self) -> dict:
        hello = self.worker.restart()
        hello["host"] = socket.gethostname()
        return hello

    def close(self) -> None:
        self.worker.close()


class RaySlot:
    """A Ray actor (one GPU, or one CPU on a cluster without GPUs) holding one worker."""

    def __init__(self, name: str, interpret: bool, num_gpus: float,
                 fresh_retime: bool | None = None):
        import ray
        self.ray = ray
        self.name = name
        self.interpret = interpret
        self.fresh_retime = fresh_retime
        self.num_gpus = num_gpus
        self.device_index = None
        self.host = None
        self.actor = None
        self._cls = ray.remote(RayWorkerActor)

    def _new_actor(self) -> None:
        opts = {"num_gpus": self.num_gpus} if self.num_gpus else {"num_cpus": 1}
        self.actor = self._cls.options(max_restarts=0, max_task_retries=0, **opts).remote(
            self.interpret, self.name, self.fresh_retime)

    def _get(self, ref, timeout_s: float):
        ex = self.ray.exceptions
        try:
            return self.ray.get(ref, timeout=timeout_s)
        except ex.GetTimeoutError:
            self._drop_actor()
            raise WorkerDied(f"Ray actor gave no answer in {timeout_s:.0f} s (killed)", None,
                             timed_out=True) from None
        except ex.RayActorError as e:   # the actor's process or its node is gone
            self._drop_actor()
            raise WorkerDied(f"Ray actor lost (its process or node died): "
                             f"{str(e).splitlines()[0][:300]}", None) from None

    def _drop_actor(self) -> None:
        if self.actor is not None:
            try:
                self.ray.kill(self.actor)
            except Exception:
                pass
        self.actor = None

    def start(self, timeout_s: float = 600.0) -> dict:
        self._new_actor()
        hello = self._get(self.actor.start.remote(timeout_s), timeout_s + 120)
        self.host = hello.get("host")
        return hello

    def restart(self) -> dict:
        if self.actor is None:               # lost with its node: a new actor, anywhere it fits
            return self.start()
        try:
            return self._get(self.actor.restart.remote(), 420.0)
        except WorkerDied:
            return self.start()

    def request(self, req: dict, timeout_s: float) -> dict:
        if self.actor is None:
            raise WorkerDied("Ray actor is not running", None)
        out = self._get(self.actor.request.remote(req, timeout_s), timeout_s + 120)
        if "died" in out:
            raise WorkerDied(out["died"], out["stage"], out["timed_out"])
        return out["reply"]

    def close(self) -> None:
        if self.actor is not None:
            try:
                self.ray.get(self.actor.close.remote(), timeout=30)
            except Exception:
                pass
            self._drop_actor()


# ---------------------------------------------------------------------------------------------
# the pool
# ---------------------------------------------------------------------------------------------
@dataclass
class _State:
    state: str = "starting"
    family: str | None = None
    since: float = field(default_factory=time.time)
    jobs: int = 0
    died: int = 0
    restarts: int = 0
    busy_s: float = 0.0
    started_at: float | None = None
    pid: int | None = None
    gpu_name: str | None = None
    device: str | None = None
    failed_starts: int = 0


class Pool:
    """Slots, a job queue and one result queue. Thread-safe for one caller (the loop)."""

    def __init__(self, slots: list, backend: str, on_close=None):
        if not slots:
            raise ValueError("a pool needs at least one worker")
        self.slots = {s.name: s for s in slots}
        self.backend = backend
        self.reference = slots[0].name     # every new best is timed here
        self.hellos: dict[str, dict] = {}
        self._state = {s.name: _State() for s in slots}
        self._jobs: list[Job] = []
        self._cond = threading.Condition()
        self._results: queue.Queue = queue.Queue()
        self._closed = False
        self.start_errors: dict[str, str] = {}    # workers that did not start, and why
        self._threads: list[threading.Thread] = []
        self._on_close = on_close

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout_s: float = 600.0) -> dict:
        """Start every worker (in parallel); returns the reference worker's hello. A worker other
        than the reference that cannot start is marked dead and the run goes on without it."""
        errors = self.start_errors

        def boot(slot):
            try:
                self._started(slot.name, slot.start(timeout_s))
            except Exception as e:
                errors[slot.name] = f"{type(e).__name__}: {e}"
                self._set(slot.name, state="dead")

        threads = [threading.Thread(target=boot, args=(s,), daemon=True) for s in self.slots.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.reference in errors:
            self.close()
            raise RuntimeError(f"the reference worker {self.reference} did not start: "
                               f"{errors[self.reference]}")
        for s in self.slots.values():
            t = threading.Thread(target=self._serve, args=(s,), name=f"nightshift-{s.name}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        return self.hellos[self.reference]

    def _started(self, name: str, hello: dict) -> None:
        dev = hello.get("name") or "cpu"
        slot = self.slots[name]
        where = (f"cuda:{slot.device_index}" if slot.device_index is not None
                 else ("cuda" if hello.get("timing_mode") == "gpu" else "cpu"))
        self.hellos[name] = hello
        # started_at stays the first start: busy share and rate are per slot, across restarts
        self._set(name, state="idle", pid=hello.get("pid"), gpu_name=dev, device=where,
                  started_at=self._state[name].started_at or time.time(), failed_starts=0)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._jobs.clear()
            self._cond.notify_all()
        closers = [threading.Thread(target=s.close, daemon=True) for s in self.slots.values()]
        for t in closers:
            t.start()
        for t in closers:
            t.join(timeout=60)
        for name in self.slots:
            self._set(name, state="closed", family=None)
        if self._on_close:
            self._on_close()

    # -- the loop's side --------------------------------------------------------------------------
    def reference_alive(self) -> bool:
        with self._cond:
            return self._state[self.reference].state not in ("dead", "closed")

    def live(self) -> list[str]:
        with self._cond:
            return [n for n, st in self._state.items() if st.state not in ("dead", "closed")]

    def _dedicated(self) -> bool:
        live = sum(1 for st in self._state.values() if st.state not in ("dead", "closed"))
        return live >= DEDICATED_REFERENCE_FROM

    def free(self) -> int:
        """Live workers not busy, minus jobs already waiting: how many more jobs to submit now."""
        with self._cond:
            skip = {j.only for j in self._jobs if j.only}   # spoken for by a queued re-time
            if self._dedicated():
                skip.add(self.reference)
            idle = sum(1 for n, st in self._state.items() if st.state == "idle" and n not in skip)
            return max(0, idle - sum(1 for j in self._jobs if j.only is None))

    def submit(self, job: Job) -> None:
        with self._cond:
            self._jobs.append(job)
            self._cond.notify_all()

    def results(self, timeout: float = 0.0) -> list[Done]:
        out = []
        try:
            out.append(self._results.get(timeout=timeout) if timeout > 0
                       else self._results.get_nowait())
            while True:
                out.append(self._results.get_nowait())
        except queue.Empty:
            pass
        return out

    def call(self, slot: str, req: dict, timeout_s: float) -> dict:
        """Run one request on one worker and wait for it (reference timings before the loop).
        Done results of other jobs that arrive meanwhile stay queued for ``results``."""
        box: queue.Queue = queue.Queue()
        self.submit(Job(key=-1, req=req, timeout_s=timeout_s, only=slot, meta={"reply_to": box}))
        while True:
            try:
                done: Done = box.get(timeout=1.0)
                break
            except queue.Empty:
                with self._cond:
                    gone = self._state[slot].state in ("dead", "closed")
                if gone:
                    raise WorkerDied(f"worker {slot} is dead: it could not be restarted", None)
        if done.died:
            raise done.died
        return done.reply

    def same_model(self, name: str) -> bool:
        """Timings of this worker compare directly with the reference's: the same GPU model."""
        with self._cond:
            return self._state[name].gpu_name == self._state[self.reference].gpu_name

    def retry_possible(self, avoid: set) -> bool:
        """Is there a live worker outside ``avoid`` to retry a job on?"""
        return any(n not in avoid for n in self.live())

    def snapshot(self) -> list[dict]:
        with self._cond:
            return [dict(name=n, backend=self.backend, reference=int(n == self.reference),
                         host=self.slots[n].host, device=st.device, gpu_name=st.gpu_name,
                         pid=st.pid, state=st.state, family=st.family, since=st.since,
                         jobs=st.jobs, died=st.died, restarts=st.restarts, busy_s=st.busy_s,
                         started_at=st.started_at)
                    for n, st in self._state.items()]

    # -- the slots' side --------------------------------------------------------------------------
    def _set(self, name: str, **kw) -> None:
        with self._cond:
            st = self._state[name]
            if "state" in kw and kw["state"] != st.state:
                st.since = time.time()
            for k, v in kw.items():
                setattr(st, k, v)

    def _take(self, name: str) -> Job | None:
        with self._cond:
            while True:
                if self._closed:
                    return None
                if self._state[name].state == "idle":
                    live = [n for n, st in self._state.items() if st.state not in ("dead", "closed")]
                    for i, job in enumerate(self._jobs):
                        if job.only is not None:
                            ok = job.only == name
                        elif name == self.reference and self._dedicated():
                            ok = False
                        else:   # avoid what it may; a job nobody else can take runs anywhere
                            ok = name not in job.avoid or all(n in job.avoid for n in live)
                        if ok:
                            st = self._state[name]
                            st.state, st.since = "busy", time.time()
                            st.family = job.req.get("family")
                            return self._jobs.pop(i)
                self._cond.wait(0.5)

    def _serve(self, slot) -> None:
        name = slot.name
        while True:
            job = self._take(name)
            if job is None:
                return
            t0 = time.monotonic()
            reply, died = None, None
            try:
                reply = slot.request(job.req, job.timeout_s)
            except WorkerDied as e:
                died = e
            except Exception as e:   # a backend failure (e.g. Ray itself): the worker is suspect
                died = WorkerDied(f"{type(e).__name__}: {e}", None)
            elapsed = time.monotonic() - t0
            with self._cond:
                st = self._state[name]
                st.jobs += 1
                st.busy_s += elapsed
                st.died += died is not None
            if died is not None or (reply or {}).get("restart"):
                self._restart(slot)
            else:
                self._set(name, state="idle", family=None)
            done = Done(job, name, reply, died, elapsed)
            box = job.meta.get("reply_to")
            (box or self._results).put(done)
            with self._cond:
                self._cond.notify_all()
            if self._state[name].state == "dead":
                return

    def _restart(self, slot) -> None:
        self._set(slot.name, state="restarting", family=None)
        while not self._closed:
            try:
                hello = slot.restart()
            except Exception:
                with self._cond:
                    st = self._state[slot.name]
                    st.failed_starts += 1
                    if st.failed_starts >= RESTART_TRIES:
                        st.state, st.since = "dead", time.time()
                        return
                time.sleep(1.0)
                continue
            with self._cond:
                self._state[slot.name].restarts += 1
            self._started(slot.name, hello)
            if self._closed:          # closed while it restarted: leave no process behind
                slot.close()
            return


# ---------------------------------------------------------------------------------------------
# making one
# ---------------------------------------------------------------------------------------------
def kind(workers: int | None, ray_address: str | None) -> str:
    return "ray" if ray_address else ("local" if workers else "single")


def make(workers: int | None, ray_address: str | None, interpret: bool,
         db_path: str | None = None, fresh_retime: bool | None = None) -> Pool:
    """The pool a run's configuration asks for (see RunConfig.workers / ray_address). Local
    workers' sandboxes hide ``db_path``'s folder; ``fresh_retime`` (None: on a GPU) re-times
    every would-be best in a fresh worker process."""
    backend = kind(workers, ray_address)
    if backend == "single":
        return Pool([LocalSlot("w0", interpret, None, db_path, fresh_retime)], "single")
    if backend == "local":
        slots = [LocalSlot(f"w{i}", interpret, None if interpret else i, db_path, fresh_retime)
                 for i in range(workers)]
        return Pool(slots, "local")
    ray = ray_connect(ray_address, workers)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    n = workers or (gpus if gpus else 2)
    if not interpret and gpus < n:
        raise RuntimeError(f"the Ray cluster at {ray_address} has {gpus} GPU(s); {n} asked for")
    slots = [RaySlot(f"w{i}", interpret, 1 if (gpus and not interpret) else 0, fresh_retime)
             for i in range(n)]
    owns = getattr(ray, "_nightshift_owns", False)
    return Pool(slots, "ray", on_close=(ray.shutdown if owns else None))


def ray_connect(address: str, workers: int | None = None):
    """Connect to (or, for "local", start) a Ray cluster, shipping this project's code to it."""
    import ray
    if ray.is_initialized():
        return ray
    env = {"working_dir": str(ROOT), "excludes": RAY_EXCLUDES}
    kw = dict(runtime_env=env, log_to_driver=False, include_dashboard=False,
              configure_logging=False)
    if address == "local":
        # a throwaway cluster on this machine; on a machine without GPUs each actor takes a CPU,
        # so make room for every worker and a replacement
        ray.init(num_cpus=max(os.cpu_count() or 1, (workers or 2) + 1), **kw)
        ray._nightshift_owns = True
    else:
        ray.init(address=address, **kw)
        ray._nightshift_owns = False
    return ray


def ray_disconnect() -> None:
    """Shut down a cluster this process started (--ray local); leave a shared one alone."""
    import sys
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and getattr(ray, "_nightshift_owns", False):
        ray.shutdown()


def check_ray(address: str) -> str | None:
    """None when ``--ray ADDRESS`` can be used, else why not (for the CLI and the dashboard)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "--ray needs the ray package: pip install 'ray[default]'"
    if not address or any(ch.isspace() for ch in address):
        return "--ray takes a cluster address: auto, local, HOST:PORT or ray://HOST:10001"
    return None
