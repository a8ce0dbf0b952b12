"""What every page shares: the process's engine, the sidebar (database path, which database's
runs, run selector), presentation mode and the charts' conventions.

The sidebar keeps its choices in st.session_state ("db_path", "view_db", "run_id"), which the
pages read; app/view.py puts them in the URL.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
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


def select_run(run_id: str, db: str | None = None) -> None:
    """Make the sidebar select ``run_id`` (of database ``db``; None: the chosen database, where
    a run just started lives) on the next script run.

    A widget's state cannot be set once the widget has rendered in the current run, so this is
    applied by sidebar() before it draws the selectors."""
    st.session_state["pending_run_id"] = run_id
    st.session_state["pending_db"] = db


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _run_label(run: dict) -> str:
    """The run selector's line: short enough for the sidebar (the id is in the caption below)."""
    when = pd.Timestamp(run["created_at"], unit="s", tz="UTC").strftime("%m-%d %H:%M")
    mode = " · interp." if run["timing_mode"] == "interpreter" else ""
    return f"{_short(run['model'], 14)} · {run['status']} · {when}{mode}"


def _source_label(db: str, chosen: str) -> str:
    if db == chosen:
        return f"{_short(db, 34)} (yours)"
    return f"recorded: {Path(db).stem.removeprefix('recorded_')}"


def view_db() -> str:
    """The database the pages read: the chosen one, or a recorded one (see sidebar)."""
    return st.session_state.get("view_db") or st.session_state.get("db_path") \
        or data.default_db_path()


def selected_store():
    """(store, run id, database path) for the run the sidebar selected, or None after the page
    has said why there is none (no run chosen, an unreadable database, no database yet). The
    caller closes the store."""
    db_path, run_id = view_db(), st.session_state.get("run_id")
    if run_id is None:
        st.info("No run selected: choose one in the sidebar.")
        return None
    try:
        store = data.open_store(db_path)
    except data.StoreError as e:
        st.error(str(e))
        return None
    if store is None:
        st.info("No database yet.")
        return None
    return store, run_id, db_path


def _same_db(a: str, b: str) -> bool:
    return data.resolve_db_path(a) == data.resolve_db_path(b)


def sidebar() -> None:
    """Database path, which database's runs to show, and the run selector.

    session_state: "db_path" is the chosen database (where the New run page writes);
    "view_db" is the one the pages read (the chosen one, or one of the recorded databases in
    data/, opened read-only); "run_id" the selected run in it. When the chosen database has no
    runs (a fresh machine), the pages open the runs recorded on a real GPU instead, so the
    dashboard never opens on nothing. A link's db/run (app/view.py) and a run opened from the
    Runs page arrive as url_db / pending_db and pending_run_id and are applied here, before the
    widgets are drawn."""
    ss = st.session_state
    # The choices live under plain keys (db_path, view_db, run_id, present); each widget has
    # its own key, seeded from the plain one before it is drawn and copied back when it
    # changes. A widget's own state does not survive st.switch_page (the Runs page's buttons):
    # the database field fell back to its default there.
    ss.setdefault("db_path", data.default_db_path())
    st.html(SIDEBAR_CSS)
    recorded = data.recorded_db_paths()
    asked_db = ss.pop("pending_db", None) or ss.pop("url_db", None)
    pending = ss.pop("pending_run_id", None)
    if asked_db and not any(_same_db(asked_db, r) for r in recorded):
        ss["db_path"] = asked_db   # a run in another database of yours: that is the chosen one
    sb = st.sidebar
    ss["db_path_box"] = ss["db_path"]
    sb.text_input("Database", key="db_path_box", on_change=_new_database,
                  help="SQLite file the engine writes; relative paths are from the repository "
                       "root.")
    chosen = ss["db_path"]
    sources = [chosen] + [r for r in recorded if not _same_db(r, chosen)]
    key = f"view_choice:{chosen}"
    if asked_db:
        want = next((s for s in sources if _same_db(s, asked_db)), chosen)
    elif pending:
        want = chosen                  # a run just started lives in the chosen database
    else:
        want = ss.get(key) or ss.get("view_db")
    empty = data.count_runs(chosen) == 0
    if want not in sources:
        want = sources[1] if empty and len(sources) > 1 else chosen
    ss[key] = want
    if len(sources) > 1:
        view = sb.selectbox("Runs from", sources, key=key,
                            format_func=lambda db: _source_label(db, chosen),
                            help="Your database, or the runs recorded on an NVIDIA H200 that "
                                 "ship in data/ (opened read-only).")
    else:
        view = chosen
    if empty and view != chosen:
        sb.info("No runs in your database yet: showing runs recorded on an NVIDIA H200 "
                "(read-only). A run you start is written to the database above.")
    ss["view_db"] = view
    try:
        store = data.open_store(view)
    except data.StoreError as e:
        sb.error(str(e))
        ss["run_id"] = None
        return
    if store is None:
        sb.caption("No database there yet: starting a run creates it.")
        ss["run_id"] = None
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
        ss["run_id"] = None
        return
    rkey = f"run_select:{view}:{len(runs)}"
    want_run = pending if pending in runs else ss.get(rkey, ss.get("run_id"))
    if want_run in runs:
        ss[rkey] = want_run
    else:
        ss.pop(rkey, None)
    ss["run_id"] = sb.selectbox(
        "Run", list(runs), key=rkey, format_func=lambda rid: _run_label(runs[rid]),
        help="Runs in this database, newest first.")
    r = runs[ss["run_id"]]
    sb.caption(f"{r['id']} · {r['experiments_done']} experiments"
               + (" · recorded" if r.get("recorded") else ""))
    ss["present_box"] = bool(ss.get("present"))
    sb.toggle("Presentation mode", key="present_box", on_change=_copy,
              args=("present_box", "present"),
              help="No sidebar or toolbar, large type; the link keeps it (present=1).")


