"""The LLM proposer: a model, reached through litellm, writes each candidate kernel.

``LLMProposer`` turns a target's history into a prompt (the family's contract and the verifier's
rules, the current best kernel with its per-shape times and distance to the speed of light, the
machine, the recent experiments with the stage and error of every failure, and a tiered
optimization playbook) and turns the reply's one ```python block into a ``Proposal``. It only
proposes: the loop checks, runs and records, as for the search.

Model strings are litellm's: ``openai/gpt-4o``, ``anthropic/claude-...``, ``gemini/...`` (keys
from litellm's standard environment variables, e.g. OPENAI_API_KEY, or an ``api_key`` argument
the dashboard takes from its secrets), ``ollama_chat/NAME``, ``hosted_vllm/NAME`` or
``openai/NAME`` with an ``api_base`` for a local OpenAI-compatible server. The key is never part
of RunConfig, so never in the runs table, the events, the log or a report; error text is
redacted before it is recorded; the worker's environment is built from an allow-list.

What can go wrong with a model, and what it costs:
- a reply with no code, code without ``kernel_fn`` of the family's signature, or code the static
  check rejects: one failed experiment (stage "proposal" or "static"), no worker time;
- a timeout, a 429, a 5xx or a dropped connection: retried with exponential backoff (bounded by
  ``retries``); still failing, a failed proposal with the reason;
- a rejected key or an unknown model: ``ProposerStopped``; the loop ends the run cleanly with an
  event (every further request would fail the same way);
- the run's token or cost cap (``max_tokens_total``, ``max_cost_usd``): no new request is sent
  once spent reaches the cap; replies already requested are still used; then ``ProposerStopped``.
  A run may overshoot a cap by the replies in flight when it was reached.
Cost is zero for local models (an ``api_base``, or ollama / hosted_vllm / lm_studio / llamafile)
unless the user sets a price per million tokens, which also overrides litellm's price table.

Throughput: up to ``max_in_flight`` requests are outstanding, each in a thread. With 1 the loop
waits for each reply and every prompt knows every outcome so far. With N > 1 the proposer tops
them up to N whenever the loop asks (each new request carries the history known then) and
hands over the oldest reply, so N - 1 requests run while the worker evaluates; the price is that
a reply may not know the last N - 1 outcomes, and parallel requests are steered to different
playbook tiers so they do not all write the same kernel. Replies are consumed in the order they
were requested, whatever order they arrive in. A reply whose code was already tried is recorded
as a failed proposal ("duplicate"), at no worker cost.

Hybrid (``hybrid=True``, proposer "hybrid"): the model is asked to expose its tunables as
module-level constants plus a ``TUNABLE = {"NAME": [values...]}`` dict. While the best kernel
declares TUNABLE, the proposer's search mutates one or two of those constants (seeded, never
repeating a source) and re-renders the source, until ``TUNE_PATIENCE`` tuned variants in a row
bring no improvement; then it asks the model for a new structure.

litellm is imported lazily, only here, and always with LITELLM_LOCAL_MODEL_COST_MAP=True so that
importing it never fetches the price table from the network.
"""
from __future__ import annotations

import ast
import inspect
import os
import random
import re
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

from engine import allowlist, verify
from engine.proposers import Proposal, ProposalContext, ProposerStopped

LOCAL_PROVIDERS = {"ollama", "ollama_chat", "hosted_vllm", "vllm", "lm_studio", "llamafile"}
RECENT = 8               # experiments shown in the prompt
ERROR_EXCERPT = 400      # characters of each failure's error shown in the prompt
TUNE_PATIENCE = 3        # hybrid: tuned variants in a row without a keep before asking the model
BACKOFF_CAP_S = 30.0
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.I)


