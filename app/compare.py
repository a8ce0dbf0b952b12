"""The "Compare runs" page: two or more runs side by side.

Runs may come from the database the sidebar shows and from the recorded H200 runs, so a run made
here can be held against the one recorded on a real GPU (one model on two machines, or two
proposers on one). Every run is labelled with its device and timing mode: interpreter speedups
only compare candidates with each other, never with a GPU's.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app import charts, data
from app.shared import view_db


def _sources() -> list[str]:
    """Databases to offer runs from: the one the sidebar shows, then the recorded one."""
    out = [view_db()]
    rec = data.recorded_db_path()
    if rec is not None and data.resolve_db_path(out[0]) != rec:
        out.append(str(rec))
    return out


def _options() -> dict[str, dict]:
    """"db|run_id" -> run (with its db) for every run in the offered databases, newest first."""
    opts: dict[str, dict] = {}
    for db in _sources():
        try:
            store = data.open_store(db)
        except data.StoreError:
            continue
        if store is None:
            continue
        try:
            for r in data.list_runs(store):
                opts[f"{db}|{r['id']}"] = dict(r, db=db)
        finally:
            store.close()
    return opts


def _label(run: dict) -> str:
    dev = data.as_dict(run.get("device")).get("name") or "?"
    mode = "interpreter" if run["timing_mode"] == "interpreter" else "GPU"
    return f"{run['model']} · {dev} ({mode}) · {run['id']}" + (" · recorded" if run.get("recorded")
                                                               else "")


def load(run: dict) -> dict:
    """What the page needs of one run: the row, targets, experiments, projection, measured."""
    store = data.open_store(run["db"])
    try:
        full = data.get_run(store, run["id"])
        targets = data.targets(store, run["id"])
        exps = data.experiments_frame(store, run["id"])
        measured = data.e2e_frame(store, run["id"])
    finally:
        store.close()
    tframe = pd.DataFrame(targets, columns=["family", "fraction"]) if targets else \
        pd.DataFrame(columns=["family", "fraction"])
    return dict(run=full, targets=targets, exps=exps, measured=measured,
                summary=data.target_summary(targets, exps),
                projection=data.amdahl_projection(exps, tframe),
                projected=data.projected_final(targets))


def overview(loaded: dict[str, dict]) -> pd.DataFrame:
    """One row per run: where and how it ran, how far it got, and its end-to-end result."""
    rows = []
    for label, d in loaded.items():
        run, exps = d["run"], d["exps"]
        cfg = run.get("config") or {}
        rows.append({
            "run": label, "model": run["model"], "device": data.as_dict(run["device"]).get("name"),
            "timing": "interpreter" if run["timing_mode"] == "interpreter" else "GPU",
            "proposer": cfg.get("proposer", "search"), "dtype": cfg.get("dtype"),
            "input": cfg.get("input_shape") or "default", "status": run["status"],
            "experiments": len(exps), "kept": int((exps["state"] == "kept").sum()),
            "failed": int((exps["state"] == "failed").sum()),
            "duration": data.format_duration(data.elapsed_s(run)),
            "projected e2e": d["projected"],
            "measured e2e": float(d["measured"]["speedup"].iloc[-1])
            if not d["measured"].empty else None,
        })
    return pd.DataFrame(rows)


def family_rows(loaded: dict[str, dict]) -> pd.DataFrame:
    """Long table run, family, speedup, fraction, pct_sol, interpreter: for the grouped bars."""
    parts = []
    for label, d in loaded.items():
        s = d["summary"][["family", "speedup", "fraction", "pct_sol", "best_us", "eager_us"]].copy()
        s.insert(0, "run", label)
        s["interpreter"] = d["run"]["timing_mode"] == "interpreter"
        parts.append(s)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["run", "family", "speedup", "fraction", "pct_sol", "best_us", "eager_us",
                 "interpreter"])


def page() -> None:
    st.title("Compare runs")
    opts = _options()
    if len(opts) < 2:
        st.info("Comparing needs at least two runs; this database has "
                f"{len(opts)}. Start another on the New run page.")
        return
    keys = list(opts)
    st.session_state.setdefault("cmp_runs", keys[:2])
    st.session_state["cmp_runs"] = [k for k in st.session_state["cmp_runs"] if k in opts]
    chosen = st.multiselect("Runs", keys, key="cmp_runs", format_func=lambda k: _label(opts[k]),
                            help="Runs of the database in the sidebar and the recorded H200 runs.")
    if len(chosen) < 2:
        st.info("Choose two or more runs.")
        return
    loaded = {}
    for k in chosen:
        dev = data.as_dict(opts[k].get("device")).get("name") or "?"
        dev = "CPU" if opts[k]["timing_mode"] == "interpreter" else dev.replace("NVIDIA ", "")
        name = f"{opts[k]['model']} · {dev} · {opts[k]['id'][-6:]}"
        loaded[name] = load(opts[k])
    for label, d in loaded.items():
        badge = data.recorded_label(d["run"])
        if badge:
            st.badge(f"{label}: {badge}", icon=":material/verified:", color="violet")
    ov = overview(loaded)
    st.subheader("Runs")
    st.dataframe(ov, hide_index=True, key="cmp_overview", column_config={
        "projected e2e": st.column_config.NumberColumn(
            "projected e2e (Amdahl)", format="%.3f×",
            help="Amdahl's projection from the per-family speedups and time shares; not measured."),
        "measured e2e": st.column_config.NumberColumn(
            "measured e2e", format="%.3g×",
            help="Eager over optimized, the whole model timed with the kept kernels in.")})
    if (ov["timing"] == "interpreter").any() and (ov["timing"] == "GPU").any():
        st.warning("These runs were timed differently: interpreter speedups compare candidates "
                   "with each other under Triton's CPU interpreter, not GPU performance. Read "
                   "them side by side with the GPU runs only as a check of what was tried.",
                   icon="⚠️")
    rows = family_rows(loaded)
    st.plotly_chart(charts.compare_speedup_figure(rows), key="cmp_speedup")
    st.subheader("Per family")
    table = rows.pivot_table(index="family", columns="run", values="speedup", aggfunc="first")
    st.dataframe(table.reset_index(), hide_index=True, key="cmp_table", placeholder="—",
                 column_config={c: st.column_config.NumberColumn(c, format="%.3g×")
                                for c in table.columns})
    shares = rows.pivot_table(index="family", columns="run", values="fraction", aggfunc="first")
    with st.expander("Share of model time per family, by run"):
        st.dataframe((shares * 100).reset_index(), hide_index=True, key="cmp_shares",
                     placeholder="—",
                     column_config={c: st.column_config.NumberColumn(c, format="%.1f%%")
                                    for c in shares.columns})
    st.plotly_chart(charts.compare_projection_figure(
        {label: d["projection"] for label, d in loaded.items()}), key="cmp_projection")


if __name__ == "__main__":  # run as a page by st.navigation (streamlit_app.py)
    page()
