"""The "Kernels" page: one target (run + target id) up close.

Baseline against best, or any two experiments, as a code diff; per-shape times against the eager
reference; a roofline under the roofs the run measured on its machine; what the verifier said at
each stage; the parameter analysis (parallel coordinates of the experiments from their search
point to their speedup, speedup against each parameter, a simple importance ranking); the
history against wall-clock time with the run's experiments per hour; and the kernels' sources
as files. The baseline is the target's first experiment (the search proposer's starter); the
eager PyTorch reference it is timed against is shown beside it.

The target is chosen by id (a family may be two targets under two contracts), and the target
and the two experiments compared are in the URL (target, a, b: app/view.py).
"""
from __future__ import annotations

import difflib
import inspect
import io
import re
import zipfile

import pandas as pd
import streamlit as st

from app import charts, data, fmt, view
from app.shared import plot, run_header, selected_store


def page() -> None:
    st.title("Kernels")
    opened = selected_store()
    if opened is None:
        return
    store, run_id, db_path = opened
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
        target = _pick_target(targets)
        mine = exps[exps["target_id"] == target["id"]].sort_values("seq")
        if mine.empty:
            view.set_page(target=target["id"])
            st.info(f"No experiment on {data.target_names([target])[target['id']]} yet.")
            return
        a_id, b_id = _pick_two(mine, target)
        a, b = data.experiment(store, a_id), data.experiment(store, b_id)
        view.set_page(target=target["id"], a=a["seq"], b=b["seq"])
        best = data.experiment(store, target["best_experiment_id"]) \
            if target.get("best_experiment_id") else None
        ver = {label: data.verifications_frame(store, e["id"]) for label, e in
               (("A", a), ("B", b))}
        pf, params, fixed = data.params_frame(store, run_id, target["id"])
    finally:
        store.close()

    _metrics(target, mine, interpreter)
    _diff(a, b, target["family"])
    _downloads(run, target, best, a, b, db_path)
    _shapes(target, best, a, b, interpreter)
    _roofline(run, target, best, a, b, interpreter)
    _verifier(a, b, ver)
    _parameters(pf, params, fixed, interpreter)
    _over_time(pf, exps)


def _pick_target(targets: list[dict]) -> dict:
    """The target selector, by id; a link's target (url_target) is applied before it is drawn."""
    ss = st.session_state
    by_id = {int(t["id"]): t for t in targets}
    names = data.target_names(targets)
    asked = ss.pop("url_target", None)
    if asked in by_id:
        ss["k_target"] = asked
    if ss.get("k_target") not in by_id:
        ss["k_target"] = next(iter(by_id))      # the largest share of model time first

    def label(tid: int) -> str:
        t = by_id[tid]
        b = data.baselines(t)
        best = f" · best {fmt.ratio(b['vs_eager'])} vs eager" if b["vs_eager"] else ""
        return f"{names[tid]} · {fmt.share(t['fraction'])} of model time{best}"

    tid = st.selectbox("Target", list(by_id), key="k_target", format_func=label)
    return by_id[tid]


def _label(row) -> str:
    spd = f" {fmt.ratio(row.speedup)}" if pd.notna(row.speedup) else ""
    stage = f"@{row.failed_stage}" if isinstance(row.failed_stage, str) else ""
    return f"#{int(row.seq)} {row.state}{stage}{spd} · {str(row.hypothesis)[:60]}"


