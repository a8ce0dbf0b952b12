"""What every page shares: the process's engine and the sidebar (database path, run selector).

The sidebar keeps its choices in st.session_state ("db_path", "run_id"), which the pages read.
"""
from __future__ import annotations

import streamlit as st

from app import data

# Engine states in which the engine is working on (or winding down) its run.
BUSY_STATES = ("starting", "running", "paused", "stopping")


@st.cache_resource(show_spinner=False)
def _engine():
    # One Engine per dashboard process, shared by every browser session: it runs at most one run
    # in its own thread, and talks to the pages only through SQLite and engine.status()/stop()/...
    from engine.loop import Engine
    return Engine()


def engine_handle():
    """(engine, None), or (None, why) when engine.loop cannot be loaded in this process.

    A failed import is not cached (cache_resource does not cache exceptions), so the page picks
    the engine up as soon as it can be imported, without restarting the dashboard."""
    try:
        return _engine(), None
    except Exception as e:  # ImportError while engine.loop is missing, or any error in its imports
        return None, f"{type(e).__name__}: {e}"


def engine_owns(run_id: str | None) -> dict | None:
    """engine.status() when this process's engine is the one running ``run_id``, else None."""
    eng, _ = engine_handle()
    if eng is None or run_id is None:
        return None
    status = eng.status()
    return status if status.get("run_id") == run_id else None


def select_run(run_id: str) -> None:
    """Make the sidebar select ``run_id`` on the next script run (e.g. a run just started).

    A widget's state cannot be set once the widget has rendered in the current run, so this is
    applied by sidebar() before it draws the selector. A run just started lives in the chosen
    database, so the recorded runs are put away too."""
    st.session_state["pending_run_id"] = run_id


def _run_label(run: dict) -> str:
    mode = " · interpreter" if run["timing_mode"] == "interpreter" else ""
    rec = " · recorded" if run.get("recorded") else ""
    return (f"{run['id']} · {run['model']} · {run['status']} · {run['experiments_done']} exp"
            f"{mode}{rec}")


def view_db() -> str:
    """The database the pages read: the chosen one, or the shipped recorded one (see sidebar)."""
    return st.session_state.get("view_db") or st.session_state.get("db_path") \
        or data.default_db_path()


def sidebar() -> None:
    """Database path, the recorded-run fallback and the run selector.

    session_state: "db_path" is the chosen database (where the New run page writes);
    "view_db" is the one the pages read; "run_id" the selected run in it.
    When the chosen database has no runs (a fresh machine), the pages open the run recorded on a
    real GPU that ships in data/ instead, read-only, so the dashboard never opens on nothing."""
    st.session_state.setdefault("db_path", data.default_db_path())
    sb = st.sidebar
    sb.text_input("Database", key="db_path",
                  help="SQLite file the engine writes; relative paths are from the repository root.")
    chosen = st.session_state["db_path"]
    pending = st.session_state.pop("pending_run_id", None)
    if pending:
        st.session_state["show_recorded"] = False
    recorded = data.recorded_db_path()
    is_recorded = recorded is not None and data.resolve_db_path(chosen) == recorded
    view = chosen
    if recorded is not None and not is_recorded:
        if data.count_runs(chosen) == 0:
            sb.info("No runs in this database yet: showing the runs recorded on an NVIDIA H200 "
                    "(read-only). A run you start is written to the database above.")
            view = str(recorded)
        elif sb.toggle("Show the recorded H200 runs", key="show_recorded",
                       help="The runs shipped in data/recorded_h200.db, opened read-only."):
            view = str(recorded)
    st.session_state["view_db"] = view
    try:
        store = data.open_store(view)
    except data.StoreError as e:
        sb.error(str(e))
        st.session_state["run_id"] = None
        return
    if store is None:
        sb.caption("No database there yet: starting a run creates it.")
        st.session_state["run_id"] = None
        return
    try:
        runs = {r["id"]: r for r in data.list_runs(store)}
    finally:
        store.close()
    # The selector's key names the database and its number of runs, so a new database or a new
    # run gives a new widget: a kept widget whose options changed under it can keep showing its
    # old label in the browser. The choice is carried over by hand; pages read the plain
    # "run_id". A stale choice falls back to the newest run instead of erroring.
    if not runs:
        sb.caption("No runs in this database yet.")
        st.session_state["run_id"] = None
        return
    key = f"run_select:{view}:{len(runs)}"
    want = pending if pending in runs else st.session_state.get(key,
                                                                st.session_state.get("run_id"))
    if want in runs:
        st.session_state[key] = want
    else:
        st.session_state.pop(key, None)
    st.session_state["run_id"] = sb.selectbox(
        "Run", list(runs), key=key, format_func=lambda rid: _run_label(runs[rid]),
        help="Runs in this database, newest first.")


def run_header(run: dict, exps=None) -> bool:
    """The line every run page opens with: the recorded badge (runs.recorded = 1) and the
    interpreter warning. Returns whether the run's timings are interpreter timings."""
    label = data.recorded_label(run)
    if label:
        st.badge(label, icon=":material/verified:", color="violet")
    interpreter = run["timing_mode"] == "interpreter" or (
        exps is not None and not exps.empty and bool((exps["timing_mode"] == "interpreter").any()))
    return interpreter
