"""The "New run" page: what to optimize and how, checked before anything starts.

Every input is checked on Start, and each problem is shown with st.error; a run is started only
when there is none, so a typo never leaves a failed run behind. Numbers are typed as text and
read here (parse_number): a negative budget or a word where a number goes is an error, never
silently replaced by the last valid value as a number box does. Start is pressed in two steps:
its callback only asks, and the script run after it draws the page with Start disabled and a
status box, then checks (an LLM request, a Ray cluster's address can take seconds) and starts.
The engine (one per process, app/shared.py) runs the run in its own thread; the page then
switches to Live run.

Optional engine parts are looked up at run time, so this page works with whatever engine the
checkout has: a loader for models defined in files (``engine.models.load_source``), the LLM
proposer (``engine.llm.check_reachable`` and the RunConfig fields ``llm_model``, ``api_base``...)
and evaluation on several workers (the RunConfig fields ``workers`` and ``ray_address``).
Where one is missing its inputs stay visible, with a note, and cannot start a run.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import re
import socket
import tempfile
from pathlib import Path

import streamlit as st

from app import data, fmt
from app.shared import BUSY_STATES, engine_handle, select_run
from engine.verify import VERIFY_ORDERS

DTYPES = ("auto", "float32", "float16", "bfloat16")
BUILTIN, PATH, UPLOAD = "Built-in model", "Python file (path)", "Python file (upload)"
SPEC = "hf: or op: spec"
SOURCES = (BUILTIN, PATH, UPLOAD, SPEC)
SPEC_PREFIXES = ("hf:", "op:")
PROPOSERS = ("search", "llm", "hybrid")
FILE_MODELS_MISSING = "loading models from files is not available yet"
# Where a key for the LLM provider may be: st.secrets or the environment. It is passed to the
# reachability check only; it is never shown, logged or written to the run's config.
KEY_NAMES = ("NIGHTSHIFT_LLM_API_KEY", "LLM_API_KEY")
# Where candidates are evaluated: the CLI's default, --workers N and --ray ADDRESS.
EVAL_ONE, EVAL_LOCAL, EVAL_RAY = "one worker (default)", "local pool", "Ray cluster"
EVAL_CHOICES = (EVAL_ONE, EVAL_LOCAL, EVAL_RAY)
# Without a GPU a local pool runs interpreter workers side by side; more than this on one CPU
# only splits the same cores finer.
MAX_CPU_WORKERS = 8
RAY_DEFAULT = "auto"
# A Ray address with an explicit host and port: HOST:PORT (the cluster's GCS) or ray://HOST:PORT
_RAY_HOST_PORT = re.compile(r"^(?:ray://)?\[?(?P<host>[^\s/\[\]]+?)\]?:(?P<port>\d{1,5})/?$")
RAY_PROBE_S = 3.0
# path/to/file.py:ClassName, or path/to/file.py alone (a KernelBench-style problem file)
_SPEC = re.compile(r"^(?P<path>.+\.py)(?::(?P<name>[A-Za-z_]\w*))?$")


# ---- what this engine offers -------------------------------------------------------------------
def file_loader():
    """engine.models' loader for models defined in a .py file, or None in a checkout without one."""
    try:
        from engine import models
    except Exception:
        return None
    return getattr(models, "load_source", None) or getattr(models, "load_from_file", None)


def llm_support() -> tuple[object | None, str | None]:
    """(engine.llm, None) when the LLM proposer can be configured here, else (None, why)."""
    try:
        from engine import llm
        from engine.loop import RunConfig
    except Exception as e:
        return None, f"the LLM proposer is not in this build yet ({type(e).__name__}: {e})"
    names = {f.name for f in dataclasses.fields(RunConfig)}
    if not hasattr(llm, "check_reachable") or "llm_model" not in names:
        return None, "the LLM proposer is not wired into the run configuration yet"
    return llm, None


def api_key() -> tuple[str | None, str | None]:
    """(key, where it was found) from st.secrets or the environment; (None, None) if nowhere."""
    for name in KEY_NAMES:
        try:
            value = st.secrets.get(name)
        except Exception:  # no secrets.toml at all: st.secrets raises on first access
            value = None
        if value:
            return str(value), f"st.secrets[{name!r}]"
        if os.environ.get(name):
            return os.environ[name], f"${name}"
    return None, None