def _litellm():
    """litellm, imported on first use with its price table read from the installed package."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm
    litellm.suppress_debug_info = True    # no "Give Feedback / Get Help" banners on stdout
    return litellm


def provider_of(model: str) -> str:
    return model.split("/", 1)[0] if "/" in model else ""


def is_local(model: str, api_base: str | None) -> bool:
    """A self-hosted server: free unless the user sets a price."""
    return bool(api_base) or provider_of(model) in LOCAL_PROVIDERS


# ---------------------------------------------------------------------------------------------
# prompt
# ---------------------------------------------------------------------------------------------
PLAYBOOK = {
    "tiling and launch configuration": [
        "BLOCK sizes are powers of two matched to the row length; whole rows in registers when "
        "they fit (up to ~64K elements per program), chunked loops beyond",
        "several rows per program for short rows, so each program moves enough bytes",
        "num_warps scaled with the tile (1-2 for tiles under 1K elements, 4 up to 8K, 8-16 above)",
        "a grid that fills every SM several times over; choose the configuration in Python from "
        "the shape at launch time",
    ],
    "memory access and pipelining": [
        "unit-stride, coalesced loads along the last dim; read each input once where registers "
        "allow (the speed of light counts one read and one write)",
        "software pipelining of chunk loops: tl.range(..., num_stages=2..4)",
        "cache hints: eviction_policy='evict_last' for data read again, 'evict_first' for streams",
        "keep intermediates in registers, never in a global scratch buffer unless the algorithm "
        "needs a second kernel",
    ],
    "fusion and precision": [
        "one pass: fuse the reduction and the elementwise work (online softmax / log-sum-exp, "
        "Welford) instead of separate passes",
        "load in the input dtype, compute in fp32, store in the output dtype",
        "exp2(x * log2(e)) and rsqrt are cheaper than exp and 1/sqrt; scale after subtracting the "
        "max so no precision is lost",
        "no host-side work: every PyTorch compute op outside your kernels rejects the candidate",
    ],
    "advanced": [
        "persistent kernels: grid = number of SMs x k, each program loops over tiles",
        "split reductions (split-K / split-D) for few, very long rows: partial results to an fp32 "
        "workspace, then a second kernel merges them in a fixed order (no atomics: results must "
        "be bitwise deterministic)",
        "tensor descriptors / TMA (tl.make_tensor_descriptor) on Hopper-class GPUs, only when the "
        "shape and Triton version allow it",
    ],
}
FAMILY_TRICKS = {
    "softmax": [
        "online softmax: running max m and sum s rescaled by exp(m_old - m_new) reads x twice "
        "instead of three times",
        "masked lanes load -inf; a row that is all -inf gives NaN like torch; never compute "
        "exp(-inf - (-inf))",
    ],
    "rmsnorm": [
        "sum of squares in fp32, rsqrt(mean + eps), multiply by weight; load weight once per "
        "program and reuse it across the program's rows",
        "match the reference's output dtype and where it rounds (see the reference source)",
    ],
    "layernorm": [
        "mean then variance of the centered values (or Welford), never E[x^2] - E[x]^2",
        "load weight and bias once per program and reuse them across rows",
    ],
    "cross_entropy": [
        "online log-sum-exp over vocab chunks; the target logit is one scalar load per row",
        "loss = (m - x_target) + log(s); rows with target -100 are neither summed nor counted",
        "split the vocabulary across programs when rows are few and the vocabulary large, then "
        "merge partials and take the mean in a fixed order (deterministic, no atomics)",
    ],
}
TIERS = list(PLAYBOOK) + ["family-specific tricks"]

SYSTEM = ("You are an expert GPU kernel engineer. You write Triton kernels that are correct "
          "first and fast second. You reply with one complete Python module in one ```python "
          "code block and one line starting with 'Hypothesis:'.")


def _shape(s) -> str:
    return "x".join(str(int(d)) for d in s)


def _contract(family) -> list[str]:
    # a generated family (a region) shows the PyTorch it replays, not the generic replayer
    ref = family.notes.get("reference_source") or inspect.getsource(family.reference).rstrip()
    notes = (inspect.getmodule(family.reference).__doc__ or "").strip()
    tol = "; ".join(f"{str(dt).replace('torch.', '')} atol={a:g} rtol={r:g}"
                    for dt, (a, r) in family.tolerance.items())
    host_ops = sorted(verify.ALLOWED_ATEN | set(family.allowed_host_ops))
    return [
        f"# Task: a faster `{family.name}` kernel",
        "",
        f"{family.description}",
        "",
        "## Contract",
        f"- Define `{family.signature}` at module level; it is called with keyword arguments "
        f"{', '.join(family.arg_names)}. Inputs may have any number of leading dims and may be "
        "non-contiguous (row-strided, column-major); the output's shape and dtype must equal the "
        "reference's.",
        f"- dtypes: {', '.join(family.dtypes)}. Tolerance, elementwise |out - expected| <= atol + "
        f"rtol * |expected| against the reference computed in float64: {tol}.",
        "- The reference (eager PyTorch; the ground truth):",
        "```python", ref, "```",
        "- Family notes (how the built-in variants work):",
        "", notes, "",
        "## Rules: the verifier rejects a candidate that breaks any of them",
        "- The source passes an allow list (anything not named here is rejected): "
        + allowlist.rules_text(),
        "- Every value must be computed by your own @triton.jit kernel(s). Outside kernel "
        f"launches, PyTorch may only allocate, view, reshape and copy ({', '.join(host_ops)}); "
        "any other PyTorch op rejects the candidate.",
        "- Memory from torch.empty* is filled with NaN before your kernel runs: write every output "
        "element. Inputs must come back unchanged; the output must not alias an input.",
        "- Bitwise deterministic on repeat (no float atomics). Self-contained: no files, no "
        "caches keyed on shapes or data pointers, no printing, no globals mutated between calls.",
        f"- Stages, in order: static check, smoke, shape_sweep (the model's shapes plus "
        f"{', '.join(_shape(s) for s in family.sweep_shapes)}; every dtype), stability (inputs: "
        f"{', '.join(family.adversarial)}; NaN and Inf exactly where the reference has them), "
        f"determinism, edge_cases ({', '.join(_shape(s) for s in family.edge_shapes)}; strided "
        "and column-major inputs); then the benchmark, then a re-check.",
    ]


def _playbook(family, focus: str | None) -> list[str]:
    out = ["", "## Optimization playbook (tiers, simplest first)"]
    tiers = dict(PLAYBOOK)
    tiers["family-specific tricks"] = FAMILY_TRICKS.get(family.name, [])
    for i, (tier, items) in enumerate(tiers.items(), 1):
        out.append(f"{i}. {tier}" + ("  <- focus of this request" if tier == focus else ""))
        out += [f"   - {x}" for x in items]
    return out


def _machine(ctx: ProposalContext) -> list[str]:
    run = ctx.run or {}
    dev, ceil = run.get("device") or {}, run.get("ceilings") or {}
    out = ["", "## Machine"]
    if run.get("timing_mode") == "interpreter":
        out.append(f"- CPU interpreter: timings are not GPU performance. Kernels run under "
                   f"Triton's interpreter (TRITON_INTERPRET=1) on {dev.get('name', 'a CPU')}; they "
                   "must still be correct GPU kernels. Interpreter times grow with the number of "
                   "programs and Triton ops executed, not with memory traffic.")
    else:
        line = f"- GPU: {dev.get('name', 'unknown')}"
        if dev.get("capability"):
            line += f" (capability {dev['capability']})"
        if ceil:
            line += (f"; measured ceilings: copy {ceil.get('copy_gbps', 0):.0f} GB/s (read + write), "
                     f"bf16 matmul {ceil.get('matmul_tflops', 0):.0f} TFLOP/s")
        out.append(line)
    if dev.get("torch") or dev.get("triton"):
        out.append(f"- torch {dev.get('torch')}, triton {dev.get('triton')}")
    return out


def _target(ctx: ProposalContext) -> list[str]:
    t = ctx.target or {}
    if not t:
        return []
    ref = {tuple(r["shape"]): r["us"] for r in (t.get("ref_shape_times") or [])}
    out = ["", "## Target in this model",
           f"- dtype {t.get('dtype')}; {t.get('fraction', 0):.1%} of the model's time"]
    for s in t.get("shapes") or []:
        us = ref.get(tuple(s["shape"]))
        out.append(f"- shape {_shape(s['shape'])}, {s['count']} call(s) per forward"
                   + (f", eager {us:.1f} us" if us else ""))
    if t.get("ref_latency_us"):
        out.append(f"- eager total {t['ref_latency_us']:.1f} us" +
                   (f"; speed of light {t['sol_latency_us']:.1f} us" if t.get("sol_latency_us") else ""))
    return out


def _best(family, best: dict | None) -> list[str]:
    if not best:
        return ["", "## Current best",
                "No verified kernel yet. The family's starter kernel (correct; a baseline) is:",
                "```python", family.starter().rstrip(), "```"]
    out = ["", "## Current best",
           f"Experiment #{best['seq']} ({best['proposer']}): {best['latency_us']:.1f} us"
           + (f", {best['speedup']:.3g}x eager" if best.get("speedup") else "")
           + (f", {best['pct_sol']:.0f}% of the speed of light" if best.get("pct_sol") else "")
           + f". Hypothesis: {best['hypothesis']}"]
    rows = best.get("shape_times") or []
    if rows:
        out += ["", "| shape | calls | us | % of speed of light |", "|---|---|---|---|"]
        out += [f"| {_shape(r['shape'])} | {r['count']} | {r['us']:.1f} | "
                f"{(str(round(r['pct_sol'], 1)) + '%') if r.get('pct_sol') else 'n/a'} |"
                for r in rows]
    out += ["", "```python", best["source"].rstrip(), "```"]
    return out


def _recent(history: list[dict]) -> list[str]:
    if not history:
        return []
    out = ["", f"## Recent experiments on this target (last {min(RECENT, len(history))}, oldest first)"]
    for h in history[-RECENT:]:
        what = h["state"] + (f" at {h['failed_stage']}" if h.get("failed_stage") else "")
        line = f"- #{h['seq']} [{h['proposer']}] {what}"
        if h.get("latency_us"):
            line += f", {h['latency_us']:.1f} us"
        line += f": {h['hypothesis'][:200]}"
        if h["state"] != "kept" and h.get("error"):
            err = " ".join(str(h["error"]).split())
            line += f"\n  error: {err[:ERROR_EXCERPT]}"
        out.append(line)
    return out


def build_messages(family, history: list[dict], best: dict | None, ctx: ProposalContext,
                   request_no: int = 1, focus: str | None = None, hybrid: bool = False) -> list[dict]:
    """The chat messages for one request. Stable text first (contract, rules, playbook), the
    run's state after it, so a provider's prompt cache can reuse the prefix."""
    lines = _contract(family) + _playbook(family, focus) + _machine(ctx) + _target(ctx) \
        + _best(family, best) + _recent(history)
    lines += ["", "## Your answer",
              "Write one complete, self-contained candidate module that should beat the current "
              "best (or, with no best yet, pass every stage and be fast). Learn from the failures "
              "above: do not repeat what failed.",
              f"Reply with exactly one ```python code block holding the whole module (imports, "
              f"kernels, `{family.signature}`), then one line: `Hypothesis: <why it is faster>`."]
    if focus:
        lines.append(f"Other requests are exploring other tiers; try an idea from tier "
                     f"'{focus}' in this one.")
    if hybrid:
        lines.append("Expose your tunable launch parameters as module-level constants with "
                     "literal values (e.g. `BLOCK_D = 2048`, `NUM_WARPS = 4`) and one dict "
                     "`TUNABLE = {\"BLOCK_D\": [1024, 2048, 4096], \"NUM_WARPS\": [2, 4, 8]}` "
                     "listing the values a search may set them to. Every combination must be "
                     "correct.")
    lines.append(f"(Nightshift request #{request_no} for target {family.name}.)")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


# ---------------------------------------------------------------------------------------------
# reply parsing
# ---------------------------------------------------------------------------------------------
_BLOCK = re.compile(r"```[ \t]*(python|py|python3)?[ \t]*\n(.*?)```", re.S | re.I)
_HYP = re.compile(r"^[\s>*_#-]*hypothesis[\s*_]*:[\s*_]*(.+)$", re.I | re.M)


def parse_reply(text: str) -> tuple[str | None, str]:
    """(the candidate source, or None when there is no code block; the hypothesis line)."""
    text = text or ""
    blocks = [(lang, body) for lang, body in _BLOCK.findall(text)]
    with_fn = [b for _, b in blocks if re.search(r"^def kernel_fn\s*\(", b, re.M)]
    py = [b for lang, b in blocks if lang]
    code = (with_fn or py or [b for _, b in blocks] or [None])[0]
    outside = _BLOCK.sub("", text)
    m = _HYP.search(outside)
    if m:
        hyp = m.group(1).strip().strip("*_` ")
    else:
        first = next((l.strip() for l in outside.splitlines() if l.strip()), "")
        hyp = first or "(the model gave no hypothesis)"
    return (code.rstrip() + "\n" if code else None), hyp[:300]


# ---------------------------------------------------------------------------------------------
# hybrid: the model's TUNABLE constants, tuned by a search
# ---------------------------------------------------------------------------------------------
def tunables(source: str) -> tuple[dict, dict] | None:
    """({name: allowed values}, {name: current value}) from a module's ``TUNABLE`` dict and its
    module-level literal constants; None when the source declares nothing usable."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    declared, current = None, {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, SyntaxError, TypeError):
                continue
            if node.targets[0].id == "TUNABLE":
                declared = value
            elif isinstance(value, (bool, int, float, str)):
                current[node.targets[0].id] = value
    if not isinstance(declared, dict):
        return None
    space = {k: list(v) for k, v in declared.items()
             if k in current and isinstance(v, (list, tuple)) and
             all(isinstance(x, (bool, int, float, str)) for x in v) and len(set(map(repr, v)) | {repr(current[k])}) > 1}
    return (space, {k: current[k] for k in space}) if space else None


