"""The "Runs" page: every run of the chosen databases in one table, to find, open, compare and
report on them.

The databases: the sidebar's (yours), every recorded one shipped in data/, and any others named
here. One row per run: model, device, status as shown (a run whose engine is gone is stopped),
dates, experiments, the best measured end-to-end speedup over eager and over torch.compile
(only checks with a kernel in the model count), notes and tags. The table sorts by any column
(click its header) and is filtered by the controls above it; selected rows open in Live run,
Kernels or Report, or side by side in Compare runs. Notes and tags are the one thing the
dashboard writes, through engine.store.Store.set_run_notes, and only in your database.
"""
from __future__ import annotations

import streamlit as st

from app import data, fmt, view
from app.shared import select_run
from engine.store import KNOWN_MIGRATIONS, Store

STATUSES = ("running", "paused", "stopped", "done", "failed", "interrupted")
# The table's columns, in order, with their headers
COLUMNS = ["model", "device", "status", "created", "duration", "experiments", "kept",
           "e2e_vs_eager", "e2e_vs_compile", "notes", "tags", "proposer", "dtype", "timing",
           "db", "id"]


def sources() -> list[str]:
    """The databases listed: yours, the recorded ones, then the extra ones named on the page."""
    chosen = st.session_state.get("db_path") or data.default_db_path()
    extra = [p.strip() for p in (st.session_state.get("runs_more") or "").split(",") if p.strip()]
    out = [chosen] + data.recorded_db_paths() + extra
    seen, unique = set(), []
    for db in out:
        key = data.resolve_db_path(db)
        if key not in seen:
            seen.add(key)
            unique.append(db)
    return unique


def notes_writable(db: str) -> str | None:
    """None when notes and tags can be saved in ``db``, else why not. Only your database, and
    only at this code's schema: opening an older one for writing would migrate it, which is the
    engine's business, not the dashboard's."""
    chosen = st.session_state.get("db_path") or data.default_db_path()
    if data.resolve_db_path(db) != data.resolve_db_path(chosen):
        return "notes are saved in your database only (the sidebar's); this run is in another"
    try:
        store = data.open_store(db)
    except data.StoreError as e:
        return str(e)
    if store is None:
        return "no database there"
    try:
        done = {r[0] for r in store.db.conn.execute("SELECT name FROM schema_version")} \
            if "schema_version" in store.db.table_names() else set()
    finally:
        store.close()
    if done != KNOWN_MIGRATIONS:
        return ("this database has an older schema; the engine upgrades it the next time it runs "
                "there")
    return None


def _save_notes(db: str, run_id: str) -> None:
    ss = st.session_state
    why = notes_writable(db)
    if why:
        ss["runs_notes_msg"] = ("error", f"Not saved: {why}.")
        return
    tags = [t for t in (ss.get("runs_tags_edit") or "").split(",")]
    try:
        store = Store(data.resolve_db_path(db))
        try:
            store.set_run_notes(run_id, notes=ss.get("runs_notes_edit") or "", tags=tags)
        finally:
            store.close()
    except data.StoreError as e:
        ss["runs_notes_msg"] = ("error", f"Not saved: {e}")
        return
    ss["runs_notes_msg"] = ("success", f"Saved the notes of {run_id}.")


