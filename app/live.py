"""The "Live run" page: start a run, and watch the selected one as the engine works on it.

The live view is one fragment that re-reads SQLite every REFRESH_S while the run is active
(st.fragment(run_every=...): Streamlit schedules it, nothing here sleeps or loops); a finished
run is drawn once and not polled.
"""
from __future__ import annotations

import dataclasses

import streamlit as st

from app import charts, data
from app.shared import BUSY_STATES, engine_handle, engine_owns, select_run

REFRESH_S = 1.5
DTYPES = ("auto", "float32", "float16", "bfloat16")
RESUMABLE = ("stopped", "interrupted")  # runs.status values the engine can pick up again


def page() -> None:
    st.title("Live run")
    db_path = st.session_state.get("db_path") or data.default_db_path()
    run_id = st.session_state.get("run_id")
    start_form(db_path, expanded=run_id is None)
    if run_id is None:
        st.info("No run selected. Start one above, or point the sidebar at a database with runs.")
        return
    active = _is_active(db_path, run_id)
    # Decorated here rather than at import so that run_every can follow the run: a live run is
    # polled, a finished one is not. The key keeps the fragment's identity stable across reruns.
    st.fragment(live_view, run_every=REFRESH_S if active else None, key="live_view")(
        db_path, run_id, active)


# ---- start form -------------------------------------------------------------------------------
def start_form(db_path: str, expanded: bool) -> None:
    eng, why = engine_handle()
    with st.expander("Start a run", expanded=expanded):
        if eng is None:
            st.warning(f"The engine cannot be loaded in this process, so runs can be watched but "
                       f"not started here. ({why})")
            return
        from engine.models import MODEL_NAMES
        from kernels import FAMILY_NAMES
        state = eng.status()
        if state["state"] in BUSY_STATES:
            st.caption(f"The engine is busy with run {state['run_id']} ({state['state']}): "
                       "stop it before starting another.")
        with st.form("start_run", border=False):
            c1, c2, c3 = st.columns(3)
            c1.selectbox("Model", MODEL_NAMES, key="f_model",
                         index=MODEL_NAMES.index("llama-tiny") if "llama-tiny" in MODEL_NAMES else 0)
            c2.selectbox("Dtype", DTYPES, key="f_dtype")
            c3.text_input("Input shape", key="f_shape", placeholder="BATCHxSEQ, e.g. 2x32",
                          help="Leave empty for the model's default input.")
            st.multiselect("Families", FAMILY_NAMES, key="f_families",
                           placeholder="all the profile finds",
                           help="Kernel families to optimize; empty means every family the "
                                "profile finds.")
            c1, c2, c3 = st.columns(3)
            c1.number_input("Budget (experiments)", min_value=0, value=40, step=1,
                            key="f_budget_exp", help="0 means no limit on experiments.")
            c2.number_input("Budget (minutes)", min_value=0.0, value=0.0, step=5.0,
                            key="f_budget_min", help="0 means no time limit.")
            c3.number_input("Seed", min_value=0, value=0, step=1, key="f_seed")
            st.form_submit_button("Start", type="primary", key="f_start", on_click=_start,
                                  args=(db_path,), disabled=state["state"] in BUSY_STATES)
    err = st.session_state.pop("start_error", None)
    if err:
        st.error(err)


def _start(db_path: str) -> None:
    """Form callback: build the RunConfig from the form and start the engine on it.

    Runs before the script reruns, so the sidebar can select the new run in that same rerun.
    Errors go to session state to be shown under the form (a callback cannot place elements)."""
    from engine.loop import ConfigError, RunConfig
    eng, why = engine_handle()
    if eng is None:
        st.session_state["start_error"] = f"The engine is not available: {why}"
        return
    ss = st.session_state
    shape = (ss.get("f_shape") or "").strip()
    cfg = RunConfig(
        model=ss["f_model"], dtype=ss["f_dtype"], input_shape=shape or None,
        families=list(ss.get("f_families") or []) or None,
        budget_experiments=int(ss["f_budget_exp"]) or None,
        budget_minutes=float(ss["f_budget_min"]) or None,
        seed=int(ss["f_seed"]), db=str(data.resolve_db_path(db_path)))
    try:
        run_id = eng.start(cfg)
    except ConfigError as e:
        ss["start_error"] = f"Not started: {e}"
        return
    except Exception as e:  # engine busy, database unwritable, ...: say so instead of crashing
        ss["start_error"] = f"Not started: {type(e).__name__}: {e}"
        return
    select_run(run_id)


