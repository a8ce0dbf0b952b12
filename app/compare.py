"""The "Compare runs" page: two or more runs side by side, from any of the databases.

Runs may come from your database, the recorded H200 databases shipped in data/ and any other
database the Runs page lists, so a run made here can be held against one recorded on a real GPU
(one model on two machines, or two proposers on one). Every run is labelled with its device and
timing mode (interpreter speedups only compare candidates with each other, never with a GPU's)
and keeps its colour (charts.run_colour) on every chart. Shown: where and how each ran and its
end-to-end result, per-family speedups from 1×, the kernel curves overlaid, the projections
over experiments, the configurations where they differ, and the best kernels' code across runs.
The comparison downloads like a report: one self-contained HTML file, CSV, PNG.
"""
from __future__ import annotations

import difflib

import pandas as pd
import streamlit as st

from app import charts, data, export, fmt, view
from app.kernel_page import DIFF_CSS
from app.runs_page import sources
from app.shared import plot


def _options() -> dict[str, dict]:
    """run key ("db|run id") -> run (with its db) for every run of the listed databases."""
    opts: dict[str, dict] = {}
    for db in sources():
        try:
            store = data.open_store(db)
        except data.StoreError:
            continue
        if store is None:
            continue
        try:
            for r in data.list_runs(store):
                opts[data.run_key(db, r["id"])] = dict(r, db=db)
        finally:
            store.close()
    return opts


def _label(run: dict) -> str:
    dev = data.as_dict(run.get("device")).get("name") or "?"
    mode = "interpreter" if run["timing_mode"] == "interpreter" else "GPU"
    return f"{run['model']} · {dev} ({mode}) · {run['id']}" + (" · recorded" if run.get("recorded")
                                                               else "")


def short_name(run: dict) -> str:
    """How a run is named in tables and legends: model · device · the id's tail."""
    dev = data.as_dict(run.get("device")).get("name") or "?"
    dev = "CPU" if run["timing_mode"] == "interpreter" else dev.replace("NVIDIA ", "")
    model = run["model"] if len(run["model"]) <= 28 else run["model"][:27] + "…"
    return f"{model} · {dev} · {run['id'][-6:]}"


def load(run: dict) -> dict:
    """What the page needs of one run: data.report_data, and where it came from."""
    store = data.open_store(run["db"])
    try:
        rep = data.report_data(store, run["id"])
        best_sources = {}
        for t in rep["targets"]:
            if t.get("best_experiment_id"):
                e = data.experiment(store, t["best_experiment_id"])
                best_sources.setdefault(t["family"], e)
    finally:
        store.close()
    return dict(rep, db=run["db"], best_sources=best_sources)


def overview(loaded: dict[str, dict]) -> pd.DataFrame:
    """Facts as rows, one column per run: where and how it ran, how far it got, and its
    end-to-end result (measured when there is one, else why not, and the projection)."""
    facts: dict[str, dict] = {}
    for label, d in loaded.items():
        run, exps = d["run"], d["exps"]
        cfg = run.get("config") or {}
        head = data.headline(d)
        last = d["measured"].iloc[-1] if not d["measured"].empty else None
        facts[label] = {
            "model": run["model"], "device": data.as_dict(run["device"]).get("name") or "?",
            "timing": "interpreter" if run["timing_mode"] == "interpreter" else "GPU",
            "database": d["db"], "run id": run["id"],
            "proposer": cfg.get("proposer", "search"), "dtype": d["dtype"],
            "input": cfg.get("input_shape") or "default", "status": run["status"],
            "experiments": f"{len(exps)} ({int((exps['state'] == 'kept').sum())} kept, "
                           f"{int((exps['state'] == 'failed').sum())} failed)",
            "duration": fmt.duration(data.elapsed_s(run)),
            "end to end vs eager": head["text"] if head["kind"] == "measured" else
            "not measured" + (": " + data.not_measured_why(d["checks"])
                              if head["kind"] == "not_measured" else " (never checked)"),
            "end to end vs compile": fmt.ratio(last["vs_compile"]) if last is not None
            and pd.notna(last["vs_compile"]) else "not measured",
            "projected (Amdahl)": fmt.ratio(d["projected"]),
            "notes": run.get("notes") or "",
        }
    return pd.DataFrame(facts)