def _pick_two(mine: pd.DataFrame, target: dict) -> tuple[int, int]:
    """Two experiment selectors, defaulting to baseline (first) and best (or latest); a link's
    a / b (by seq: url_a, url_b) win over the defaults."""
    ss = st.session_state
    ids = mine["id"].astype(int).tolist()
    by_seq = dict(zip(mine["seq"].astype(int), ids))
    labels = {int(r.id): _label(r) for r in mine.itertuples()}
    base = ids[0]
    best = int(target["best_experiment_id"]) if target.get("best_experiment_id") in ids \
        else ids[-1]
    if best == base and len(ids) > 1:
        # nothing beat the baseline: a diff of it with itself says nothing, the latest try does
        st.caption("The baseline is still the best kernel of this target: B starts at the "
                   "latest experiment.")
        best = ids[-1]
    for key, default in (("k_a", base), ("k_b", best)):
        asked = by_seq.get(ss.pop(f"url_{key[-1]}", None))
        if asked is not None:
            ss[key] = asked
        # a stale choice (another target's experiment) is reset before the widget renders
        if ss.get(key) not in ids:
            ss[key] = default
    c1, c2 = st.columns(2)
    a = c1.selectbox("A (default: baseline, the first experiment)", ids, key="k_a",
                     format_func=labels.get)
    b = c2.selectbox("B (default: the best kept)", ids, key="k_b", format_func=labels.get)
    return a, b


def _metrics(target: dict, mine: pd.DataFrame, interpreter: bool) -> None:
    tag = " (interpreter)" if interpreter else ""
    b = data.baselines(target)
    # two rows of three: at six across, "not timed" and "128 (4 kept)" were cut
    c = st.columns(3) + st.columns(3)
    c[0].metric("Share of model time", fmt.share(target["fraction"]))
    c[1].metric("Eager / forward" + tag, fmt.us(b["eager_us"]))
    c[2].metric("torch.compile / forward" + tag,
                fmt.us(b["compile_us"]) if b["compile_us"] else "not timed")
    c[3].metric("Best / forward" + tag, fmt.us(b["best_us"]))
    with c[4].container(key="k_speedup"):
        st.metric("Best vs " + b["base"] + tag, fmt.ratio(b["vs_base"]),
                  delta="slower" if b["slower"] else ("faster" if b["vs_base"] else None),
                  delta_color="inverse" if b["slower"] else "normal",
                  delta_arrow="down" if b["slower"] else "up",
                  help="Against the faster of eager and torch.compile, where both were timed.")
    c[5].metric("Experiments", f"{len(mine)} ({int((mine['state'] == 'kept').sum())} kept)")
    if b["slower"]:
        st.warning(f"The best kept kernel is {b['verdict']}: the loop kept it as its best try, "
                   "but it does not beat what PyTorch already does here.",
                   icon=":material/trending_down:")


DIFF_LINES_INLINE = 60   # sources longer than this get a scrolling box of DIFF_HEIGHT_PX
DIFF_HEIGHT_PX = 560


def _diff(a: dict, b: dict, family: str) -> None:
    st.subheader(f"Code: #{a['seq']} → #{b['seq']}")
    mode = st.radio("Diff", ("unified", "side by side"), key="k_diffmode", horizontal=True,
                    label_visibility="collapsed")
    old, new = a["source"].splitlines(), b["source"].splitlines()
    # a long diff scrolls in its own box, so the page below it stays within reach
    box = st.container(height=DIFF_HEIGHT_PX, key="k_diff") \
        if max(len(old), len(new)) > DIFF_LINES_INLINE else st.container(key="k_diff")
    with box:
        if a["id"] == b["id"]:
            st.caption("A and B are the same experiment: its source is below.")
            st.code(a["source"], language="python")
        elif mode == "unified":
            diff = "\n".join(difflib.unified_diff(old, new, f"#{a['seq']} ({a['state']})",
                                                  f"#{b['seq']} ({b['state']})", lineterm="",
                                                  n=3))
            st.code(diff or "(identical sources)", language="diff", wrap_lines=True)
        else:
            table = difflib.HtmlDiff(wrapcolumn=60).make_table(
                old, new, f"#{a['seq']}", f"#{b['seq']}", context=True, numlines=3)
            with st.container(key="k_sbs"):
                st.html(f"<style>{DIFF_CSS}</style><div class='nsdiff'>{table}</div>")
    with st.expander(f"Full source of #{b['seq']}"):
        st.code(b["source"], language="python")
    with st.expander(f"The eager reference ({family}) every candidate is timed and checked "
                     "against"):
        st.code(_reference_source(family), language="python")