def scale_out_support() -> str | None:
    """None when RunConfig takes ``workers`` and ``ray_address``, else why not."""
    try:
        from engine.loop import RunConfig
    except Exception as e:
        return f"the engine cannot be loaded ({type(e).__name__}: {e})"
    names = {f.name for f in dataclasses.fields(RunConfig)}
    if not {"workers", "ray_address"} <= names:
        return "evaluation on several workers is not in this engine yet"
    return None


def ray_unreachable(address: str, timeout_s: float = RAY_PROBE_S) -> str | None:
    """Why nothing answers at a Ray address given with a host and port, else None.

    The engine connects in its own thread, after this page has moved on to Live run; a TCP
    connection to the address finds a mistyped host here, as one st.error, as the LLM check
    does for a model server. "auto" (found by Ray: RAY_ADDRESS or the cluster last
    started on this machine), "local" (started by the run) and any other form are the engine's
    to judge."""
    m = _RAY_HOST_PORT.match(address or "")
    if not m:
        return None
    host, port = m["host"], int(m["port"])
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        return (f"nothing answers at {host}:{port} ({e.strerror or e}); check the address, "
                "or start the cluster there (ray start --head).")


@st.cache_resource(show_spinner=False)
def gpu_count() -> int:
    """GPUs this process sees (0 without one): a local pool runs one worker per GPU."""
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def max_workers() -> int:
    """The most workers RunConfig accepts."""
    from engine import backends
    return backends.MAX_WORKERS


@st.cache_data(show_spinner=False)
def _describe(name: str) -> str:
    from engine import models
    try:
        return models.describe(name)
    except Exception:
        return ""


# ---- the page ----------------------------------------------------------------------------------
def page() -> None:
    st.title("New run")
    db_path = st.session_state.get("db_path") or data.default_db_path()
    eng, why = engine_handle()
    if eng is None:
        st.warning(f"The engine cannot be loaded in this process, so runs can be watched but "
                   f"not started here. ({why})")
        return
    from engine.models import MODEL_NAMES
    from kernels import FAMILY_NAMES, GENERATED_NAMES
    state = eng.status()
    busy = state["state"] in BUSY_STATES
    if busy:
        st.info(f"The engine is busy with run {state['run_id']} ({state['state']}): stop it on "
                "the Live run page before starting another.")

    st.subheader("Model")
    source = st.radio("Model source", SOURCES, key="nr_source", horizontal=True)
    loader = file_loader()
    if source == BUILTIN:
        st.selectbox("Model", MODEL_NAMES, key="nr_model",
                     index=MODEL_NAMES.index("llama-tiny") if "llama-tiny" in MODEL_NAMES else 0)
        st.caption(_describe(st.session_state["nr_model"]))
    elif source == PATH:
        st.text_input("Model file and class", key="nr_path",
                      placeholder="path/to/file.py:ClassName",
                      help="A .py file defining an nn.Module class (or a KernelBench-style "
                           "problem file, without :ClassName); relative paths are from the "
                           "repository root.")
    elif source == SPEC:
        st.text_input("Model spec", key="nr_spec", placeholder="hf:llama  or  op:softmax:8192x8192",
                      help="hf:NAME: a Hugging Face transformers model from a small config with "
                           "random weights (needs transformers). op:FAMILY[:SHAPE][,...]: one "
                           "call of each family's operator at a shape in its convention, e.g. "
                           "op:matmul:4096x4096x4096,attention:4x32x4096x128x8x1.")
    else:
        st.file_uploader("Model file", type=["py"], key="nr_upload")
        st.text_input("Class name", key="nr_upload_class", placeholder="MyModel",
                      help="Empty for a KernelBench-style problem file (Model, get_inputs).")
    if source in (PATH, UPLOAD) and loader is None:
        st.error(FILE_MODELS_MISSING.capitalize() + ": this engine has no loader for them "
                 "(engine.models.load_source). Choose a built-in model.")

    c1, c2 = st.columns(2)
    c1.text_input("Input shape", key="nr_shape", placeholder="BATCHxSEQ, e.g. 2x32",
                  help="Leave empty for the model's default input.")
    c2.selectbox("Dtype", DTYPES, key="nr_dtype",
                 help="auto: bfloat16 on a GPU, float32 under the interpreter.")
    st.multiselect("Families", FAMILY_NAMES + GENERATED_NAMES, key="nr_families",
                   placeholder="all the profile finds",
                   help="Kernel families to optimize; empty means every family of the nine the "
                        "profile finds. 'region': any fusible op chain outside them, a kernel "
                        "generated for each.")

    st.subheader("Proposer")
    llm, llm_why = llm_support()
    if llm is None:
        st.radio("Proposer", PROPOSERS, key="nr_proposer", horizontal=True, index=0,
                 disabled=True)
        st.caption(f"Only the built-in search is available: {llm_why}.")
        proposer = "search"
    else:
        proposer = st.radio("Proposer", PROPOSERS, key="nr_proposer", horizontal=True,
                            help="search: the built-in seeded search over each family's "
                                 "variants; llm: a model writes each candidate; hybrid: both.")
    if proposer != "search":
        _llm_inputs()

    st.subheader("Evaluation")
    _evaluation_inputs()
    st.radio("Verify", VERIFY_ORDERS, key="nr_verify_order", horizontal=True,
             help="full: all five verifier stages before a candidate is timed; bench-first: "
                  "timed after its smoke test, the other four stages only if it beats the best "
                  "(only those can be kept); auto: bench-first on a GPU, full under the "
                  "interpreter.")

    st.subheader("Budget")
    c1, c2, c3 = st.columns(3)
    _number(c1, "nr_budget_exp")
    _number(c2, "nr_budget_min")
    _number(c3, "nr_seed")
    st.caption(f"The run is written to `{data.resolve_db_path(db_path)}`.")
    ss = st.session_state
    asked = ss.pop("start_requested", False)
    st.button("Start", type="primary", key="nr_start", on_click=_request_start,
              disabled=busy or asked)
    if asked:
        _start(db_path)
    for err in ss.pop("start_errors", []):
        st.error(err)