def page() -> None:
    st.title("Runs")
    dbs = sources()
    runs, problems = data.runs_table(dbs, writable={dbs[0]})
    for p in problems:
        st.error(p)
    c1, c2, c3, c4 = st.columns([3, 2, 2, 2])
    text = c1.text_input("Search", key="runs_q",
                         placeholder="model, device, status, notes, tags, run id ...")
    statuses = c2.multiselect("Status", STATUSES, key="runs_status", placeholder="any status")
    devices = c3.multiselect("Device", sorted(runs["device"].unique()), key="runs_device",
                             placeholder="any device")
    models = c4.multiselect("Model", sorted(runs["model"].unique()), key="runs_model",
                            placeholder="any model")
    c1, c2 = st.columns([2, 5])
    days = c1.date_input("Created between", value=(), key="runs_days", format="YYYY-MM-DD",
                         help="One day, or a first and a last day (UTC).")
    c2.text_input("Also list runs from", key="runs_more",
                  placeholder="other database files, comma-separated",
                  help="Paths of other SQLite files the engine wrote (relative to the "
                       "repository root, or absolute).")
    since = until = None
    if isinstance(days, (list, tuple)) and days:
        since, until = days[0], days[-1]
    shown = data.filter_runs(runs, text, statuses, devices, models, since, until)
    view.set_page(q=text or None)
    st.caption(f"{len(shown)} of {len(runs)} runs in {len(dbs)} database(s): "
               + ", ".join(f"`{db}`" for db in dbs)
               + ". Click a column's header to sort; select rows to open them.")
    table = shown.assign(duration=shown["duration_s"].map(fmt.duration))[COLUMNS]
    ratio = fmt.ratio_column_format(list(shown["e2e_vs_eager"]) + list(shown["e2e_vs_compile"]))
    event = st.dataframe(
        table, hide_index=True, key="runs_table", on_select="rerun",
        selection_mode="multi-row", placeholder="—",
        height=min(640, 35 * (len(table) + 1) + 3),
        column_config={
            "model": st.column_config.TextColumn("model", width="large"),
            "created": st.column_config.DatetimeColumn("created (UTC)",
                                                       format="YYYY-MM-DD HH:mm"),
            "experiments": st.column_config.NumberColumn("exp", format="%d"),
            "kept": st.column_config.NumberColumn("kept", format="%d"),
            "e2e_vs_eager": st.column_config.NumberColumn(
                "e2e vs eager", format=ratio,
                help="Best measured end-to-end speedup over eager, per forward pass, of a check "
                     "with at least one kernel in the model. Empty: not measured."),
            "e2e_vs_compile": st.column_config.NumberColumn(
                "e2e vs compile", format=ratio,
                help="The same model against torch.compile of the original: compile / the "
                     "faster optimized form. Empty: compile not timed."),
            "notes": st.column_config.TextColumn("notes", width="medium"),
            "db": st.column_config.TextColumn("database"),
            "id": st.column_config.TextColumn("run id"),
        })
    picked = [shown.iloc[i] for i in (event.selection.rows if event else [])
              if i < len(shown)]
    _actions(picked)


def _actions(picked: list) -> None:
    ss = st.session_state
    row = st.container(horizontal=True)
    one = len(picked) == 1
    go_live = row.button("Open in Live run", key="runs_open", disabled=not one,
                         icon=":material/monitoring:")
    go_kernels = row.button("Kernels", key="runs_kernels", disabled=not one,
                            icon=":material/memory:")
    go_report = row.button("Report", key="runs_report", disabled=not one,
                           icon=":material/summarize:")
    go_compare = row.button("Compare", key="runs_compare", disabled=len(picked) < 2,
                            icon=":material/compare_arrows:")
    if not picked:
        st.caption("Select one row to open it, two or more to compare them.")
    target = ("app/live.py" if go_live else "app/kernel_page.py" if go_kernels
              else "app/report.py" if go_report else None)
    if target and one:
        r = picked[0]
        select_run(r["id"], r["db_path"])
        st.switch_page(target)
    if go_compare:
        ss["url_cmp"] = [r["key"] for r in picked]
        st.switch_page("app/compare.py")
    if one:
        _notes(picked[0])
    msg = ss.pop("runs_notes_msg", None)
    if msg:
        getattr(st, msg[0])(msg[1])


def _notes(r) -> None:
    """Notes and tags of one selected run: editable in your database, shown elsewhere."""
    st.subheader(f"Notes · {r['model']} · {r['id']}")
    why = notes_writable(r["db_path"])
    ss = st.session_state
    if ss.get("runs_notes_for") != r["key"]:   # another run selected: its own words
        ss["runs_notes_for"] = r["key"]
        ss["runs_notes_edit"] = r["notes"]
        ss["runs_tags_edit"] = r["tags"]
    st.text_area("Notes", key="runs_notes_edit", disabled=why is not None, height=100)
    st.text_input("Tags", key="runs_tags_edit", disabled=why is not None,
                  placeholder="comma-separated, e.g. baseline, h200, keep")
    st.button("Save notes", key="runs_save", disabled=why is not None, on_click=_save_notes,
              args=(r["db_path"], r["id"]))
    if why:
        st.caption(f"Read-only: {why}.")


if __name__ == "__main__":  # run as a page by st.navigation (streamlit_app.py)
    page()
