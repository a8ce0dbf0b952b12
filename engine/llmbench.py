"""A scripted OpenAI-compatible server, and ``python -m engine llm-bench`` built on it.

``ScriptedServer`` is a real HTTP server on 127.0.0.1 (stdlib ``http.server``, a thread per
request) that answers ``POST /v1/chat/completions`` and ``GET /v1/models`` the way an OpenAI-
compatible server does, from a script: ``script(n, attempt) -> Step`` for the proposer's request
number ``n`` (read from the "Nightshift request #n" line of the prompt, so replies do not depend
on the order in which parallel requests arrive) and the how-many-th time that request came.
A step can answer after a delay, with an HTTP error (429, 500), or with any text. The tests use
it to drive litellm's real client path; the benchmark uses it as a model with a fixed latency.

``llm-bench`` runs the real loop (llama-tiny, softmax, the worker, all five verifier stages, the
benchmark) with the LLM proposer against the server, which answers every request after a fixed
delay with a distinct correct softmax kernel, once per value of ``--in-flight``, and reports
experiments per hour from the first proposal to the last recorded experiment (model profiling,
worker start and reference timing excluded), and how long the worker sat idle waiting on the
model.
"""
from __future__ import annotations

import json
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable


@dataclass
class Step:
    text: str | None = None       # the assistant's message
    status: int = 200             # an HTTP error status instead (429, 500, ...)
    delay_s: float = 0.0          # wait this long before answering
    tokens: tuple[int, int] = (1000, 500)   # usage reported: prompt, completion


class ScriptedServer:
    def __init__(self, script: Callable[[int, int], Step], model_id: str = "scripted"):
        self.script = script
        self.model_id = model_id
        self.requests: list[dict] = []     # one per HTTP chat request, in arrival order
        self.max_concurrent = 0
        self._active = 0
        self._attempts: dict[int, int] = {}
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):   # quiet
                pass

            def _send(self, status: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass   # the client gave up (its timeout): nothing to answer

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [
                        {"id": server.model_id, "object": "model", "owned_by": "nightshift"}]})
                else:
                    self._send(404, {"error": {"message": "not found", "type": "not_found"}})

            def do_POST(self):
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": "not found", "type": "not_found"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                server._answer(self, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def start(self) -> "ScriptedServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def _answer(self, handler, body: dict) -> None:
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        m = re.search(r"Nightshift request #(\d+)", prompt)
        with self._lock:
            n = int(m.group(1)) if m else len(self.requests) + 1
            self._attempts[n] = attempt = self._attempts.get(n, 0) + 1
            self._active += 1
            self.max_concurrent = max(self.max_concurrent, self._active)
            rec = {"n": n, "attempt": attempt, "t0": time.time(), "prompt": prompt,
                   "model": body.get("model"), "headers": dict(handler.headers)}
            self.requests.append(rec)
        try:
            step = self.script(n, attempt)
            if step.delay_s:
                time.sleep(step.delay_s)
            rec["status"] = step.status
            if step.status != 200:
                handler._send(step.status, {"error": {"message": f"scripted HTTP {step.status}",
                                                      "type": "scripted", "code": step.status}})
                return
            tin, tout = step.tokens
            handler._send(200, {
                "id": f"chatcmpl-{n}-{attempt}", "object": "chat.completion",
                "created": int(time.time()), "model": body.get("model", self.model_id),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": step.text}}],
                "usage": {"prompt_tokens": tin, "completion_tokens": tout,
                          "total_tokens": tin + tout}})
        finally:
            with self._lock:
                self._active -= 1
                rec["t1"] = time.time()


# ---------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------
def _bench_sources(n: int) -> list[str]:
    """``n`` distinct correct softmax kernels of similar cost under the interpreter: the one-pass
    starter with 8 rows per program, varied in warps, exp2 and cache hints."""
    import kernels
    fam = kernels.get("softmax")
    out = []
    for warps in fam.space["num_warps"]:
        for exp2 in (False, True):
            for hints in (False, True):
                out.append(fam.render(dict(fam.default, rows_per_prog=8, num_warps=warps,
                                           use_exp2=exp2, cache_hints=hints)))
    assert n <= len(out), f"at most {len(out)} distinct bench kernels"
    return out[:n]


def bench_one(delay_s: float, in_flight: int, experiments: int, db: str, log=None) -> dict:
    """One loop run against a server answering after ``delay_s``; its throughput figures."""
    from engine import proposers
    from engine.loop import RunConfig, execute
    from engine.store import Store
    sources = _bench_sources(experiments + in_flight)

    def script(n, attempt):
        src = sources[(n - 1) % len(sources)]
        return Step(text=f"```python\n{src}```\nHypothesis: bench variant {n}", delay_s=delay_s)

    with ScriptedServer(script) as server:
        cfg = RunConfig(model="llama-tiny", families=["softmax"], proposer="llm",
                        llm_model="openai/scripted", api_base=server.api_base,
                        max_in_flight=in_flight, budget_experiments=experiments, db=db,
                        patience=10_000, llm_timeout_s=delay_s + 120, llm_retries=0)
        cfg.validate()
        prop = proposers.make("llm", 0, cfg=cfg, api_key="sk-bench-not-a-secret")
        run_id = execute(cfg, log=log or (lambda s: None), proposer=prop)
    store = Store(db, readonly=True)
    exps = store.experiments(run_id)
    store.close()
    t0 = prop.stats["first_propose_at"]
    wall = exps[-1]["created_at"] - t0
    return {"delay_s": delay_s, "in_flight": in_flight, "experiments": len(exps),
            "states": ",".join(sorted({e["state"] for e in exps})), "wall_s": wall,
            "per_hour": len(exps) / wall * 3600, "waited_s": prop.stats["waited_s"],
            "eval_s": sum(e["duration_s"] or 0 for e in exps) / len(exps),
            "model_s": sum(e["proposal_latency_s"] or 0 for e in exps) / len(exps),
            "max_concurrent": server.max_concurrent}


def markdown(rows: list[dict]) -> str:
    out = ["| reply delay (s) | in flight | experiments | wall (s) | experiments / hour | "
           "worker idle waiting on the model (s) | mean evaluation (s) | mean model latency (s) | "
           "most concurrent requests |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['delay_s']:g} | {r['in_flight']} | {r['experiments']} ({r['states']}) | "
                   f"{r['wall_s']:.0f} | {r['per_hour']:.0f} | {r['waited_s']:.1f} | "
                   f"{r['eval_s']:.1f} | {r['model_s']:.1f} | {r['max_concurrent']} |")
    return "\n".join(out) + "\n"


def cmd_llm_bench(a) -> int:
    import platform
    import os
    from engine.llm import _litellm
    delays = a.delay or [2.0]
    flights = [int(x) for x in a.in_flight.split(",") if x.strip()]
    rows = []
    _litellm()   # import once up front (seconds), so no run pays for it inside its first request
    with tempfile.TemporaryDirectory(prefix="nightshift-llm-bench-") as tmp:
        for d in delays:
            for k in flights:
                print(f"delay {d:g} s, {k} in flight: running {a.experiments} experiments ...",
                      flush=True)
                rows.append(bench_one(d, k, a.experiments, str(Path(tmp) / f"b-{d}-{k}.db")))
                print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    head = (f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
            f"{'Triton interpreter (timings are not GPU performance)' if _interpreted() else 'GPU'}")
    text = head + "\n\n" + markdown(rows)
    print(text, end="")
    if a.out:
        Path(a.out).write_text(text)
    return 0


def _interpreted() -> bool:
    import torch
    return not torch.cuda.is_available()