def _llm_inputs() -> None:
    from engine.loop import RunConfig
    names = {f.name for f in dataclasses.fields(RunConfig)}
    c1, c2 = st.columns(2)
    c1.text_input("LLM model", key="nr_llm_model",
                  placeholder="e.g. openai/gpt-4o or ollama_chat/qwen2.5-coder",
                  help="A litellm model string: provider/model.")
    c2.text_input("API base", key="nr_api_base", placeholder="e.g. http://localhost:11434",
                  help="For a local OpenAI-compatible server; leave empty for a hosted provider.")
    c1, c2 = st.columns(2)
    if "max_in_flight" in names:
        _number(c1, "nr_in_flight")
    if "max_cost_usd" in names:
        _number(c2, "nr_max_cost")
    _, where = api_key()
    st.caption(f"API key: found in {where} (not shown)." if where else
               "API key: none in st.secrets or the environment "
               f"({' / '.join(KEY_NAMES)}); a local server may not need one.")


def _evaluation_inputs() -> None:
    """Where candidates are verified and timed: one worker, a local pool (one worker per GPU, or
    interpreter workers on a CPU) or a Ray cluster; the CLI's --workers / --ray."""
    why = scale_out_support()
    choice = st.radio(
        "Evaluate on", EVAL_CHOICES, key="nr_eval", horizontal=True, disabled=why is not None,
        help="Several workers evaluate candidates side by side. A would-be new best found on "
             "another worker is timed again on the first one (the reference), so kept timings "
             "always compare on one device.")
    if why:
        st.caption(f"Only one worker: {why}.")
        return
    if choice == EVAL_LOCAL:
        gpus = gpu_count()
        top = gpus or MAX_CPU_WORKERS
        c1, _ = st.columns(2)
        st.session_state.setdefault("nr_workers", str(gpus or 2))
        c1.text_input("Workers", key="nr_workers",
                      help=(f"1 to {top}. " + ("One worker per GPU, each pinned to its own "
                                              "(GPUs 0..N-1)." if gpus else
                                              "No GPU here: each worker runs candidates under "
                                              "Triton's CPU interpreter, side by side.")))
        st.caption(f"{gpus} GPU(s) on this machine: one worker each." if gpus else
                   f"No GPU on this machine: up to {MAX_CPU_WORKERS} interpreter workers.")
    elif choice == EVAL_RAY:
        c1, c2 = st.columns(2)
        c1.text_input("Ray address", value=RAY_DEFAULT, key="nr_ray_address",
                      help="auto: the cluster this machine belongs to; HOST:PORT or "
                           "ray://HOST:10001 for another; local: start a throwaway cluster on "
                           "this machine for the run.")
        c2.text_input("Workers", key="nr_ray_workers", placeholder="one per GPU in the cluster",
                      help=f"Ray actors, one GPU each, 1 to {max_workers()}; blank: one per GPU "
                           "in the cluster.")