def _continue(run: dict, db_path: str) -> None:
    """Resume a stopped or interrupted run with the config it was started with."""
    from engine.loop import RunConfig
    eng, why = engine_handle()
    if eng is None:
        st.session_state["control_error"] = f"The engine is not available: {why}"
        return
    names = {f.name for f in dataclasses.fields(RunConfig)}
    cfg = RunConfig(**{k: v for k, v in (run.get("config") or {}).items() if k in names})
    cfg.db = str(data.resolve_db_path(db_path))
    try:
        eng.start(cfg, resume_run_id=run["id"])
    except Exception as e:
        st.session_state["control_error"] = f"Could not resume: {type(e).__name__}: {e}"


def _control(action: str) -> None:
    eng, _ = engine_handle()
    try:
        getattr(eng, action)()
    except Exception as e:
        st.session_state["control_error"] = f"{action} failed: {type(e).__name__}: {e}"


# ---- live view --------------------------------------------------------------------------------
def _is_active(db_path: str, run_id: str) -> bool:
    """Whether the run is still changing: the engine here works on it, or its row says running
    or paused (another process's engine may be writing the same database)."""
    owned = engine_owns(run_id)
    if owned and owned["state"] in BUSY_STATES:
        return True
    try:
        store = data.open_store(db_path)
    except data.StoreError:
        return False
    if store is None:
        return False
    try:
        run = data.get_run(store, run_id)
    finally:
        store.close()
    return bool(run) and run["status"] in data.ACTIVE_STATUSES


def live_view(db_path: str, run_id: str, was_active: bool) -> None:
    try:
        store = data.open_store(db_path)
    except data.StoreError as e:
        st.error(str(e))
        return
    if store is None:
        st.warning(f"No database at {db_path}.")
        return
    try:
        run = data.get_run(store, run_id)
        if run is None:
            st.warning(f"Run {run_id} is not in {db_path}.")
            return
        owned = engine_owns(run_id)
        active = (bool(owned) and owned["state"] in BUSY_STATES) or \
            run["status"] in data.ACTIVE_STATUSES
        if was_active and not active:
            # The run just ended: rerun the whole page once so the fragment is re-made without
            # run_every (and the start form sees an idle engine).
            st.rerun()
        cache = st.session_state.setdefault("exp_cache", {})
        exps = data.experiments_frame(store, run_id, cache)
        targets = data.targets_frame(store, run_id)
        outcomes = data.stage_outcomes_frame(store, run_id)
        events = data.events_frame(store, run_id, limit=200)
    finally:
        store.close()
    _render(run, owned, exps, targets, outcomes, events, db_path)


