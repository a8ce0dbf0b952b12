"""The LLM proposer against a real OpenAI-compatible HTTP server on 127.0.0.1, through litellm's
real client path (model "openai/<name>" with an api_base): no mocks of litellm.

The server (engine.llmbench.ScriptedServer) answers each of the proposer's requests from a
script keyed by the request number the proposer writes into its prompt, so replies are the same
whatever order parallel requests arrive in."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kernels
from engine import llm, proposers
from engine.llmbench import ScriptedServer, Step
from engine.loop import ConfigError, RunConfig, execute
from engine.proposers import ProposalContext
from engine.report import run_markdown
from engine.store import Store
from engine.worker import Worker, clean_env

ROOT = Path(__file__).resolve().parent.parent
CAND = Path(__file__).parent / "candidates"
KEY = "sk-test-DO-NOT-LEAK-1234"
FAM = kernels.get("softmax")
# correct and cheap under the interpreter: the starter with 8 rows per program (the starter's
# one row per program is ~4x slower to verify)
FAST = FAM.render(dict(FAM.default, rows_per_prog=8))
NO_MAX = (CAND / "softmax_no_max.py").read_text()        # wrong: fails at "stability"
WRONG_SIG = FAST.replace("def kernel_fn(x):", "def kernel_fn(inp):")


def reply(src: str, hyp: str) -> str:
    return f"Here is the kernel.\n\n```python\n{src}```\n\nHypothesis: {hyp}\n"


@pytest.mark.slow   # a minute and more: a whole loop driven by a scripted LLM
def test_loop_with_a_scripted_model_keeps_rejects_records_and_leaks_no_key(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)   # litellm's standard variable for openai/...

    def script(n, attempt):
        if n == 1:   # rate limited once, then a correct kernel
            return Step(status=429) if attempt == 1 else Step(
                text=reply(FAST, "eight rows per program: fewer, fuller programs"))
        if n == 2:
            return Step(text="A persistent grid would help here, but I will not write code today.")
        if n == 3:
            return Step(text=reply(NO_MAX, "skip the max subtraction: one reduction fewer"))
        if n == 4:   # far slower than the request timeout on every attempt
            return Step(text=reply(FAST, "too late"), delay_s=30)
        if n == 5:
            return Step(text=reply(WRONG_SIG, "renamed the argument"))
        return Step(text=reply(FAST, "should never be asked: the token cap is reached"))

    db = tmp_path / "runs.db"
    lines: list[str] = []
    with ScriptedServer(script) as server:
        cfg = RunConfig(model="llama-tiny", families=["softmax"], proposer="llm",
                        llm_model="openai/scripted-coder", api_base=server.api_base,
                        budget_experiments=8, db=str(db), patience=100, worker_timeout_s=120,
                        # 8 s: loose enough that a loaded 2-core box answers the prompt
                        # replies in time, tight enough that #4 times out twice
                        llm_timeout_s=8, llm_retries=1, max_tokens_total=6000,
                        price_in_per_mtok=1.0, price_out_per_mtok=2.0)
        cfg.validate()
        t0 = time.monotonic()
        run_id = execute(cfg, log=lines.append)
        took = time.monotonic() - t0
    s = Store(db, readonly=True)
    exps = s.experiments(run_id)
    run = s.get_run(run_id)
    events = [e["message"] for e in s.events(run_id)]
    report = run_markdown(s, run_id)
    s.close()

    # 1: the 429 was retried after a backoff, then the correct kernel verified and was kept
    assert [e["seq"] for e in exps] == [1, 2, 3, 4, 5], [(e["state"], e["error"]) for e in exps]
    e1, e2, e3, e4, e5 = exps
    assert e1["state"] == "kept" and e1["proposer"] == "llm", e1["error"]
    assert (e1["tokens_in"], e1["tokens_out"]) == (1000, 500)
    assert e1["cost_usd"] == pytest.approx(1000 * 1.0 / 1e6 + 500 * 2.0 / 1e6)
    assert e1["proposal_latency_s"] >= 1.0                  # the first backoff is 1 s
    # 2: no code: a failed proposal with its reason, no worker time
    assert (e2["state"], e2["failed_stage"]) == ("failed", "proposal")
    assert "no ```python code block" in e2["error"] and "persistent grid" in e2["error"]
    # 3: the wrong kernel reached the worker and was rejected at the stability stage
    assert (e3["state"], e3["failed_stage"]) == ("failed", "stability"), e3["error"]
    # 4: the slow reply timed out twice (one retry): a failed proposal, no tokens, no cost
    assert (e4["state"], e4["failed_stage"]) == ("failed", "proposal")
    assert "timed out after 2 attempt(s)" in e4["error"], e4["error"]
    assert e4["tokens_in"] is None and e4["proposal_latency_s"] >= 16.0
    # 5: the wrong signature stopped at the static check
    assert (e5["state"], e5["failed_stage"]) == ("failed", "static")
    assert "kernel_fn must take (x)" in e5["error"]
    for e in (e2, e4, e5):
        assert e["duration_s"] < 1.0                      # no worker time spent
    # the token cap (5 replies x 1500 would pass 6000) ended the run cleanly
    assert run["status"] == "done"
    assert any("LLM token budget reached: 6000 of 6000" in m for m in events), events
    assert any(l.startswith("proposer stopped:") for l in lines)

    # what the server saw: the key as a bearer token, retries, and prompts that learn
    reqs = server.requests
    assert [(r["n"], r["attempt"]) for r in reqs] == [(1, 1), (1, 2), (2, 1), (3, 1), (4, 1),
                                                      (4, 2), (5, 1)]
    auth = {v for r in reqs for k, v in r["headers"].items() if k.lower() == "authorization"}
    assert auth == {f"Bearer {KEY}"}
    first, fourth = reqs[0]["prompt"], reqs[4]["prompt"]
    assert "No verified kernel yet" in first and "torch.softmax(x, dim=-1)" in first
    assert "CPU interpreter: timings are not GPU performance" in first
    assert "atol=1e-07 rtol=1e-05" in first and "stability" in first
    assert "Experiment #1 (llm)" in fourth and FAST.strip() in fourth      # the best, with
    assert "| shape | calls | us | % of speed of light |" in fourth         # its per-shape times
    assert "#3 [llm] failed at stability" in fourth                       # the failure and
    assert "#2 [llm] failed at proposal" in fourth                        # its error excerpt
    assert "error: " + " ".join(e3["error"].split())[:60] in fourth

    # the key is nowhere: database files, log lines, events, report, stored config, worker env
    for f in tmp_path.iterdir():
        assert KEY.encode() not in f.read_bytes(), f
        assert b"DO-NOT-LEAK" not in f.read_bytes(), f
    for text in lines + events + [report, str(run["config"])]:
        assert KEY not in text and "DO-NOT-LEAK" not in text
    env = clean_env({"TRITON_INTERPRET": "1"})
    assert "OPENAI_API_KEY" not in env and KEY not in env.values()
    w = Worker(interpret=True)       # and a real worker process sees no such variable
    try:
        assert "OPENAI_API_KEY" not in w.start()["env_names"]
    finally:
        w.close()
    assert "Model: 5 proposals, 4000 tokens in, 2000 tokens out, $0.0080." in report, report
    assert "llm_model=openai/scripted-coder" in report
    assert took < 150, took


def _ctx():
    return ProposalContext(run={"timing_mode": "interpreter", "device": {"name": "cpu"}})


def test_requests_in_flight_overlap_and_come_back_in_request_order(tmp_path):
    def script(n, attempt):   # later requests answer sooner: arrival order != request order
        src = FAST.replace("def kernel_fn(x):", f"# variant {n}\ndef kernel_fn(x):")
        return Step(text=reply(src, f"variant {n}"), delay_s=1.5 - 0.2 * (n % 4))

    with ScriptedServer(script) as server:
        p = llm.LLMProposer(llm.LLMSettings(model="openai/scripted", api_base=server.api_base,
                                            max_in_flight=3, timeout_s=30), api_key=KEY)
        llm._litellm()       # import first (seconds): time the requests, not the import
        t0 = time.monotonic()
        got, history = [], []
        for i in range(5):
            prop = p.propose(FAM, history, None, _ctx())
            got.append(prop.hypothesis)
            history.append({"seq": i + 1, "source_hash": "x%d" % i, "proposer": "llm",
                            "state": "failed", "failed_stage": "smoke", "hypothesis": prop.hypothesis,
                            "error": "scripted", "latency_us": None})
        took = time.monotonic() - t0
        p.close()
    assert got == [f"variant {n}" for n in range(1, 6)]
    assert server.max_concurrent == 3
    # one at a time would take the sum of the delays (6.1 s); three in flight about half of it.
    # The overlap itself is max_concurrent; the wall time only has to show it on a loaded machine
    serial = sum(1.5 - 0.2 * (n % 4) for n in range(1, 6))
    assert took < 0.9 * serial, (took, serial)
    # the request sent after the 3rd proposal knew the first three outcomes
    r = next(r for r in server.requests if r["n"] == 6)
    assert "#3 [llm] failed at smoke" in r["prompt"]
    assert {v for r in server.requests for k, v in r["headers"].items()
            if k.lower() == "authorization"} == {f"Bearer {KEY}"}
    assert p.stats["replies"] >= 5 and p.spent()[0] >= 5 * 1500


def test_stop_while_waiting_on_a_slow_model_is_prompt():
    import threading
    with ScriptedServer(lambda n, a: Step(text="late", delay_s=5)) as server:
        p = llm.LLMProposer(llm.LLMSettings(model="openai/scripted", api_base=server.api_base),
                            api_key=KEY)
        stop = threading.Event()
        threading.Timer(1.0, stop.set).start()
        t0 = time.monotonic()
        with pytest.raises(proposers.ProposerStopped, match="stopped while waiting"):
            p.propose(FAM, [], None, ProposalContext(stop=stop))
        p.close()
    assert time.monotonic() - t0 < 2.5


def test_hybrid_tunes_the_constants_the_model_exposes():
    # the model's structure: the starter, declaring two of its constants tunable
    structure = FAM.starter() + '\nTUNABLE = {"ROWS_PER_PROG": [1, 2, 4, 8], "NUM_WARPS": [2, 4, 8]}\n'
    space, current = llm.tunables(structure)
    assert space == {"ROWS_PER_PROG": [1, 2, 4, 8], "NUM_WARPS": [2, 4, 8]}
    assert current == {"ROWS_PER_PROG": 1, "NUM_WARPS": 4}
    best = {"id": 7, "seq": 1, "source": structure, "proposer": "llm", "latency_us": 10.0,
            "hypothesis": "structure", "shape_times": []}
    history = [{"seq": 1, "source_hash": "a", "proposer": "llm", "state": "kept",
                "failed_stage": None, "hypothesis": "structure", "error": None, "latency_us": 10.0}]
    with ScriptedServer(lambda n, a: Step(text="no code")) as server:
        p = llm.LLMProposer(llm.LLMSettings(model="openai/scripted", api_base=server.api_base),
                            seed=3, hybrid=True)
        prop = p.propose(FAM, history, best, _ctx())
        # three tuned variants in a row without a keep: back to the model
        tuned = [dict(history[0], seq=i, proposer="llm-tune", state="reverted", source_hash=f"t{i}")
                 for i in (2, 3, 4)]
        back = p.propose(FAM, history + tuned, best, _ctx())
        p.close()
    assert prop.proposer == "llm-tune" and prop.parent_id == 7 and prop.error is None
    point = dict(FAM.default, rows_per_prog=prop.params["ROWS_PER_PROG"],
                 num_warps=prop.params["NUM_WARPS"])
    assert prop.params != current
    # re-rendering only touched the constants: it is the family's own render of that point
    # (but for the docstring's "Point:" line, which names the starter's point)
    def body(src):
        return [l for l in src.splitlines() if not l.startswith("Point:")]
    assert body(prop.source) == body(FAM.render(point) + structure[len(FAM.starter()):])
    from engine import verify
    assert verify.static_check(prop.source, FAM.arg_names) is None
    assert back.proposer == "llm" and "no ```python code block" in back.error
    assert "TUNABLE" in server.requests[0]["prompt"]       # the hybrid prompt asks for them


def test_parse_reply():
    code, hyp = llm.parse_reply("**Hypothesis:** fewer programs\n```python\ndef kernel_fn(x):\n"
                                "    pass\n```\n")
    assert code == "def kernel_fn(x):\n    pass\n" and hyp == "fewer programs"
    code, hyp = llm.parse_reply("```\nprint(1)\n```\n```python\ndef kernel_fn(x): ...\n```\nok")
    assert code.startswith("def kernel_fn") and hyp == "ok"
    assert llm.parse_reply("no code at all") == (None, "no code at all")
    assert llm.parse_reply("")[0] is None


def test_check_reachable(monkeypatch):
    def script(n, attempt):
        return Step(text="OK")
    with ScriptedServer(script) as server:
        ok, msg = llm.check_reachable("openai/scripted", server.api_base, api_key=KEY)
        assert ok, msg
        assert {k.lower(): v for k, v in server.requests[-1]["headers"].items()}[
            "authorization"] == f"Bearer {KEY}"
        base = server.api_base
    ok, msg = llm.check_reachable("openai/scripted", base, api_key=KEY, timeout_s=2)
    assert not ok and "cannot reach http://127.0.0.1" in msg, msg
    with ScriptedServer(lambda n, a: Step(status=401)) as server:
        ok, msg = llm.check_reachable("openai/scripted", server.api_base, api_key=KEY)
        assert not ok and "rejected" in msg and KEY not in msg, msg
    with ScriptedServer(lambda n, a: Step(status=429)) as server:
        ok, msg = llm.check_reachable("openai/scripted", server.api_base, api_key=KEY)
        assert ok and "rate-limited" in msg, msg
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    ok, msg = llm.check_reachable("openai/gpt-4o", None)      # hosted, no key: no request sent
    assert not ok and "OPENAI_API_KEY" in msg, msg
    ok, msg = llm.check_reachable("gpt4o", None)
    assert not ok and "provider/name" in msg


@pytest.mark.parametrize("kw, words", [
    (dict(), "--llm-model"),
    (dict(llm_model="gpt-4o"), "provider/name"),
    (dict(llm_model="openai/x", api_base="localhost:8000"), "http(s) URL"),
    (dict(llm_model="openai/x", max_in_flight=0), "--in-flight"),
    (dict(llm_model="openai/x", max_cost_usd=0), "--max-cost"),
    (dict(llm_model="openai/x", llm_retries=-1), "--llm-retries"),
])
def test_config_validation(kw, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        RunConfig(proposer="llm", **kw).validate()
    RunConfig(proposer="hybrid", llm_model="ollama_chat/qwen2.5-coder").validate()
    assert "api_key" not in {f for f in RunConfig.__dataclass_fields__}


def test_cli_llm_flags_one_clear_message(tmp_path):
    r = subprocess.run([sys.executable, "-m", "engine", "run", "--proposer", "llm",
                        "--db", str(tmp_path / "x.db")], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--llm-model" in r.stderr


NO_NET = """
import os, socket
def _blocked(*a, **k):
    raise OSError("network blocked in this test")