def _copy(widget_key: str, plain_key: str) -> None:
    st.session_state[plain_key] = st.session_state[widget_key]


def _new_database() -> None:
    """A database typed in: it is the chosen one, and the pages show its runs."""
    ss = st.session_state
    ss["db_path"] = ss["db_path_box"]
    ss["view_db"] = None


# A sidebar wide enough for a run's label (model, status, date) and a database path, uncut.
SIDEBAR_CSS = """<style>
section[data-testid="stSidebar"] {width: 340px !important; min-width: 340px !important;}
</style>"""

PRESENT_CSS = """
<style>
[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"],
[data-testid="stHeader"], [data-testid="stToolbar"], [data-testid="stDecoration"] {
  display: none !important;}
html {font-size: 21px;}
[data-testid="stMainBlockContainer"] {padding-top: 1.2rem; max-width: 100%;}
</style>
"""
PRESENT_FONT = dict(size=17)


def _exit_presentation() -> None:
    st.session_state["present"] = False


def presentation() -> bool:
    """Presentation mode (session_state "present", the URL's present=1): the sidebar and
    Streamlit's toolbar hidden and every size up a step; a button at the top leaves it (the
    sidebar's toggle is hidden with the sidebar). Returns whether it is on."""
    if not st.session_state.get("present"):
        return False
    st.html(PRESENT_CSS)
    st.button("Exit presentation", key="exit_present", on_click=_exit_presentation,
              icon=":material/close_fullscreen:", type="tertiary")
    return True


def plot(fig, key: str) -> None:
    """st.plotly_chart with the dashboard's conventions: larger type in presentation mode, no
    plotly logo, and the mode bar's PNG button at 2x."""
    if st.session_state.get("present"):
        fig.update_layout(font=PRESENT_FONT)
    with st.container(key=f"plot_{key}"):   # a stable handle for the page's CSS and tests
        st.plotly_chart(fig, key=key, config={"displaylogo": False,
                                              "toImageButtonOptions": {"scale": 2}})


def run_header(run: dict, exps=None) -> bool:
    """The line every run page opens with: the recorded badge (runs.recorded = 1) and the
    interpreter warning. Returns whether the run's timings are interpreter timings."""
    label = data.recorded_label(run)
    if label:
        st.badge(label, icon=":material/verified:", color="violet")
    interpreter = run["timing_mode"] == "interpreter" or (
        exps is not None and not exps.empty and bool((exps["timing_mode"] == "interpreter").any()))
    return interpreter