def family_rows(loaded: dict[str, dict]) -> pd.DataFrame:
    """Long table run, run_id, family, speedup, vs_compile, fraction, pct_sol, verdict,
    interpreter: for the grouped bars and the per-family table."""
    parts = []
    for label, d in loaded.items():
        s = d["summary"][["family", "speedup", "vs_compile", "fraction", "pct_sol", "best_us",
                          "eager_us", "verdict"]].copy()
        s.insert(0, "run_id", d["run"]["id"])
        s.insert(0, "run", label)
        s["interpreter"] = d["interpreter"]
        parts.append(s)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["run", "run_id", "family", "speedup", "vs_compile", "fraction", "pct_sol",
                 "best_us", "eager_us", "verdict", "interpreter"])


def config_diff(loaded: dict[str, dict]) -> pd.DataFrame:
    """The configuration keys whose values differ between the runs (one column per run)."""
    cfgs = {label: (d["run"].get("config") or {}) for label, d in loaded.items()}
    keys = sorted({k for c in cfgs.values() for k in c} - {"db"})
    rows = {}
    for k in keys:
        vals = {label: c.get(k) for label, c in cfgs.items()}
        if len({repr(v) for v in vals.values()}) > 1:
            rows[k] = {label: "—" if v is None else str(v) for label, v in vals.items()}
    return pd.DataFrame(rows).T if rows else pd.DataFrame()


def figures(loaded: dict[str, dict], colours: dict[str, str]) -> dict:
    """The comparison's charts, by file name (for the page and the exports)."""
    by_label = {label: colours[d["run"]["id"]] for label, d in loaded.items()}
    return {
        "family_speedup": charts.compare_speedup_figure(family_rows(loaded), colours),
        "kernel_curves": charts.compare_curves_figure(
            {label: data.best_so_far(d["exps"]) for label, d in loaded.items()}, by_label),
        "projection": charts.compare_projection_figure(
            {label: d["projection"] for label, d in loaded.items()}, by_label),
    }


def _initial(opts: dict) -> list[str]:
    """The runs compared when nothing was chosen yet: a link's or the Runs page's (url_cmp),
    else the sidebar's run and the newest other one."""
    ss = st.session_state
    asked = [k for k in ss.pop("url_cmp", []) if k in opts]
    if asked:
        return asked
    if ss.get("cmp_runs"):
        return [k for k in ss["cmp_runs"] if k in opts]
    mine = data.run_key(ss.get("view_db") or "", ss.get("run_id") or "")
    first = [mine] if mine in opts else []
    return first + [k for k in opts if k not in first][: 2 - len(first)]


