"""The "Report" page: what a stakeholder needs of one run, on one screen, and as files.

The measured end-to-end speedup comes first when the run has one; otherwise the Amdahl projection,
labelled as projected. Then the per-kernel results and the charts. Downloads: the same report as
one self-contained HTML file (plotly.js inline: opens offline), the experiments as CSV, and the
charts as PNG (kaleido, through the machine's Chrome or Chromium). The files are made only when
their button is pressed (deferred downloads), so drawing the page never pays for them.
"""
from __future__ import annotations

import re

import streamlit as st

from app import charts, data, export
from app.shared import plot, run_header, selected_store


def figures(rep: dict) -> dict:
    """The report's charts, by file name: best speedup per target (bars from 1×, against eager
    and torch.compile), the speedup trajectory, the end-to-end projection (with measured points)
    and the verifier's outcomes."""
    exps, interp = rep["exps"], rep["interpreter"]
    names = data.target_names(rep["targets"])
    return {
        "family_speedup": charts.family_speedup_figure(rep["summary"], interp),
        "speedup_over_experiments": charts.speedup_figure(exps, data.best_so_far(exps), interp,
                                                          names, data.compile_speedups(rep["targets"])),
        "end_to_end": charts.amdahl_figure(rep["projection"], rep["limit"], interp,
                                           measured=rep["measured"]),
        "verifier_stages": charts.stage_figure(rep["outcomes"]),
    }


def page() -> None:
    st.title("Report")
    opened = selected_store()
    if opened is None:
        return
    store, run_id, db_path = opened
    try:
        rep = data.report_data(store, run_id)
    finally:
        store.close()
    if rep is None:
        st.warning(f"Run {run_id} is not in {db_path}.")
        return
    run = rep["run"]
    run_header(run, rep["exps"])
    head = data.headline(rep)
    st.caption(f"{run['model']} · {rep['dtype']} · {data.device_label(run)} · "
               f"run {run['id']} · {run['status']}")
    with st.container(key="headline", border=True):
        st.metric(head["label"], head["text"])
        st.caption(head["note"][0].upper() + head["note"][1:])
    if rep["interpreter"]:
        st.warning("Interpreter timing — not GPU performance. This run had no GPU: its times "
                   "only compare candidates with each other.", icon="⚠️")
    exps = rep["exps"]
    counts = exps["state"].value_counts() if not exps.empty else {}
    c = st.columns(4)
    c[0].metric("Experiments", len(exps))
    c[1].metric("Kept", int(counts.get("kept", 0)))
    c[2].metric("Failed verification", int(counts.get("failed", 0)))
    c[3].metric("Duration", data.format_duration(data.elapsed_s(run)))

    st.subheader("Per target")
    slower = rep["summary"][rep["summary"]["slower"].astype(bool)]
    with st.container(key="slower_note"):
        if not slower.empty:
            st.warning("Slower than its baseline: " + "; ".join(
                f"{r['name']} {r['verdict']}" for r in slower.to_dict("records"))
                + ". The loop kept these as its best tries, but they do not beat what PyTorch "
                  "already does; the end-to-end check leaves such kernels out.",
                icon=":material/trending_down:")
    # a static table: every column and every verdict whole, for the screen and for a slide
    with st.container(key="rep_summary"):
        st.table(export.summary_table(rep["summary"], rep["interpreter"]), hide_index=True)
    st.caption("Times per forward pass: every call of the op in one forward of the model. The "
               "best kernel is judged against the faster of eager and torch.compile where the "
               "engine timed both.")
    figs = figures(rep)
    left, right = st.columns(2)
    with left:
        plot(figs["family_speedup"], "rep_family")
    with right:
        plot(figs["end_to_end"], "rep_e2e")
    left, right = st.columns([3, 2])
    with left:
        plot(figs["speedup_over_experiments"], "rep_speedup")
    with right:
        plot(figs["verifier_stages"], "rep_stages")

    st.subheader("Download")
    stem = f"nightshift-{_safe(run['model'])}-{run['id']}"
    row = st.container(horizontal=True)
    row.download_button("Report (HTML)", data=lambda: export.report_html(rep, figures(rep)),
                        file_name=f"{stem}.html", mime="text/html", key="dl_html",
                        icon=":material/description:", on_click="ignore")
    row.download_button("Experiments (CSV)", data=lambda: export.experiments_csv(rep),
                        file_name=f"{stem}-experiments.csv", mime="text/csv", key="dl_csv",
                        icon=":material/table:", on_click="ignore")
    ok, where = export.png_support()
    row.download_button("Charts (PNG, zip)", data=lambda: export.charts_png_zip(
                            export.titled(figures(rep), export.report_caption(rep))),
                        file_name=f"{stem}-charts.zip", mime="application/zip", key="dl_png",
                        icon=":material/image:", on_click="ignore", disabled=not ok)
    if ok:
        st.caption(f"The HTML report opens offline (plotly.js is inside it). PNGs are drawn at "
                   f"twice their size and name the run, model, device and day; kaleido renders "
                   f"them with {where}, which takes a few seconds.")
    else:
        st.info(f"PNG export is not available here: {where}. The HTML report and CSV work "
                "without it.")


def _safe(text: str) -> str:
    """A model spec as part of a file name (op:a:1x2,b -> op-a-1x2-b)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60]


if __name__ == "__main__":  # run as a page by st.navigation (streamlit_app.py)
    page()
