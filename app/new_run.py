"""The "New run" page: what to optimize and how, checked before anything starts.

Every input is checked on Start, and each problem is shown with st.error; a run is started only
when there is none, so a typo never leaves a failed run behind. The engine (one per process,
app/shared.py) runs the run in its own thread; the page then switches to Live run.

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

from app import data
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
    if st.session_state.pop("started_run", None):
        # set by the Start callback: a callback cannot switch pages, the script run after it can
        st.switch_page("app/live.py")
    eng, why = engine_handle()
    if eng is None:
        st.warning(f"The engine cannot be loaded in this process, so runs can be watched but "
                   f"not started here. ({why})")
        return
    from engine.models import MODEL_NAMES
    from kernels import FAMILY_NAMES
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
    st.multiselect("Families", FAMILY_NAMES, key="nr_families",
                   placeholder="all the profile finds",
                   help="Kernel families to optimize; empty means every family the profile finds.")

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
    c1.number_input("Experiments", min_value=0, value=40, step=1, key="nr_budget_exp",
                    help="0 means no limit on experiments.")
    c2.number_input("Minutes", min_value=0.0, value=0.0, step=5.0, key="nr_budget_min",
                    help="0 means no time limit.")
    c3.number_input("Seed", min_value=0, value=0, step=1, key="nr_seed")
    st.caption(f"The run is written to `{data.resolve_db_path(db_path)}`.")
    st.button("Start", type="primary", key="nr_start", on_click=_start, args=(db_path,),
              disabled=busy)
    for err in st.session_state.pop("start_errors", []):
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
        c1.number_input("Requests in flight", min_value=1, max_value=32, value=1, step=1,
                        key="nr_in_flight", help="LLM requests outstanding at once.")
    if "max_cost_usd" in names:
        c2.number_input("Cost limit (USD)", min_value=0.0, value=5.0, step=1.0,
                        key="nr_max_cost", help="The run stops proposing past it; 0: no limit.")
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
        c1.number_input("Workers", min_value=1, max_value=top, value=gpus or 2, step=1,
                        key="nr_workers",
                        help="One worker per GPU, each pinned to its own (GPUs 0..N-1)." if gpus
                        else "No GPU here: each worker runs candidates under Triton's CPU "
                             "interpreter, side by side.")
        st.caption(f"{gpus} GPU(s) on this machine: one worker each." if gpus else
                   f"No GPU on this machine: up to {MAX_CPU_WORKERS} interpreter workers.")
    elif choice == EVAL_RAY:
        c1, c2 = st.columns(2)
        c1.text_input("Ray address", value=RAY_DEFAULT, key="nr_ray_address",
                      help="auto: the cluster this machine belongs to; HOST:PORT or "
                           "ray://HOST:10001 for another; local: start a throwaway cluster on "
                           "this machine for the run.")
        c2.number_input("Workers", min_value=1, max_value=max_workers(), value=None, step=1,
                        key="nr_ray_workers", placeholder="one per GPU in the cluster",
                        help="Ray actors, one GPU each; blank: one per GPU in the cluster.")


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
    budget_exp = int(ss.get("nr_budget_exp") or 0) or None
    budget_min = float(ss.get("nr_budget_min") or 0) or None
    if budget_exp is None and budget_min is None:
        errors.append("Budget: set a number of experiments or of minutes (0 and 0 would never "
                      "stop before every family is done).")
    kw = dict(model=spec or "", dtype=ss.get("nr_dtype", "auto"), input_shape=shape or None,
              families=list(ss.get("nr_families") or []) or None,
              budget_experiments=budget_exp, budget_minutes=budget_min,
              seed=int(ss.get("nr_seed") or 0), db=str(data.resolve_db_path(db_path)),
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
    try:
        cfg.validate()
    except ConfigError as e:
        return None, [f"Not started: {e}"]
    why = ray_unreachable(getattr(cfg, "ray_address", None) or "")
    if why:
        return None, [f"Ray address: {why}"]
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
        n = ss.get("nr_workers")
        if n is None:
            errors.append("Workers: give the number of local workers (one per GPU).")
            return {}
        return {"workers": int(n)}
    n = ss.get("nr_ray_workers")
    return {"ray_address": str(ss.get("nr_ray_address", RAY_DEFAULT) or "").strip(),
            "workers": int(n) if n else None}


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
    key, _ = api_key()
    try:
        ok, msg = llm.check_reachable(model, base, api_key=key, timeout_s=10)
    except Exception as e:
        ok, msg = False, f"{type(e).__name__}: {e}"
    if not ok:
        # the key never goes into a message: strip it in case the client echoed it
        msg = str(msg).replace(key, "***") if key else str(msg)
        errors.append(f"LLM {model!r} is not reachable: {msg}")
        return {}
    out = {"llm_model": model, "api_base": base}
    if "max_in_flight" in names and ss.get("nr_in_flight"):
        out["max_in_flight"] = int(ss["nr_in_flight"])
    if "max_cost_usd" in names:
        out["max_cost_usd"] = float(ss.get("nr_max_cost") or 0) or None
    return out


def _start(db_path: str) -> None:
    """Start callback: check everything, start the engine only if nothing is wrong.

    Runs before the script reruns, so the sidebar can select the new run in that same rerun.
    Errors go to session state to be shown under the button (a callback cannot place elements)."""
    ss = st.session_state
    eng, why = engine_handle()
    if eng is None:
        ss["start_errors"] = [f"The engine is not available: {why}"]
        return
    cfg, errors = config_from_inputs(ss, db_path)
    if errors:
        ss["start_errors"] = errors
        return
    kwargs = {}
    if cfg.proposer != "search" and "api_key" in inspect.signature(eng.start).parameters:
        # the key travels in memory to the proposer; RunConfig (stored with the run) never has it
        kwargs["api_key"] = api_key()[0]
    try:
        run_id = eng.start(cfg, **kwargs)
    except Exception as e:  # engine busy, database unwritable, ...: say so instead of crashing
        ss["start_errors"] = [f"Not started: {type(e).__name__}: {e}"]
        return
    select_run(run_id)
    ss["started_run"] = run_id


if __name__ == "__main__":  # run as a page by st.navigation (streamlit_app.py)
    page()