_connect = socket.socket.connect
def _connect_loopback_only(self, addr):
    if isinstance(addr, tuple) and addr[0] not in ("127.0.0.1", "::1", "localhost"):
        raise OSError(f"network blocked in this test: {addr}")
    return _connect(self, addr)
socket.socket.connect = _connect_loopback_only
socket.getaddrinfo = _blocked
socket.create_connection = _blocked
os.environ.pop("LITELLM_LOCAL_MODEL_COST_MAP", None)   # engine.llm must set it itself
"""


def test_importing_litellm_never_reaches_the_network():
    code = NO_NET + ("from engine import llm\nlitellm = llm._litellm()\n"
                     "print(litellm.cost_per_token(model='gpt-4o', prompt_tokens=1000000, "
                     "completion_tokens=0)[0] > 0)\n")
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("True")
    assert "network blocked" not in r.stderr and "fetch attempt" not in r.stderr, r.stderr[-2000:]


def test_llm_proposer_without_litellm_installed():
    code = ("import sys\nclass Block:\n    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'litellm':\n"
            "            raise ImportError('blocked for this test')\n"
            "sys.meta_path.insert(0, Block())\n"
            "from engine import proposers, llm, llmbench\nfrom engine.loop import RunConfig\n"
            "cfg = RunConfig(proposer='llm', llm_model='openai/x', api_base='http://127.0.0.1:9/v1')\n"
            "cfg.validate()\np = proposers.make('llm', cfg=cfg)\n"
            "print(llm.check_reachable('openai/x', 'http://127.0.0.1:9/v1'))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "litellm is not installed" in r.stdout


def test_a_region_targets_prompt_holds_its_pytorch_code_and_our_starter():
    # The LLM proposer's contract for a generated region is the PyTorch the region replays (one
    # aten call a line, as the model's graph has it), and the current best is our starter.
    import torch
    import torch.nn.functional as F
    from engine import capture, match, regions
    from engine.llm import build_messages

    class Chain(torch.nn.Module):
        def forward(self, x, b):
            return F.leaky_relu(x * 2.0 + b, 0.1).clamp(max=3.0)
    cap = capture.capture(Chain().eval(), (torch.randn(4, 8), torch.randn(8)))
    g = cap.graphs[0]
    (r,) = regions.find(g, match.find(g)).regions
    fam = kernels.get("region", r.spec)
    text = "\n".join(m["content"] for m in build_messages(fam, [], None, _ctx()))
    for line in ("def reference(in0, in1):", "torch.ops.aten.mul.Tensor(in0, 2.0)",
                 "torch.ops.aten.leaky_relu.default(v1, 0.1)", "torch.ops.aten.clamp.default(v2, None, 3.0)"):
        assert line in text, line
    assert fam.starter().strip() in text
    assert "_replay" not in text                  # not the generic replayer