# ---- numbers -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Number:
    """A number typed as text: its label, kind (int or float), bounds, default text, and what
    an empty box means (None: it must be filled in)."""
    label: str
    kind: type
    lo: float | None
    hi: float | None
    default: str
    blank: object = None
    help: str = ""


NUMBERS = {
    "nr_budget_exp": Number("Experiments", int, 0, None, "40", 0,
                            "A whole number; 0 means no limit on experiments."),
    "nr_budget_min": Number("Minutes", float, 0, None, "0", 0.0, "0 means no time limit."),
    "nr_seed": Number("Seed", int, 0, None, "0", 0, "A whole number, 0 or more."),
    "nr_in_flight": Number("Requests in flight", int, 1, 32, "1", None,
                           "LLM requests outstanding at once, 1 to 32."),
    "nr_max_cost": Number("Cost limit (USD)", float, 0, None, "5", 0.0,
                          "The run stops proposing past it; 0: no limit."),
}


def _number(col, key: str) -> None:
    n = NUMBERS[key]
    st.session_state.setdefault(key, n.default)
    col.text_input(n.label, key=key, help=n.help)


def parse_number(text, label: str, kind: type = int, lo: float | None = None,
                 hi: float | None = None, blank=None) -> tuple[object, str | None]:
    """(value, None) for a valid number typed as text, else (None, the error to show).

    Empty text gives ``blank``, or an error when blank is None. Whole numbers for kind=int;
    outside [lo, hi] is an error that says the bounds. Never rounds, clamps or falls back."""
    raw = str(text if text is not None else "").strip()
    if not raw:
        return (blank, None) if blank is not None else (None, f"{label}: give a number.")
    try:
        value = float(raw.replace("_", ""))
    except ValueError:
        return None, f"{label}: {raw!r} is not a number."
    if value != value or value in (float("inf"), float("-inf")):
        return None, f"{label}: {raw!r} is not a finite number."
    if kind is int:
        if value != int(value):
            return None, f"{label}: {raw!r} is not a whole number."
        value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = (f"between {lo:g} and {hi:g}" if lo is not None and hi is not None else
                  f"at least {lo:g}" if lo is not None else f"at most {hi:g}")
        return None, f"{label}: {raw} is out of range; give a number {bounds}."
    return value, None


def read_number(ss, key: str, errors: list[str], **override):
    """The value of one of NUMBERS from session state; an error is appended to ``errors``."""
    n = NUMBERS[key]
    spec = dict(label=n.label, kind=n.kind, lo=n.lo, hi=n.hi, blank=n.blank) | override
    value, err = parse_number(ss.get(key, n.default), **spec)
    if err:
        errors.append(err)
    return value