def _render(run, owned, exps, targets, outcomes, events, db_path) -> None:
    interpreter = run["timing_mode"] == "interpreter" or \
        bool((exps["timing_mode"] == "interpreter").any())
    proj = data.amdahl_projection(exps, targets)
    # the engine's own state is fresher while it works (starting, stopping, ...); once it is done
    # the run row is the record
    status = owned["state"] if owned and owned["state"] in BUSY_STATES else run["status"]

    c1, c2, c3, c4 = st.columns(4)
    with c1.container(key="run_status"):
        st.metric("Status", status)
    with c2.container(key="elapsed"):
        st.metric("Elapsed", data.format_duration(data.elapsed_s(run)))
    with c3.container(key="exp_count"):
        st.metric("Experiments", len(exps))
    with c4.container(key="projected"):
        st.metric("Projected model speedup", f"{proj['projected'].iloc[-1]:.3f}×",
                  help="Amdahl: 1 / ((1 - Σf) + Σ f/s) over the targets, s = best kept speedup.")
    st.caption(f"Run {run['id']} · model {run['model']} · timing: {run['timing_mode']}")
    if interpreter:
        st.warning("Interpreter timing — not GPU performance. This run had no GPU: its kernels "
                   "ran under Triton's CPU interpreter, so its latencies and speedups only compare "
                   "candidates with each other.", icon="⚠️")
    if run.get("error"):
        st.error(f"Run error: {run['error']}")
    if owned and owned.get("error"):
        st.error(f"Engine error: {owned['error']}")

    _controls(run, owned, db_path)

    if run.get("current_target"):
        st.markdown(f"**Current target:** `{run['current_target']}`"
                    + (f" — {run['current_reason']}" if run.get("current_reason") else ""))
    elif status in ("starting", "running") and exps.empty:
        st.markdown("**Current target:** none yet (profiling the model)")

    left, right = st.columns([3, 2])
    with left:
        st.plotly_chart(charts.speedup_figure(exps, data.best_so_far(exps), interpreter),
                        key="chart_speedup")
    with right:
        st.plotly_chart(charts.amdahl_figure(proj, data.amdahl_limit(targets), interpreter),
                        key="chart_amdahl")
        st.plotly_chart(charts.stage_figure(outcomes), key="chart_stages")

    lat = "latency µs (interpreter)" if interpreter else "latency µs"
    spd = "speedup (interpreter)" if interpreter else "speedup"
    st.subheader("Experiments")
    st.dataframe(
        data.experiment_table(exps), hide_index=True, key="exp_table", placeholder="—",
        column_config={
            "seq": st.column_config.NumberColumn("seq", width="small"),
            "failed_stage": st.column_config.TextColumn("failed stage"),
            "hypothesis": st.column_config.TextColumn("hypothesis", width="medium"),
            "latency_us": st.column_config.NumberColumn(lat, format="%.1f"),
            # %g: interpreter speedups can be 1e-4, which a fixed %.3f would show as 0.000
            "speedup": st.column_config.NumberColumn(spd, format="%.3g×"),
            "pct_sol": st.column_config.NumberColumn(
                "% SOL", format="%.1f%%", help="Share of the speed of light (memory-bound floor)."),
        })
    if not targets.empty:
        with st.expander("Targets (ranked by share of model time)"):
            st.dataframe(targets.drop(columns=["id"]), hide_index=True, key="targets_table")
    st.subheader("Event log")
    st.dataframe(events, hide_index=True, key="event_log",
                 column_config={"ts": st.column_config.DatetimeColumn("time (UTC)", format="HH:mm:ss",
                                                                      width="small"),
                                "level": st.column_config.TextColumn("level", width="small"),
                                "message": st.column_config.TextColumn("message", width="large")})


def _controls(run: dict, owned: dict | None, db_path: str) -> None:
    """Stop / pause / resume only for the run this process's engine holds; a stopped or
    interrupted run can be continued when the engine is free."""
    err = st.session_state.pop("control_error", None)
    if err:
        st.error(err)
    if owned and owned["state"] in BUSY_STATES:
        state = owned["state"]
        row = st.container(horizontal=True)
        row.button("Stop", key="ctl_stop", on_click=_control, args=("stop",),
                   disabled=state == "stopping")
        if state == "paused":
            row.button("Resume", key="ctl_resume", on_click=_control, args=("resume",))
        else:
            # the engine pauses between experiments, so the state turns "paused" a little later
            row.button("Pause", key="ctl_pause", on_click=_control, args=("pause",),
                       disabled=state != "running")
        return
    eng, _ = engine_handle()
    if eng is not None and run["status"] in RESUMABLE and \
            eng.status()["state"] not in BUSY_STATES:
        st.button("Continue run", key="ctl_continue", on_click=_continue, args=(run, db_path),
                  help="Resume this run from the database where it stopped.")