def set_constants(source: str, values: dict) -> str:
    """``source`` with the module-level assignments ``NAME = <literal>`` set to ``values``; only
    the literal is replaced, so comments and layout stay."""
    tree = ast.parse(source)
    raw = source.encode()
    starts = [0]
    for line in raw.split(b"\n"):
        starts.append(starts[-1] + len(line) + 1)
    edits = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and node.targets[0].id in values:
            v = node.value   # ast offsets are utf-8 byte offsets
            edits.append((starts[v.lineno - 1] + v.col_offset,
                          starts[v.end_lineno - 1] + v.end_col_offset,
                          repr(values[node.targets[0].id]).encode()))
    for a, b, text in sorted(edits, reverse=True):
        raw = raw[:a] + text + raw[b:]
    return raw.decode()


# ---------------------------------------------------------------------------------------------
# the proposer
# ---------------------------------------------------------------------------------------------
@dataclass
class Reply:
    request_no: int
    text: str | None = None
    error: str | None = None
    fatal: bool = False                 # the key or the model is wrong: stop the run
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None
    latency_s: float | None = None
    attempts: int = 0
    finish_reason: str | None = None    # "length": cut off at the model's output limit


@dataclass
class LLMSettings:
    """Non-secret settings (they come from RunConfig, which is stored with the run)."""
    model: str
    api_base: str | None = None
    max_in_flight: int = 1
    max_tokens_total: int | None = None
    max_cost_usd: float | None = None
    price_in_per_mtok: float | None = None
    price_out_per_mtok: float | None = None
    timeout_s: float = 180.0
    retries: int = 3
    backoff_s: float = 1.0               # first retry delay; doubles, capped at BACKOFF_CAP_S

    @classmethod
    def from_config(cls, cfg) -> "LLMSettings":
        return cls(model=cfg.llm_model, api_base=cfg.api_base, max_in_flight=cfg.max_in_flight,
                   max_tokens_total=cfg.max_tokens_total, max_cost_usd=cfg.max_cost_usd,
                   price_in_per_mtok=cfg.price_in_per_mtok,
                   price_out_per_mtok=cfg.price_out_per_mtok, timeout_s=cfg.llm_timeout_s,
                   retries=cfg.llm_retries)