# ---- checking the inputs -----------------------------------------------------------------------
def _model_spec(ss, errors: list[str]) -> str | None:
    """The model to run: a built-in name, "file.py:Class" for a file model, or an hf:/op: spec
    (None if invalid)."""
    source = ss.get("nr_source", BUILTIN)
    if source == BUILTIN:
        return ss.get("nr_model")
    if source == SPEC:
        spec = (ss.get("nr_spec") or "").strip()
        if not spec.startswith(SPEC_PREFIXES):
            errors.append(f"Model spec: expected hf:NAME or op:FAMILY[:SHAPE], got {spec!r}.")
            return None
        return spec          # the engine's own check (RunConfig.validate) judges the rest
    if file_loader() is None:
        errors.append(FILE_MODELS_MISSING.capitalize() + ".")
        return None
    if source == PATH:
        spec = (ss.get("nr_path") or "").strip()
        m = _SPEC.match(spec)
        if not m:
            errors.append(f"Model file: expected path/to/file.py:ClassName, got {spec!r}.")
            return None
        path = data.resolve_db_path(m["path"])  # relative to the repository root, like the db
        if not path.is_file():
            errors.append(f"Model file: no file at {path}.")
            return None
        return f"{path}:{m['name']}" if m["name"] else str(path)
    upload = ss.get("nr_upload")
    name = (ss.get("nr_upload_class") or "").strip()
    if upload is None:
        errors.append("Model file: upload a .py file.")
    if name and not re.match(r"^[A-Za-z_]\w*$", name):
        errors.append(f"Class name: expected a Python identifier, got {name!r}.")
    if upload is None or errors:
        return None
    body = upload.getvalue()
    folder = Path(tempfile.gettempdir()) / "nightshift-uploads"
    folder.mkdir(exist_ok=True)
    path = folder / f"{hashlib.sha256(body).hexdigest()[:12]}-{Path(upload.name).name}"
    path.write_bytes(body)
    return f"{path}:{name}" if name else str(path)


def config_from_inputs(ss, db_path: str):
    """(RunConfig, []) from the page's inputs, or (None, [every problem found]).

    Checks what the engine would only find out after creating the run (a sequence longer than
    the model's context, an unreachable LLM), then the engine's own RunConfig.validate(), then
    whether a Ray cluster given by host and port answers."""
    from engine import models
    from engine.loop import ConfigError, RunConfig
    names = {f.name for f in dataclasses.fields(RunConfig)}
    errors: list[str] = []
    spec = _model_spec(ss, errors)
    shape = (ss.get("nr_shape") or "").strip()
    if shape and spec in models.MODEL_NAMES:  # a file model's shape is the engine's to check
        try:
            batch, seq = models.parse_input_shape(shape)
            if spec in models.MODEL_NAMES and seq > models.config(spec).max_seq:
                errors.append(f"Input shape: sequence length {seq} exceeds {spec}'s context of "
                              f"{models.config(spec).max_seq} tokens.")
        except ValueError as e:
            errors.append(f"Input shape: {e}.")
    n_bad = len(errors)
    budget_exp = read_number(ss, "nr_budget_exp", errors)
    budget_min = read_number(ss, "nr_budget_min", errors)
    seed = read_number(ss, "nr_seed", errors)
    if len(errors) == n_bad and not budget_exp and not budget_min:
        errors.append("Budget: set a number of experiments or of minutes (0 and 0 would never "
                      "stop before every family is done).")
    kw = dict(model=spec or "", dtype=ss.get("nr_dtype", "auto"), input_shape=shape or None,
              families=list(ss.get("nr_families") or []) or None,
              budget_experiments=budget_exp or None, budget_minutes=budget_min or None,
              seed=seed or 0, db=str(data.resolve_db_path(db_path)),
              verify_order=ss.get("nr_verify_order") or "auto")
    proposer = ss.get("nr_proposer", "search") or "search"
    if proposer != "search":
        llm, why = llm_support()
        if llm is None:
            errors.append(f"Proposer {proposer!r}: {why}.")
        else:
            kw.update(_llm_config(ss, names, llm, errors))
        kw["proposer"] = proposer
    kw.update(_evaluation_config(ss, errors))
    if errors:
        return None, errors
    if spec not in models.MODEL_NAMES and "model_source" in names:
        kw["model_source"] = spec   # a file model, where the engine keeps its path apart
    cfg = RunConfig(**{k: v for k, v in kw.items() if k in names})
    # the address first: a TCP probe answers in at most RAY_PROBE_S, where validate() imports ray
    why = ray_unreachable(getattr(cfg, "ray_address", None) or "")
    if why:
        return None, [f"Ray address: {why}"]
    try:
        cfg.validate()
    except ConfigError as e:
        return None, [f"Not started: {fmt.message(e)}"]
    return cfg, []