# The side-by-side diff: difflib's table, made to fit its column (fixed layout, cells that wrap:
# difflib marks them nowrap) and to read in light and dark themes (translucent highlights, the
# page's own text colour).
DIFF_CSS = """
.nsdiff {max-width: 100%; overflow-x: auto;}
.nsdiff table.diff {font-family: ui-monospace, Menlo, monospace; font-size: 12px;
  border-collapse: collapse; width: 100%; table-layout: fixed;}
.nsdiff table.diff colgroup:nth-of-type(1), .nsdiff table.diff colgroup:nth-of-type(4) {width: 0;}
.nsdiff table.diff colgroup:nth-of-type(2),
.nsdiff table.diff colgroup:nth-of-type(5) {width: 3.2em;}
.nsdiff td {padding: 0 4px; vertical-align: top; white-space: pre-wrap !important;
  overflow-wrap: anywhere; word-break: break-all;}
.nsdiff td.diff_header {opacity: .6; text-align: right;}
.nsdiff th {text-align: left; padding: 2px 4px; overflow-wrap: anywhere;}
.nsdiff .diff_next {padding: 0; font-size: 0; overflow: hidden;}
.nsdiff .diff_add {background: rgba(46,160,67,.28);}
.nsdiff .diff_chg {background: rgba(210,153,34,.30);}
.nsdiff .diff_sub {background: rgba(248,81,73,.28);}
"""


def _reference_source(family: str) -> str:
    try:
        import kernels
        return inspect.getsource(kernels.get(family).reference)
    except Exception as e:  # a family recorded elsewhere that this checkout has no file for
        return f"# not available here: {type(e).__name__}: {e}"


def _file_stem(run: dict, family: str, exp: dict) -> str:
    model = re.sub(r"[^A-Za-z0-9._-]+", "-", run["model"]).strip("-")[:40]
    return f"{model}-{family}-{run['id']}-seq{exp['seq']}"


def _all_best_zip(db_path: str, run_id: str) -> bytes:
    """Every target's best kept kernel of the run, one .py per target, in one zip."""
    store = data.open_store(db_path)
    buf = io.BytesIO()
    try:
        run = data.get_run(store, run_id)
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for t in data.targets(store, run_id):
                if t.get("best_experiment_id"):
                    e = data.experiment(store, t["best_experiment_id"])
                    z.writestr(f"{_file_stem(run, t['family'], e)}.py", e["source"])
    finally:
        store.close()
    return buf.getvalue()


def _downloads(run, target, best, a, b, db_path) -> None:
    """The kernels as files: the target's best, A and B, and every target's best in a zip.
    Each file is one self-contained candidate (kernel_fn plus its Triton kernel)."""
    row = st.container(horizontal=True, key="k_downloads")
    fam = target["family"]
    for label, exp, key in (("Best kernel", best, "k_dl_best"), (f"A #{a['seq']}", a, "k_dl_a"),
                            (f"B #{b['seq']}", b, "k_dl_b")):
        if exp is None:
            continue
        row.download_button(f"{label} (.py)", data=exp["source"], on_click="ignore",
                            file_name=f"{_file_stem(run, fam, exp)}.py", mime="text/x-python",
                            key=key, icon=":material/download:")
    row.download_button("Every target's best (zip)", on_click="ignore", key="k_dl_all",
                        data=lambda: _all_best_zip(db_path, run["id"]),
                        file_name=f"nightshift-kernels-{run['id']}.zip",
                        mime="application/zip", icon=":material/folder_zip:")