class LLMProposer:
    name = "llm"
    takes_context = True   # the loop passes a ProposalContext (run and target rows)

    def __init__(self, settings: LLMSettings, seed: int = 0, api_key: str | None = None,
                 hybrid: bool = False):
        self.s = settings
        self.seed = seed
        self.hybrid = hybrid
        self.name = "hybrid" if hybrid else "llm"
        self._api_key = api_key            # never stored, logged or passed to the worker
        self._pending: dict[str, deque[Future]] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._requests = 0
        self._baseline: tuple[int, float] | None = None   # spent before this process (resume)
        self.spent_tokens = 0
        self.spent_cost = 0.0
        self.cost_unknown = False
        self.stats = {"requests": 0, "attempts": 0, "replies": 0, "waited_s": 0.0,
                      "first_propose_at": None}

    # -- the loop's interface ----------------------------------------------------------------
    def propose(self, family, history: list[dict], best: dict | None,
                context: ProposalContext | None = None) -> Proposal:
        ctx = context or ProposalContext()
        if self.stats["first_propose_at"] is None:
            self.stats["first_propose_at"] = time.time()
        if self._baseline is None:
            self._baseline = (sum((e.get("tokens_in") or 0) + (e.get("tokens_out") or 0)
                                  for e in ctx.experiments),
                              sum(e.get("cost_usd") or 0.0 for e in ctx.experiments))
        queue = self._pending.setdefault(family.name, deque())
        while self._outstanding() < self.s.max_in_flight and self.budget_left() is None:
            queue.append(self._submit(family, history, best, ctx))
        if not queue and self.budget_left() is None:   # other targets' replies fill the pool
            queue.append(self._submit(family, history, best, ctx))
        if self.hybrid:
            tuned = self._tune(family, history, best)
            if tuned is not None:
                return tuned
        if not queue:
            raise ProposerStopped(self.budget_left())
        t0 = time.monotonic()
        while True:   # wait for the oldest request, but let a Stop through within 0.2 s
            try:
                reply = queue[0].result(timeout=0.2)
                break
            except TimeoutError:
                if ctx.stop is not None and ctx.stop.is_set():
                    raise ProposerStopped("stopped while waiting for the model") from None
        queue.popleft()
        self.stats["waited_s"] += time.monotonic() - t0
        if reply.fatal:
            raise ProposerStopped(f"{self.s.model}: {reply.error}")
        return self._proposal(family, reply, history, best)

    def close(self) -> None:
        """No more retries; requests on the wire end in their daemon threads, unread."""
        self._closing.set()

    # -- budget --------------------------------------------------------------------------------
    def spent(self) -> tuple[int, float]:
        base = self._baseline or (0, 0.0)
        with self._lock:
            return base[0] + self.spent_tokens, base[1] + self.spent_cost

    def budget_left(self) -> str | None:
        """None while a new request may be sent, else why not."""
        tokens, cost = self.spent()
        if self.s.max_tokens_total is not None and tokens >= self.s.max_tokens_total:
            return f"LLM token budget reached: {tokens} of {self.s.max_tokens_total} tokens spent"
        if self.s.max_cost_usd is not None:
            if self.cost_unknown:
                return (f"the cost of {self.s.model} is not in litellm's price table, so "
                        f"max_cost_usd cannot be enforced: set price_in_per_mtok and "
                        f"price_out_per_mtok")
            if cost >= self.s.max_cost_usd:
                return f"LLM cost budget reached: ${cost:.4f} of ${self.s.max_cost_usd:.4f} spent"
        return None

    # -- requests ------------------------------------------------------------------------------
    def _outstanding(self) -> int:
        return sum(len(q) for q in self._pending.values())

    def _submit(self, family, history, best, ctx) -> Future:
        self._requests += 1
        n = self._requests
        # parallel requests are steered to different playbook tiers; a lone one sees them all
        focus = TIERS[(n - 1) % len(TIERS)] if self.s.max_in_flight > 1 else None
        messages = build_messages(family, history, best, ctx, n, focus, self.hybrid)
        fut: Future = Future()

        def run():
            try:
                fut.set_result(self._call(n, messages))
            except BaseException as e:   # a bug here must surface in the loop, not vanish
                fut.set_exception(e)
        # one daemon thread per request (at most max_in_flight run at once, as requests are only
        # sent to top the queue up to that): a slow model never holds up the process's exit
        threading.Thread(target=run, name=f"nightshift-llm-{n}", daemon=True).start()
        return fut

    def _kwargs(self) -> dict:
        kw = {"model": self.s.model, "timeout": self.s.timeout_s, "max_retries": 0,
              "num_retries": 0, "drop_params": True}    # retries are ours: counted and bounded
        if self.s.api_base:
            kw["api_base"] = self.s.api_base
        key = self._api_key
        if key is None and self.s.api_base and provider_of(self.s.model) == "openai" and \
                not os.environ.get("OPENAI_API_KEY"):
            key = "no-key"   # local OpenAI-compatible servers ignore it; the client wants one
        if key is not None:
            kw["api_key"] = key
        return kw

    def _call(self, n: int, messages: list[dict]) -> Reply:
        """One request with bounded retries (runs in the pool)."""
        t0 = time.monotonic()
        reply = Reply(request_no=n)
        with self._lock:
            self.stats["requests"] += 1
        try:
            litellm = _litellm()
        except ImportError as e:
            reply.error, reply.fatal = f"litellm is not installed ({e}): pip install litellm", True
            return reply
        while True:
            reply.attempts += 1
            with self._lock:
                self.stats["attempts"] += 1
            try:
                resp = litellm.completion(messages=messages, **self._kwargs())
                break
            except Exception as e:
                kind, what = _classify(litellm, e)
                if kind == "retry" and reply.attempts <= self.s.retries and not self._closing.is_set():
                    delay = min(self.s.backoff_s * 2 ** (reply.attempts - 1), BACKOFF_CAP_S)
                    self._closing.wait(delay)
                    continue
                reply.error = self.redact(f"{what} after {reply.attempts} attempt(s): "
                                          f"{type(e).__name__}: {e}")[:1500]
                reply.fatal = kind == "fatal"
                reply.latency_s = time.monotonic() - t0
                return reply
        reply.latency_s = time.monotonic() - t0
        try:
            reply.text = resp.choices[0].message.content or ""
            reply.finish_reason = resp.choices[0].finish_reason
        except (AttributeError, IndexError):
            reply.text = ""
        usage = getattr(resp, "usage", None)
        reply.tokens_in = getattr(usage, "prompt_tokens", None)
        reply.tokens_out = getattr(usage, "completion_tokens", None)
        reply.cost_usd = self._cost(litellm, resp, reply.tokens_in, reply.tokens_out)
        with self._lock:
            self.stats["replies"] += 1
            self.spent_tokens += (reply.tokens_in or 0) + (reply.tokens_out or 0)
            self.spent_cost += reply.cost_usd or 0.0
            self.cost_unknown = self.cost_unknown or reply.cost_usd is None
        return reply

    def _cost(self, litellm, resp, tokens_in, tokens_out) -> float | None:
        s = self.s
        if s.price_in_per_mtok is not None or s.price_out_per_mtok is not None:
            return ((tokens_in or 0) * (s.price_in_per_mtok or 0.0)
                    + (tokens_out or 0) * (s.price_out_per_mtok or 0.0)) / 1e6
        if is_local(s.model, s.api_base):
            return 0.0
        try:
            return float(litellm.completion_cost(completion_response=resp))
        except Exception:
            return None   # not in the price table

    def redact(self, text: str) -> str:
        """Error text with the key (and any secret-looking environment value) masked."""
        secrets = [self._api_key] + [v for k, v in os.environ.items() if _SECRET_NAME.search(k)]
        for s in secrets:
            if s and len(s) >= 6:
                text = text.replace(s, "***")
        return text

    # -- replies to proposals ------------------------------------------------------------------
    def _proposal(self, family, reply: Reply, history, best) -> Proposal:
        meta = dict(proposer="llm", parent_id=best["id"] if best else None,
                    tokens_in=reply.tokens_in, tokens_out=reply.tokens_out,
                    cost_usd=reply.cost_usd, latency_s=reply.latency_s)
        tag = f"model reply #{reply.request_no}"
        if reply.error:
            return Proposal("", f"{tag}: request failed", error=reply.error, **meta)
        code, hyp = parse_reply(reply.text)
        if code is None:
            excerpt = " ".join((reply.text or "").split())[:300]
            cut = " (cut off at the model's output limit)" if reply.finish_reason == "length" else ""
            return Proposal("", f"{tag}: no code", error=f"the reply has no ```python code block{cut}"
                            + (f"; it began: {excerpt!r}" if excerpt else " (empty reply)"), **meta)
        seen = {h["source_hash"]: h["seq"] for h in history}
        if verify.source_hash(code) in seen:
            return Proposal(code, hyp, error=f"duplicate: the reply repeats experiment "
                            f"#{seen[verify.source_hash(code)]}, already evaluated", **meta)
        # code the static check rejects (wrong signature, forbidden call...) is returned as is:
        # the loop records it as failed at stage "static", at no worker cost
        return Proposal(code, hyp, **meta)

    def _tune(self, family, history, best) -> Proposal | None:
        """Hybrid: a variant of the best kernel with one or two TUNABLE constants changed."""
        if not best or not best.get("source"):
            return None
        trailing = 0
        for h in reversed(history):
            if h["proposer"] != "llm-tune" or h["state"] == "kept":
                break
            trailing += 1
        if trailing >= TUNE_PATIENCE:
            return None
        found = tunables(best["source"])
        if not found:
            return None
        space, base = found
        tried = {h["source_hash"] for h in history}
        rng = random.Random(f"{self.seed}:{family.name}:{len(history)}")
        keys = sorted(space)
        for _ in range(100):
            point = dict(base)
            changed = []
            for k in rng.sample(keys, min(len(keys), 1 if rng.random() < 0.7 else 2)):
                choices = [v for v in space[k] if v != base[k]]
                if choices:
                    point[k] = rng.choice(choices)
                    changed.append(f"{k} {base[k]!r}->{point[k]!r}")
            if not changed:
                continue
            src = set_constants(best["source"], point)
            if verify.source_hash(src) not in tried:
                return Proposal(src, f"tune {', '.join(changed)} of #{best['seq']} "
                                f"(search over the model's TUNABLE)", params=point,
                                parent_id=best["id"], proposer="llm-tune")
        return None