def _evaluation_config(ss, errors: list[str]) -> dict:
    """RunConfig's workers / ray_address from the "Evaluate on" inputs ({} for one worker).

    A Ray address goes to RunConfig as typed (stripped), blank included: RunConfig.validate
    says what is wrong with it, or that ray is not installed, as the CLI does."""
    choice = ss.get("nr_eval") or EVAL_ONE
    if choice == EVAL_ONE:
        return {}
    if choice not in EVAL_CHOICES:
        errors.append(f"Evaluate on: choose one of {', '.join(EVAL_CHOICES)}.")
        return {}
    why = scale_out_support()
    if why:
        errors.append(f"Evaluate on {choice}: {why}.")
        return {}
    if choice == EVAL_LOCAL:
        n, err = parse_number(ss.get("nr_workers"), "Workers", int, 1,
                              gpu_count() or MAX_CPU_WORKERS)
        if err:
            errors.append(err)
            return {}
        return {"workers": n}
    n, err = parse_number(ss.get("nr_ray_workers"), "Workers", int, 1, max_workers(), blank=0)
    if err:
        errors.append(err)
        return {}
    return {"ray_address": str(ss.get("nr_ray_address", RAY_DEFAULT) or "").strip(),
            "workers": n or None}


def _llm_config(ss, names: set[str], llm, errors: list[str]) -> dict:
    model = (ss.get("nr_llm_model") or "").strip()
    base = (ss.get("nr_api_base") or "").strip() or None
    if not model:
        errors.append("LLM model: give a model as provider/name, e.g. openai/gpt-4o or "
                      "ollama_chat/qwen2.5-coder.")
    if base and not re.match(r"^https?://[^\s/]+", base):
        errors.append(f"API base: expected an http(s) URL, got {base!r}.")
    if errors:
        return {}
    n_bad = len(errors)
    in_flight = read_number(ss, "nr_in_flight", errors) if "max_in_flight" in names else None
    max_cost = read_number(ss, "nr_max_cost", errors) if "max_cost_usd" in names else None
    if len(errors) > n_bad:
        return {}
    key, _ = api_key()
    try:
        ok, msg = llm.check_reachable(model, base, api_key=key, timeout_s=10)
    except Exception as e:
        ok, msg = False, str(e)
    if not ok:
        # the key never goes into a message: strip it in case the client echoed it
        msg = str(msg).replace(key, "***") if key else str(msg)
        errors.append(f"LLM {model!r} is not reachable: {fmt.message(msg)}")
        return {}
    out = {"llm_model": model, "api_base": base}
    if in_flight:
        out["max_in_flight"] = in_flight
    if "max_cost_usd" in names:
        out["max_cost_usd"] = max_cost or None
    return out


def _request_start() -> None:
    """Start's callback: only asks. The script run that follows draws Start disabled, then
    checks and starts (_start), so a check that takes seconds shows as such and Start cannot be
    pressed twice."""
    st.session_state["start_requested"] = True


def _start(db_path: str) -> None:
    """Check everything, start the engine only if nothing is wrong, then switch to Live run.

    Called from the page's script run after Start was pressed, under a status box; errors go to
    session state and are shown under the button after a rerun that enables it again."""
    ss = st.session_state
    eng, why = engine_handle()
    if eng is None:
        ss["start_errors"] = [f"The engine is not available: {why}"]
        st.rerun()
    ray = ss.get("nr_eval") == EVAL_RAY
    with st.status("Checking the inputs" + (" and the Ray cluster" if ray else "") + "…",
                   expanded=True, state="running") as box:
        cfg, errors = config_from_inputs(ss, db_path)
        if errors:
            box.update(label="Not started", state="error")
            ss["start_errors"] = errors
            st.rerun()
        box.write("Starting the run" + (" (connecting to the cluster)" if ray else "") + "…")
        _launch(eng, cfg, ss)


def _launch(eng, cfg, ss) -> None:
    kwargs = {}
    if cfg.proposer != "search" and "api_key" in inspect.signature(eng.start).parameters:
        # the key travels in memory to the proposer; RunConfig (stored with the run) never has it
        kwargs["api_key"] = api_key()[0]
    try:
        run_id = eng.start(cfg, **kwargs)
    except Exception as e:  # engine busy, database unwritable, ...: say so instead of crashing
        ss["start_errors"] = [f"Not started: {fmt.message(e)}"]
        st.rerun()
    select_run(run_id)
    st.switch_page("app/live.py")


if __name__ == "__main__":  # run as a page by st.navigation (streamlit_app.py)
    page()