def _shapes(target, best, a, b, interpreter) -> None:
    st.subheader("Per shape")
    chosen = {"best": best} if best else {}
    chosen.update({f"A #{a['seq']}": a, f"B #{b['seq']}": b})
    df = data.shape_frame(target, chosen)
    tag = " (interpreter)" if interpreter else ""
    cfg = {"eager_us": st.column_config.NumberColumn("eager µs / call" + tag, format="%.1f"),
           "sol_us": st.column_config.NumberColumn("speed of light µs / call", format="%.1f")}
    for col in df.columns:
        if col.endswith(" us"):
            cfg[col] = st.column_config.NumberColumn(col[:-3] + " µs / call" + tag, format="%.1f")
        elif col.endswith(" speedup"):
            cfg[col] = st.column_config.NumberColumn(
                col[: -len(" speedup")] + " vs eager" + tag,
                format=fmt.ratio_column_format(df[col]))
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
    points = data.roofline_frame(target["family"], target["dtype"], pts, target.get("spec"))
    if points.empty:
        st.info(f"No roofline: this checkout has no cost model for {target['family']}.")
        return
    dev = data.as_dict(run.get("device")).get("name") or "?"
    plot(charts.roofline_figure(
        points, float(ceil["copy_gbps"]), ceil.get("matmul_tflops"),
        title=f"{target['family']} on {dev}: roofs measured at run start"), "k_roofline")
    st.caption("x: the family's minimum flops over minimum bytes moved at each shape; y: those "
               "flops over the measured time of one call. A memory-bound kernel at the copy "
               "roof moves its bytes as fast as the device copies memory.")


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
                "stage": st.column_config.TextColumn("stage", width="small"),
                "worst_error": st.column_config.NumberColumn("worst error", format=fmt.ERROR_COL,
                                                             width="small"),
                "failed_case": st.column_config.TextColumn("failed case"),
                "detail": st.column_config.TextColumn("detail", width="large"),
                "duration_s": st.column_config.NumberColumn("s", format="%.2f", width="small")})


def _parameters(pf: pd.DataFrame, params: list[str], fixed: dict, interpreter: bool) -> None:
    """The parameter analysis of the target's experiments (the search points they tried)."""
    st.subheader("Parameters")
    if pf.empty or not params:
        st.info("No parameter varied across this target's experiments (the search records its "
                "point in each experiment; an LLM proposer's free-form kernels have none).")
        return
    if interpreter:
        st.caption("Interpreter timing: these speedups rank candidates of this run only.")
    with st.container(key="k_parcoords"):
        plot(charts.parcoords_figure(pf, params), "k_parcoords_chart")
    st.caption("Drag along an axis to pick a range: the lines through it stay lit. "
               + ("Fixed in every experiment: "
                  + ", ".join(f"{k}={v}" for k, v in fixed.items()) + "." if fixed else ""))
    left, right = st.columns([3, 1])
    with left:
        plot(charts.param_scatter_figure(pf, params), "k_param_scatter")
    with right:
        imp = data.param_importance(pf, params)
        plot(charts.importance_figure(imp), "k_importance")
        st.caption("How much of the spread of log speedup (timed experiments) each parameter's "
                   "value explains (η²). Descriptive: the search moves one parameter at a time "
                   "from the best, so parameters are confounded.")


def _over_time(pf: pd.DataFrame, exps: pd.DataFrame) -> None:
    st.subheader("Over time")
    bucket = data.throughput_bucket_s(exps["created_at"])
    plot(charts.time_figure(pf, exps, bucket), "k_time")
    created = pd.to_numeric(exps["created_at"], errors="coerce").dropna()
    span = float(created.max() - created.min()) if len(created) > 1 else 0.0
    rate = f"{(len(created) - 1) * 3600 / span:,.0f} experiments per hour over the run" \
        if span > 0 else "one experiment so far"
    st.caption(f"Throughput in buckets of {fmt.duration(bucket)}; {rate}.")


if __name__ == "__main__":  # run as a page by st.navigation (streamlit_app.py)
    page()
