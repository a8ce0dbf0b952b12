"""A compromised runner: speaks the worker's protocol (engine/worker.py) and lies.

It stands for the worst case, a candidate that took over its worker process completely: it can
compute with PyTorch, skip the guard and report any timing. The judge must still reject what
it sends. ``FAKE_MODE``:
- zeros: every call answers zeros of the input's shape, and claims success;
- forged_clock: calls answer the right values (computed with PyTorch, as a taken-over worker
  could), timing samples claim 1 us while each takes 4 ms.
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels  # noqa: E402
from engine import verify  # noqa: E402

MODE = os.environ.get("FAKE_MODE", "zeros")
out = os.fdopen(os.dup(1), "wb", buffering=0)
state = {}


def send(obj, payloads=()):
    if payloads:
        obj = dict(obj, payload=[len(p) for p in payloads])
    out.write((json.dumps(obj) + "\n").encode())
    for p in payloads:
        out.write(p)


for line in sys.stdin.buffer:
    req = json.loads(line)
    op = req["op"]
    if op == "exit":
        break
    if op == "hello":
        send({"timing_mode": "interpreter", "name": "cpu", "ceilings": {}, "pid": os.getpid(),
              "sandbox": {"mode": "none", "why": "a test double"}, "env_names": []})
    elif op == "load":
        state["fam"] = kernels.get(req["family"], req.get("spec"))
        send({"ok": True})
    elif op == "call":
        case = verify.Case.from_row(req["case"])
        inputs = verify.case_inputs(state["fam"], case, "cpu")
        if MODE == "zeros":
            o = torch.zeros_like(inputs["x"])
        else:
            o = state["fam"].reference(**inputs)
        b = o.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        meta = {"shape": list(o.shape), "dtype": str(o.dtype).replace("torch.", "")}
        send({"ok": True, "outputs": [meta] * req.get("repeats", 1)},
             [b] * req.get("repeats", 1))
    elif op == "prep":
        send({"ok": True, "sets": 2})
    elif op == "sample":
        time.sleep(0.004 * req["n"])
        send({"ok": True, "samples": [1.0] * req["n"]})
    elif op == "drop":
        send({"ok": True})
    else:
        send({"error": f"unknown op {op}"})
