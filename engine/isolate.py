"""The stages that run a user's model, in a process of their own.

A run started from the dashboard must not import the model's code into the dashboard's process
(it holds the engine, the session's secrets and the page of every other user). Two stages touch
the model: ``prepare`` (build it, capture, match, profile, create the run and its targets:
``loop._prepare``) and ``finish`` (place the kept kernels, check and time the model end to end:
``integrate.finish_run``). ``run_stage`` starts ``python -m engine.isolate``, sends it one
request and relays what the stage does to the caller: log lines, status updates (the run id as
soon as the run exists) and the result. Both stages write the results database themselves, as
they do in process; the parent only forwards. A stop kills the child and its whole group.

The protocol is one JSON object per line on a pipe of its own (the model may print to stdout):
``{"log": str}``, ``{"control": {...}}``, then one of ``{"result": {...}}``,
``{"config_error": str}``, ``{"error": str}``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.2
# environment names the model's process does not need: an LLM proposer's keys stay with the
# engine (the stages never call an LLM)
_SECRET_SUFFIXES = ("_API_KEY", "_API_TOKEN", "_SECRET", "_SECRET_KEY")


class StageStopped(KeyboardInterrupt):
    """The caller asked to stop while the stage ran; the child was killed."""


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.upper().endswith(_SECRET_SUFFIXES)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    return env


def run_stage(request: dict, log, control=None) -> dict:
    """Run one stage in a child process and return its result. ``log(line)`` gets the stage's
    log lines; ``control.set(**kw)`` its status updates; ``control.stop_event`` set kills the
    child (StageStopped). Raises loop.ConfigError for the stage's usage errors and RuntimeError
    for anything else, with the child's last words."""
    from engine.loop import ConfigError
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "engine.isolate", str(write)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=_env(), cwd=os.getcwd(),
                            pass_fds=(write,), start_new_session=True)
    os.close(write)
    proc.stdin.write(json.dumps(request).encode() + b"\n")
    proc.stdin.close()
    tail: list[bytes] = []

    def drain():                  # stderr: kept for the error message, never allowed to block
        for line in proc.stderr:
            tail.append(line)
            del tail[:-20]
    threading.Thread(target=drain, daemon=True).start()
    msgs: list[dict] = []
    reader = threading.Thread(target=_read, args=(read, msgs), daemon=True)
    reader.start()
    outcome = None
    try:
        while True:
            done = proc.poll() is not None and not reader.is_alive()
            while msgs:
                m = msgs.pop(0)
                if "log" in m:
                    log(m["log"])
                elif "control" in m and control is not None:
                    control.set(**m["control"])
                else:
                    outcome = m
            if done or outcome is not None:
                break
            if control is not None and control.stop_event.is_set():
                raise StageStopped(f"stopped during {request['stage']}")
            time.sleep(POLL_S)
    finally:
        if proc.poll() is None and outcome is None:
            _kill(proc)
        proc.wait()
        reader.join(timeout=5)
    if outcome is None:
        last = b"".join(tail).decode(errors="replace").strip().splitlines()
        why = last[-1] if last else f"exit status {proc.returncode}"
        raise RuntimeError(f"the {request['stage']} process ended without a result: {why}")
    if "config_error" in outcome:
        raise ConfigError(outcome["config_error"])
    if "error" in outcome:
        raise RuntimeError(outcome["error"])
    return outcome["result"]


def _read(fd: int, msgs: list) -> None:
    with os.fdopen(fd, "rb") as f:
        for line in f:
            try:
                msgs.append(json.loads(line))
            except json.JSONDecodeError:
                continue


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


# ---- the child ---------------------------------------------------------------------------------
def _prepare(req: dict, send) -> dict:
    from engine import loop
    from engine.store import Store

    class Relay(loop.Control):
        def set(self, **kw):
            super().set(**kw)
            send({"control": kw})

    cfg = loop.RunConfig.from_dict(req["cfg"])
    store = Store(cfg.db)
    try:
        return {"run_id": loop._prepare(cfg, store, Relay(), lambda line: send({"log": line}))}
    finally:
        store.close()


def _finish(req: dict, send) -> dict:
    from engine import integrate
    from engine.store import Store
    store = Store(req["db"])
    deadline = time.monotonic() + req["seconds_left"] if req.get("seconds_left") is not None else None
    try:
        res = integrate.finish_run(store, req["run_id"], lambda line: send({"log": line}),
                                   deadline=deadline)
        return {"status": None if res is None else res.status}
    finally:
        store.close()


STAGES = {"prepare": _prepare, "finish": _finish}


def child(fd: int) -> None:
    from engine.loop import ConfigError
    out = os.fdopen(fd, "w", buffering=1)
    os.dup2(2, 1)                  # whatever the model prints goes to stderr, not the protocol
    lock = threading.Lock()

    def send(msg: dict) -> None:
        with lock:
            out.write(json.dumps(msg, default=str) + "\n")

    try:
        req = json.loads(sys.stdin.readline())
        send({"result": STAGES[req["stage"]](req, send)})
    except ConfigError as e:
        send({"config_error": str(e)})
    except BaseException as e:
        send({"error": f"{type(e).__name__}: {e}"})
    finally:
        out.flush()


if __name__ == "__main__":
    child(int(sys.argv[1]))
