"""The "Kernels" page: one target (run + family) up close.

Baseline against best, or any two experiments, as a code diff; per-shape times against the eager
reference; a roofline under the roofs the run measured on its machine; and what the verifier said
at each stage. The baseline is the target's first experiment (the search proposer's starter);
the eager PyTorch reference it is timed against is shown beside it.
"""
from __future__ import annotations

import difflib
import inspect

import pandas as pd
import streamlit as st

from app import charts, data
from app.shared import run_header, view_db


def page() -> None:
    st.title("Kernels")
    db_path, run_id = view_db(), st.session_state.get("run_id")
    if run_id is None:
        st.info("No run selected: choose one in the sidebar.")
        return
    try:
        store = data.open_store(db_path)
    except data.StoreError as e:
        st.error(str(e))
        return
    if store is None:
        st.info("No database yet.")
        return
    try:
        run = data.get_run(store, run_id)
        targets = data.targets(store, run_id) if run else []
        exps = data.experiments_frame(store, run_id)
        if run is None:
            st.warning(f"Run {run_id} is not in {db_path}.")
            return
        interpreter = run_header(run, exps)
        st.caption(f"Run {run['id']} · model {run['model']} · {data.device_label(run)}")
        if not targets:
            st.info("This run has no targets yet (it is profiling, or the profile found no "
                    "family with a kernel).")
            return
        by_family = {t["family"]: t for t in targets}
        family = st.selectbox(
            "Target", list(by_family), key="k_family",
            format_func=lambda f: f"{f} · {by_family[f]['fraction']:.1%} of model time"
            + (f" · best {by_family[f]['speedup']:.3g}×" if by_family[f].get("speedup") else ""))
        target = by_family[family]
        mine = exps[exps["target_id"] == target["id"]].sort_values("seq")
        if mine.empty:
            st.info(f"No experiment on {family} yet.")
            return
        a_id, b_id = _pick_two(mine, target)
        a, b = data.experiment(store, a_id), data.experiment(store, b_id)
        best = data.experiment(store, target["best_experiment_id"]) \
            if target.get("best_experiment_id") else None
        ver = {label: data.verifications_frame(store, e["id"]) for label, e in
               (("A", a), ("B", b))}
    finally:
        store.close()

    _metrics(target, mine, interpreter)
    _diff(a, b, family)
    _shapes(target, best, a, b, interpreter)
    _roofline(run, target, best, a, b, interpreter)
    _verifier(a, b, ver)


def _label(row) -> str:
    spd = f" {row.speedup:.3g}×" if pd.notna(row.speedup) else ""
    stage = f"@{row.failed_stage}" if isinstance(row.failed_stage, str) else ""
    return f"#{int(row.seq)} {row.state}{stage}{spd} · {str(row.hypothesis)[:60]}"


def _pick_two(mine: pd.DataFrame, target: dict) -> tuple[int, int]:
    """Two experiment selectors, defaulting to baseline (first) and best (or latest)."""
    ids = mine["id"].astype(int).tolist()
    labels = {int(r.id): _label(r) for r in mine.itertuples()}
    base = ids[0]
    best = int(target["best_experiment_id"]) if target.get("best_experiment_id") in ids \
        else ids[-1]
    if best == base and len(ids) > 1:
        # nothing beat the baseline: a diff of it with itself says nothing, the latest try does
        st.caption("The baseline is still the best kernel of this target: B starts at the "
                   "latest experiment.")
        best = ids[-1]
    # a stale choice (another target's experiment) is reset before the widget renders
    for key, default in (("k_a", base), ("k_b", best)):
        if st.session_state.get(key) not in ids:
            st.session_state[key] = default
    c1, c2 = st.columns(2)
    a = c1.selectbox("A (default: baseline, the first experiment)", ids, key="k_a",
                     format_func=labels.get)
    b = c2.selectbox("B (default: the best kept)", ids, key="k_b", format_func=labels.get)
    return a, b


def _metrics(target: dict, mine: pd.DataFrame, interpreter: bool) -> None:
    tag = " (interpreter)" if interpreter else ""
    c = st.columns(5)
    c[0].metric("Share of model time", f"{target['fraction']:.1%}")
    c[1].metric("Eager" + tag, f"{target['ref_latency_us']:,.1f} µs"
                if target.get("ref_latency_us") else "—")
    c[2].metric("Best" + tag, f"{target['best_latency_us']:,.1f} µs"
                if target.get("best_latency_us") else "—")
    c[3].metric("Speedup" + tag, f"{target['speedup']:.3g}×" if target.get("speedup") else "—")
    c[4].metric("Experiments", f"{len(mine)} ({int((mine['state'] == 'kept').sum())} kept)")