def page() -> None:
    st.title("Compare runs")
    opts = _options()
    if len(opts) < 2:
        st.info("Comparing needs at least two runs; the listed databases have "
                f"{len(opts)}. Start another on the New run page.")
        return
    st.session_state["cmp_runs"] = _initial(opts)
    chosen = st.multiselect("Runs", list(opts), key="cmp_runs",
                            format_func=lambda k: _label(opts[k]),
                            help="Runs of your database, the recorded H200 databases and any "
                                 "other database listed on the Runs page.")
    view.set_page(cmp=list(chosen))
    if len(chosen) < 2:
        st.info("Choose two or more runs.")
        return
    loaded = {}
    for k in chosen:
        name = short_name(opts[k])
        while name in loaded:      # the same run twice cannot be chosen; same names can
            name += "′"
        loaded[name] = load(opts[k])
    colours = charts.run_colours([d["run"]["id"] for d in loaded.values()])
    for label, d in loaded.items():
        badge = data.recorded_label(d["run"])
        if badge:
            st.badge(f"{label}: {badge}", icon=":material/verified:", color="violet")
    st.subheader("Runs")
    st.table(overview(loaded))
    interp = [d["interpreter"] for d in loaded.values()]
    if any(interp) and not all(interp):
        st.warning("These runs were timed differently: interpreter speedups compare candidates "
                   "with each other under Triton's CPU interpreter, not GPU performance. Read "
                   "them side by side with the GPU runs only as a check of what was tried.",
                   icon="⚠️")
    figs = figures(loaded, colours)
    plot(figs["family_speedup"], "cmp_speedup")
    st.subheader("Per family")
    rows = family_rows(loaded)
    table = rows.pivot_table(index="family", columns="run", values="speedup", aggfunc="first")
    st.table(table.map(fmt.ratio).reindex(columns=list(loaded)).rename_axis(None, axis=1))
    st.caption("Best kept kernel's speedup over eager, per forward pass; — where the run has "
               "no kept kernel of that family.")
    plot(figs["kernel_curves"], "cmp_curves")
    plot(figs["projection"], "cmp_projection")
    diff = config_diff(loaded)
    st.subheader("Configuration differences")
    if diff.empty:
        st.caption("The runs were started with the same configuration.")
    else:
        st.table(diff)
    _code_diff(loaded)
    _downloads(loaded, figs)


def _code_diff(loaded: dict[str, dict]) -> None:
    """The best kernel of one family in two of the compared runs, as a diff."""
    st.subheader("Best kernels across runs")
    fams = sorted({f for d in loaded.values() for f in d["best_sources"]})
    fams = [f for f in fams if sum(f in d["best_sources"] for d in loaded.values()) >= 2]
    if not fams:
        st.caption("No family has a kept kernel in two of these runs.")
        return
    c1, c2, c3 = st.columns([1, 2, 2])
    fam = c1.selectbox("Family", fams, key="cmp_code_family")
    have = [label for label, d in loaded.items() if fam in d["best_sources"]]
    a = c2.selectbox("Run A", have, key=f"cmp_code_a:{fam}", index=0)
    b = c3.selectbox("Run B", have, key=f"cmp_code_b:{fam}", index=1 if len(have) > 1 else 0)
    ea, eb = loaded[a]["best_sources"][fam], loaded[b]["best_sources"][fam]
    if ea["source"] == eb["source"]:
        st.caption("The two runs kept the same source.")
        st.code(ea["source"], language="python")
        return
    table = difflib.HtmlDiff(wrapcolumn=60).make_table(
        ea["source"].splitlines(), eb["source"].splitlines(), f"{a} #{ea['seq']}",
        f"{b} #{eb['seq']}", context=True, numlines=3)
    st.html(f"<style>{DIFF_CSS}</style><div class='nsdiff'>{table}</div>")


def _downloads(loaded: dict[str, dict], figs: dict) -> None:
    st.subheader("Download")
    ids = "-".join(d["run"]["id"][-6:] for d in loaded.values())
    stem = f"nightshift-compare-{ids}"
    row = st.container(horizontal=True)
    row.download_button("Comparison (HTML)", on_click="ignore", key="cmp_dl_html",
                        data=lambda: export.compare_html(loaded, figs, overview(loaded),
                                                         family_rows(loaded)),
                        file_name=f"{stem}.html", mime="text/html",
                        icon=":material/description:")
    row.download_button("Per family (CSV)", on_click="ignore", key="cmp_dl_csv",
                        data=lambda: export.compare_csv(family_rows(loaded)),
                        file_name=f"{stem}-families.csv", mime="text/csv",
                        icon=":material/table:")
    ok, where = export.png_support()
    row.download_button("Charts (PNG, zip)", on_click="ignore", key="cmp_dl_png",
                        data=lambda: export.charts_png_zip(
                            export.titled(figs, export.compare_caption(loaded))),
                        file_name=f"{stem}-charts.zip", mime="application/zip",
                        icon=":material/image:", disabled=not ok)
    if not ok:
        st.info(f"PNG export is not available here: {where}.")


if __name__ == "__main__":  # run as a page by st.navigation (streamlit_app.py)
    page()