def _classify(litellm, e: Exception) -> tuple[str, str]:
    """("retry" | "fatal" | "fail", a short description) for an exception from litellm."""
    def isa(*names):
        return any(isinstance(e, c) for c in (getattr(litellm, n, None) for n in names)
                   if isinstance(c, type))
    if isa("Timeout"):
        return "retry", "timed out"
    if isa("RateLimitError"):
        return "retry", "rate limited (429)"
    if isa("AuthenticationError", "PermissionDeniedError"):
        return "fatal", "the API key was rejected"
    if isa("NotFoundError"):
        return "fatal", "model not found"
    if isa("APIConnectionError", "InternalServerError", "ServiceUnavailableError",
           "BadGatewayError"):
        return "retry", "server unreachable or failing"
    if isa("ContextWindowExceededError", "BadRequestError"):
        return "fail", "request rejected"
    return "fail", "request failed"


def make(cfg, api_key: str | None = None, hybrid: bool = False) -> LLMProposer:
    return LLMProposer(LLMSettings.from_config(cfg), cfg.seed, api_key=api_key, hybrid=hybrid)


# ---------------------------------------------------------------------------------------------
# for the dashboard
# ---------------------------------------------------------------------------------------------
def check_reachable(model: str, api_base: str | None, api_key: str | None = None,
                    timeout_s: float = 10) -> tuple[bool, str]:
    """(ok, message): a one-token request to ``model``, with a clear message when no key is set,
    the key is rejected, the model is unknown or the server does not answer."""
    if not model or "/" not in model:
        return False, ("write the model as provider/name, e.g. openai/gpt-4o, "
                       "anthropic/claude-sonnet-4-5, ollama_chat/qwen2.5-coder")
    try:
        litellm = _litellm()
    except ImportError as e:
        return False, f"litellm is not installed ({e}): pip install litellm"
    p = LLMProposer(LLMSettings(model=model, api_base=api_base, timeout_s=timeout_s, retries=0),
                    api_key=api_key)
    if api_key is None and not is_local(model, api_base):
        try:
            env = litellm.validate_environment(model)
        except Exception:
            env = {"keys_in_environment": True}
        if not env.get("keys_in_environment"):
            missing = ", ".join(env.get("missing_keys") or []) or "the provider's API key"
            return False, (f"no API key for {model}: set {missing} in the environment "
                           f"(or in the dashboard's secrets)")
    t0 = time.monotonic()
    try:
        litellm.completion(messages=[{"role": "user", "content": "Reply with the word OK."}],
                           max_tokens=5, **p._kwargs())
    except Exception as e:
        kind, what = _classify(litellm, e)
        where = api_base or f"the {provider_of(model)} API"
        if what == "rate limited (429)":
            return True, f"{model} is reachable but rate-limited right now (429)"
        if what in ("timed out", "server unreachable or failing"):
            return False, p.redact(f"cannot reach {where}: {what} ({type(e).__name__}: {e})")[:500]
        return False, p.redact(f"{model}: {what} ({type(e).__name__}: {e})")[:500]
    return True, f"{model} answered in {time.monotonic() - t0:.1f} s"


__all__ = ["LLMProposer", "LLMSettings", "build_messages", "parse_reply", "tunables",
           "set_constants", "check_reachable", "make"]