def _diff(a: dict, b: dict, family: str) -> None:
    st.subheader(f"Code: #{a['seq']} → #{b['seq']}")
    mode = st.radio("Diff", ("unified", "side by side"), key="k_diffmode", horizontal=True,
                    label_visibility="collapsed")
    old, new = a["source"].splitlines(), b["source"].splitlines()
    if a["id"] == b["id"]:
        st.caption("A and B are the same experiment: its source is below.")
        st.code(a["source"], language="python")
    elif mode == "unified":
        diff = "\n".join(difflib.unified_diff(old, new, f"#{a['seq']} ({a['state']})",
                                              f"#{b['seq']} ({b['state']})", lineterm="", n=3))
        st.code(diff or "(identical sources)", language="diff")
    else:
        table = difflib.HtmlDiff(wrapcolumn=70).make_table(
            old, new, f"#{a['seq']}", f"#{b['seq']}", context=True, numlines=3)
        st.html(f"<style>{DIFF_CSS}</style><div class='nsdiff'>{table}</div>")
    with st.expander(f"Full source of #{b['seq']}"):
        st.code(b["source"], language="python")
    with st.expander(f"The eager reference ({family}) every candidate is timed and checked "
                     "against"):
        st.code(_reference_source(family), language="python")


DIFF_CSS = """
.nsdiff table.diff {font-family: ui-monospace, Menlo, monospace; font-size: 12px;
  border-collapse: collapse; width: 100%;}
.nsdiff td {padding: 0 4px; vertical-align: top; white-space: pre-wrap;}
.nsdiff .diff_header {color: #888; text-align: right;}
.nsdiff .diff_next {display: none;}
.nsdiff .diff_add {background: #e6ffec;} .nsdiff .diff_chg {background: #fff5b1;}
.nsdiff .diff_sub {background: #ffebe9;}
"""


def _reference_source(family: str) -> str:
    try:
        import kernels
        return inspect.getsource(kernels.get(family).reference)
    except Exception as e:  # a family recorded elsewhere that this checkout has no file for
        return f"# not available here: {type(e).__name__}: {e}"


def _shapes(target, best, a, b, interpreter) -> None:
    st.subheader("Per shape")
    chosen = {"best": best} if best else {}
    chosen.update({f"A #{a['seq']}": a, f"B #{b['seq']}": b})
    df = data.shape_frame(target, chosen)
    tag = " (interpreter)" if interpreter else ""
    cfg = {"eager_us": st.column_config.NumberColumn("eager µs" + tag, format="%.1f"),
           "sol_us": st.column_config.NumberColumn("speed of light µs", format="%.1f")}
    for col in df.columns:
        if col.endswith(" us"):
            cfg[col] = st.column_config.NumberColumn(col[:-3] + " µs" + tag, format="%.1f")
        elif col.endswith(" speedup"):
            cfg[col] = st.column_config.NumberColumn(col + tag, format="%.3g×")
        elif col.endswith("% SOL"):
            cfg[col] = st.column_config.NumberColumn(col, format="%.1f%%")
    st.dataframe(df, hide_index=True, key="k_shapes", column_config=cfg, placeholder="—")
    st.caption(f"dtype {target['dtype']}; calls = times the model runs this shape per forward "
               "pass. Each time is one call's median.")


def _roofline(run, target, best, a, b, interpreter) -> None:
    st.subheader("Roofline")
    ceil = run.get("ceilings") or {}
    if interpreter or not ceil.get("copy_gbps"):
        st.info("No roofline for this run: it ran under Triton's CPU interpreter, so there is no "
                "measured memory or compute roof and its times are not GPU performance.")
        return
    pts = [("eager", r["shape"], r["us"]) for r in (target.get("ref_shape_times") or [])]
    seen = set()
    for label, exp in (("best", best), (f"A #{a['seq']}", a), (f"B #{b['seq']}", b)):
        if exp is None or exp["id"] in seen:
            continue
        seen.add(exp["id"])
        name = label if label == "best" else label + (" (best)" if best and exp["id"] ==
                                                      best["id"] else "")
        pts += [(name, r["shape"], r["us"]) for r in (exp.get("shape_times") or [])]
    points = data.roofline_frame(target["family"], target["dtype"], pts)
    if points.empty:
        st.info(f"No roofline: this checkout has no cost model for {target['family']}.")
        return
    st.plotly_chart(charts.roofline_figure(
        points, float(ceil["copy_gbps"]), ceil.get("matmul_tflops"),
        title=f"{target['family']} on {data.device_label(run)}: roofs measured at run start"),
        key="k_roofline")
    st.caption("x: the family's minimum flops over minimum bytes moved at each shape; y: those "
               "flops over the measured time. A memory-bound kernel at the copy roof moves its "
               "bytes as fast as the device copies memory.")


def _verifier(a, b, ver) -> None:
    st.subheader("Verifier, stage by stage")
    for tab, (label, exp) in zip(st.tabs([f"A #{a['seq']}", f"B #{b['seq']}"]),
                                 (("A", a), ("B", b))):
        with tab:
            state = exp["state"] + (f" at {exp['failed_stage']}" if exp.get("failed_stage") else "")
            st.markdown(f"**#{exp['seq']} {state}** · {exp['hypothesis']}")
            where = data.worker_note(exp)
            if where:
                st.caption(where[0].upper() + where[1:] + ".")
            if exp.get("error"):
                st.code(exp["error"], language="text")
            st.dataframe(ver[label], hide_index=True, key=f"k_ver_{label}", placeholder="—",
                         column_config={
                "worst_error": st.column_config.NumberColumn("worst error", format="%.3g"),
                "failed_case": st.column_config.TextColumn("failed case"),
                "detail": st.column_config.TextColumn("detail", width="large"),
                "duration_s": st.column_config.NumberColumn("s", format="%.2f")})


if __name__ == "__main__":  # run as a page by st.navigation (streamlit_app.py)
    page()
