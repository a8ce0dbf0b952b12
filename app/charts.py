"""Plotly figure builders: pure functions from pandas DataFrames (as app/data.py makes them) to
go.Figure. No Streamlit and no database here, so each chart is unit-testable on its own.

Every figure sets a constant ``uirevision``: the page redraws the charts every refresh, and a
constant uirevision tells plotly.js to keep the user's zoom, pan and legend toggles across redraws.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.data import INTERPRETER_LABEL, stage_order

STATE_STYLE = {  # experiment state -> (colour, marker symbol)
    "kept": ("#2ca02c", "circle"),
    "reverted": ("#ff7f0e", "circle-open"),
    "failed": ("#d62728", "x"),
}
STATUS_COLOURS = {"passed": "#2ca02c", "failed": "#d62728", "skipped": "#b0b0b0",
                  "slower": "#9ecae1"}
# "slower": not run because the candidate, timed after its smoke test, did not beat the best
STATUS_NAMES = {"slower": "not run (slower)"}
BEST_COLOUR = "#1f77b4"
# one colour per run on the Compare page (Streamlit's theme would give every run a shade of blue)
RUN_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _title(text: str, interpreter: bool) -> dict:
    # The interpreter label goes into the chart itself, not only the page, so a screenshot of
    # a chart can never pass interpreter numbers off as GPU performance.
    if interpreter:
        text += f"<br><sup>{INTERPRETER_LABEL}</sup>"
    return dict(text=text, x=0, xanchor="left")


def _empty(fig: go.Figure, message: str) -> go.Figure:
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color="#888"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _seq_ticks(max_seq) -> dict:
    """Whole-number ticks for experiment seq (plotly would put ticks at 0.5 for short runs)."""
    max_seq = int(max_seq) if pd.notna(max_seq) else 1
    return dict(tick0=0, dtick=max(1, math.ceil(max_seq / 10)))


def _ratio_range(series) -> list[float]:
    """A y range for end-to-end speedups: around 1x and every value, with a little room.

    Not from zero: a projection moving from 1.00x to 1.08x must be visible, not a flat line."""
    vals = [float(v) for s in series for v in s if pd.notna(v) and math.isfinite(float(v))]
    lo, hi = min(vals + [1.0]), max(vals + [1.0])
    pad = max(0.02, (hi - lo) * 0.12)
    return [lo - pad, hi + pad]


def _short(text, n: int = 90) -> str:
    text = "" if text is None or (isinstance(text, float) and pd.isna(text)) else str(text)
    text = text.strip().splitlines()[0] if text.strip() else ""
    return text if len(text) <= n else text[: n - 1] + "…"


def _short_series(texts: pd.Series, n: int = 90) -> pd.Series:
    """_short over a whole column at once (string methods, no Python loop per row)."""
    t = texts.fillna("").astype(str).str.strip().str.split("\n", n=1).str[0].fillna("")
    return t.where(t.str.len() <= n, t.str.slice(0, n - 1) + "…")


def speedup_figure(exps: pd.DataFrame, best: pd.DataFrame, interpreter: bool = False) -> go.Figure:
    """Per-kernel speedup over experiments, one facet per family, on a log axis.

    exps: experiments (seq, family, state, speedup, failed_stage, hypothesis, error);
    best: data.best_so_far(exps) (family, seq, best). Each facet has the best-so-far step line,
    a marker per experiment coloured by state, and the reference baseline at 1x.

    The axis is logarithmic because speedups are ratios (2x and 0.5x are equally far from 1x)
    and because interpreter runs sit orders of magnitude below 1x. Failed experiments have no
    valid speedup: their markers sit on a floor line under every real value, and the hover
    names the verifier stage that failed."""
    families = sorted(exps["family"].dropna().unique()) if not exps.empty else []
    if not families:
        fig = _empty(go.Figure(), "no experiments yet")
        fig.update_layout(title=_title("Per-kernel speedup", interpreter), height=300,
                          uirevision="speedup")
        return fig

    valid = exps["speedup"].astype(float)
    valid = valid[valid > 0]
    lo = min(float(valid.min()), 1.0) if len(valid) else 1.0
    hi = max(float(valid.max()), 1.0) if len(valid) else 1.0
    floor = lo / 2  # where failed experiments are drawn: below everything that has a speedup
    # one y range for every facet, so families compare at a glance (log axis range is in log10)
    y_range = [math.log10(floor) - 0.15, math.log10(hi) + 0.15]

    n = len(families)
    height = 170 * n + 170
    # ~50 px between facets whatever their number (the spacing is a fraction of the plot area)
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, subplot_titles=families,
                        vertical_spacing=min(0.3, 50 / (height - 180)))
    shown: set[str] = set()  # one legend entry per trace kind, not per facet
    # Hover texts for every experiment at once, as one string each: plotly validates a numpy
    # array of strings in one step, where a list of per-point tuples (customdata) or a pandas
    # Series costs it a Python loop; at 10,000 experiments that is most of a refresh.
    hyp = _short_series(exps["hypothesis"])
    failed_text = ("<b>failed at " + exps["failed_stage"].fillna("?").astype(str) + "</b><br>"
                   + hyp + "<br>" + _short_series(exps["error"]))
    hover_all = hyp.where(exps["state"] != "failed", failed_text)
    seq_all, spd_all = exps["seq"].to_numpy(), exps["speedup"].astype(float).to_numpy()
    fam_all, state_all = exps["family"].to_numpy(), exps["state"].to_numpy()
    hover_np = hover_all.to_numpy()
    best_by = {f: g.sort_values("seq") for f, g in best.groupby("family")}
    traces, rows = [], []  # added in one call: one add_trace per trace costs ~3 ms each
    for row, fam in enumerate(families, start=1):
        in_fam = fam_all == fam
        fb = best_by.get(fam, best.iloc[:0])
        traces.append(go.Scatter(
            x=fb["seq"].to_numpy(), y=fb["best"].astype(float).to_numpy(), mode="lines",
            line=dict(shape="hv", color=BEST_COLOUR, width=2),
            name="best so far", legendgroup="best", showlegend="best" not in shown,
            hovertemplate="seq %{x}<br>best so far %{y:.3g}×<extra>" + fam + "</extra>",
            _validate=False))
        rows.append(row)
        shown.add("best")
        for state, (colour, symbol) in STATE_STYLE.items():
            sel = in_fam & (state_all == state)
            if not sel.any():
                continue
            y = spd_all[sel]
            if state == "failed":
                y = np.where(y > 0, y, floor)
                hover = "seq %{x}: %{hovertext}<extra>" + fam + "</extra>"
            else:
                hover = ("seq %{x}: <b>" + state + "</b> %{y:.3g}×<br>%{hovertext}"
                         "<extra>" + fam + "</extra>")
            # _validate=False: plotly's per-property checks cost more than the whole rest of
            # a refresh at 10,000 points, and these traces are built here from known columns
            traces.append(go.Scatter(
                x=seq_all[sel], y=y, mode="markers", name=state, legendgroup=state,
                showlegend=state not in shown, hovertext=hover_np[sel],
                hovertemplate=hover,
                marker=dict(color=colour, symbol=symbol, size=9,
                            line=dict(width=2 if symbol != "circle" else 0, color=colour)),
                _validate=False))
            rows.append(row)
            shown.add(state)
    fig.add_traces(traces, rows=rows, cols=[1] * len(rows))
    # The reference at 1x in every facet, and one y axis setting for all: made in one call each
    # (per-facet add_hline / update_yaxes calls cost more than the traces at a few facets).
    fig.update_layout(shapes=[
        dict(type="line", xref=f"x{r if r > 1 else ''} domain", x0=0, x1=1,
             yref=f"y{r if r > 1 else ''}", y0=1.0, y1=1.0,
             line=dict(color="#888", dash="dash", width=1)) for r in range(1, n + 1)])
    # plain numbers at each decade (or 1-2-5 steps within one), not 10^-1 with minor labels
    fig.update_yaxes(title_text="speedup ×", type="log", range=y_range, tickformat="~g",
                     dtick=1 if y_range[1] - y_range[0] > 2 else "D2")
    fig.update_xaxes(**_seq_ticks(exps["seq"].max()))
    fig.update_xaxes(title_text="experiment seq", row=n, col=1)
    sub = "dashed: reference 1×" + ("; failed at the bottom" if (exps["state"] == "failed").any()
                                    else "")
    fig.update_layout(title=_title(f"Per-kernel speedup ({sub})", interpreter),
                      height=height, margin=dict(t=90, b=90, l=60, r=20),
                      # in the bottom margin, whatever the number of facets
                      legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"),
                      hovermode="closest", uirevision="speedup")
    return fig


def amdahl_figure(proj: pd.DataFrame, limit: float | None = None,
                  interpreter: bool = False, measured: pd.DataFrame | None = None) -> go.Figure:
    """Projected end-to-end speedup over experiments: data.amdahl_projection as a step line.

    limit: the Amdahl ceiling 1 / (1 - Σf), what the model would gain if every targeted kernel
    took no time at all; drawn when finite, so the projection is read against what is possible.
    measured: data.e2e_frame (seq, speedup, label): end-to-end speedups measured with the kept
    kernels swapped in, drawn as diamonds over the projection when there are any."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=proj["seq"], y=proj["projected"], mode="lines+markers",
        line=dict(shape="hv", width=2, color=BEST_COLOUR),
        marker=dict(size=5), name="projected (Amdahl)", customdata=proj["family"].fillna("—"),
        hovertemplate="after seq %{x} (%{customdata})<br>projected %{y:.3f}×<extra></extra>"))
    has_measured = measured is not None and not measured.empty
    if has_measured:
        fig.add_trace(go.Scatter(
            x=measured["seq"], y=measured["speedup"].astype(float), mode="markers",
            name="measured", marker=dict(symbol="diamond", size=11, color="#2ca02c",
                                         line=dict(width=1, color="#145214")),
            customdata=measured["label"].fillna("").astype(str),
            hovertemplate="measured after seq %{x}: %{y:.3f}× %{customdata}<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#888", dash="dash", width=1))
    if limit is not None and 1.005 < limit < float("inf"):  # (at ~1x it would hide the baseline)
        fig.add_hline(y=limit, line=dict(color="#9467bd", dash="dot", width=1),
                      annotation_text=f"Amdahl limit {limit:.2f}×",
                      annotation_position="bottom right")
    title = ("End-to-end speedup: projected (Amdahl) and measured" if has_measured
             else "Projected end-to-end speedup (Amdahl)")
    fig.update_layout(title=_title(title, interpreter),
                      xaxis_title="experiment seq", yaxis_title="model speedup ×", height=320,
                      margin=dict(t=70, b=40, l=60, r=20), showlegend=has_measured,
                      legend=dict(orientation="h", x=1, xanchor="right", y=1.02, yanchor="bottom"),
                      uirevision="amdahl")
    values = [proj["projected"]] + ([measured["speedup"].astype(float)] if has_measured else [])
    if limit is not None and limit < float("inf"):
        values.append(pd.Series([limit]))
    fig.update_yaxes(range=_ratio_range(values))
    fig.update_xaxes(**_seq_ticks(proj["seq"].max()))
    return fig


def stage_figure(outcomes: pd.DataFrame) -> go.Figure:
    """Verifier outcomes per stage: stacked passed / failed / skipped / slower counts, stages in
    order (slower: stages bench-first did not run for a candidate that lost on time).

    outcomes: data.stage_outcomes_frame (stage, status, n)."""
    fig = go.Figure()
    stages = stage_order(outcomes)
    counts = (outcomes.pivot_table(index="stage", columns="status", values="n", aggfunc="sum")
              .reindex(stages).fillna(0) if not outcomes.empty else pd.DataFrame(index=stages))
    for status, colour in STATUS_COLOURS.items():
        y = counts[status] if status in counts else pd.Series(0, index=stages)
        name = STATUS_NAMES.get(status, status)
        fig.add_trace(go.Bar(x=stages, y=y.astype(int), name=name, marker_color=colour,
                             hovertemplate="%{x}: %{y} " + name + "<extra></extra>"))
    fig.update_layout(barmode="stack", title=dict(text="Verifier outcomes per stage", x=0),
                      yaxis_title="experiments", height=340, margin=dict(t=60, b=80, l=60, r=20),
                      legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"),
                      uirevision="stages")
    return fig


# ---- one target: roofline ---------------------------------------------------------------------
ROOFLINE_COLOURS = {"eager": "#7f7f7f", "best": "#1f77b4"}
ROOFLINE_SYMBOLS = ("circle", "diamond", "square", "triangle-up", "star", "cross")


def roofline_figure(points: pd.DataFrame, copy_gbps: float, matmul_tflops: float | None,
                    title: str = "Roofline") -> go.Figure:
    """Achieved FLOP/s against arithmetic intensity (flop/byte), under the machine's roofs.

    points: data.roofline_frame (label, shape, intensity, flops_per_s, bytes_per_s, us), one
    marker per (label, shape). Roofs are the ones the run measured at its start: the memory roof
    copy_gbps · intensity (the device-to-device copy rate, bytes read + written per second) and
    the compute roof matmul_tflops (a bf16 matmul; vector ops like norms cannot use it, so for
    them it only marks where the memory roof would stop mattering). Log-log, as rooflines are."""
    fig = go.Figure()
    bw = copy_gbps * 1e9
    peak = matmul_tflops * 1e12 if matmul_tflops else None
    xs = points["intensity"].dropna().astype(float) if not points.empty else pd.Series(dtype=float)
    lo = min([0.05] + [x / 4 for x in xs if x > 0])
    ridge = peak / bw if peak else None
    hi = max([x * 4 for x in xs] + [ridge * 4 if ridge else 100.0])
    roof_x = [lo, ridge, hi] if ridge else [lo, hi]
    roof_y = [min(bw * x, peak) if peak else bw * x for x in roof_x]
    fig.add_trace(go.Scatter(
        x=roof_x, y=roof_y, mode="lines", line=dict(color="#444", width=2), name="measured roofs",
        hovertemplate="%{y:.3s}FLOP/s at %{x:.3g} flop/byte<extra>roof</extra>"))
    fig.add_annotation(x=math.log10(lo * 1.5), y=math.log10(bw * lo * 1.5), xref="x", yref="y",
                       text=f"copy {copy_gbps:,.0f} GB/s", showarrow=False, yshift=14,
                       textangle=0, xanchor="left", font=dict(size=11, color="#444"))
    if peak:
        fig.add_annotation(x=math.log10(hi), y=math.log10(peak), xref="x", yref="y",
                           text=f"bf16 matmul {matmul_tflops:,.0f} TFLOP/s", showarrow=False,
                           yshift=10, xanchor="right", font=dict(size=11, color="#444"))
    labels = list(dict.fromkeys(points["label"])) if not points.empty else []
    for i, label in enumerate(labels):
        p = points[points["label"] == label]
        colour = ROOFLINE_COLOURS.get(label.split(" ")[0], None)
        pct = 100 * p["bytes_per_s"] / bw
        fig.add_trace(go.Scatter(
            x=p["intensity"], y=p["flops_per_s"], mode="markers", name=label,
            marker=dict(size=12, symbol=ROOFLINE_SYMBOLS[i % len(ROOFLINE_SYMBOLS)],
                        color=colour, line=dict(width=1, color="#222")),
            customdata=list(zip(p["shape"], p["us"], p["bytes_per_s"] / 1e9, pct)),
            hovertemplate=("%{customdata[0]}: %{customdata[1]:.1f} µs<br>%{y:.3s}FLOP/s, "
                           "%{customdata[2]:,.0f} GB/s = %{customdata[3]:.0f}% of the copy roof"
                           "<extra>" + label + "</extra>")))
    fig.update_xaxes(type="log", title_text="arithmetic intensity (flop / byte)")
    fig.update_yaxes(type="log", title_text="achieved FLOP/s", tickformat="~s")
    fig.update_layout(title=dict(text=title, x=0), height=420, margin=dict(t=60, b=50, l=70, r=20),
                      legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"),
                      uirevision="roofline")
    return fig


# ---- runs: best per family, and several runs side by side --------------------------------------
def family_speedup_figure(summary: pd.DataFrame, interpreter: bool = False,
                          title: str = "Best kernel per family: speedup over eager") -> go.Figure:
    """One bar per family: the best kept kernel's speedup over the eager reference (log axis,
    baseline 1x); the hover tells the share of model time and % of speed of light.

    summary: data.target_summary (family, fraction, speedup, pct_sol, best_us, eager_us)."""
    fig = go.Figure()
    s = summary.dropna(subset=["speedup"]) if not summary.empty else summary
    if s.empty:
        fig = _empty(fig, "no kept kernel yet")
    else:
        fig.add_trace(go.Bar(
            x=s["family"], y=s["speedup"].astype(float), marker_color=BEST_COLOUR,
            text=[f"{v:.3g}×" for v in s["speedup"]], textposition="outside",
            customdata=list(zip(s["fraction"].fillna(0) * 100, s["pct_sol"].fillna(-1))),
            hovertemplate="%{x}: %{y:.3g}× eager<br>%{customdata[0]:.1f}% of model time"
                          "<extra></extra>"))
        fig.add_hline(y=1.0, line=dict(color="#888", dash="dash", width=1))
        fig.update_yaxes(type="log", tickformat="~g", title_text="speedup ×")
    fig.update_layout(title=_title(title, interpreter), height=340, showlegend=False,
                      margin=dict(t=70, b=40, l=60, r=20), uirevision="family_speedup")
    return fig


def compare_speedup_figure(rows: pd.DataFrame) -> go.Figure:
    """Per-family best speedups of several runs side by side: grouped bars, one colour per run.

    rows: run (label), family, speedup, interpreter (bool). Interpreter runs are hatched and
    say so in the legend: their speedups only compare candidates with each other."""
    fig = go.Figure()
    rows = rows.dropna(subset=["speedup"]) if not rows.empty else rows
    if rows.empty:
        fig = _empty(fig, "no kept kernel in these runs")
    for i, run in enumerate(dict.fromkeys(rows["run"]) if not rows.empty else []):
        r = rows[rows["run"] == run]
        interp = bool(r["interpreter"].any())
        fig.add_trace(go.Bar(
            x=r["family"], y=r["speedup"].astype(float),
            name=run + (" (interpreter timing)" if interp else ""),
            marker_color=RUN_COLOURS[i % len(RUN_COLOURS)],
            marker_pattern_shape="/" if interp else "",
            text=[f"{v:.3g}×" for v in r["speedup"]], textposition="outside",
            hovertemplate="%{x}: %{y:.3g}×<extra>" + run + "</extra>"))
    if not rows.empty:
        fig.add_hline(y=1.0, line=dict(color="#888", dash="dash", width=1))
        fig.update_yaxes(type="log", tickformat="~g", title_text="best speedup over eager ×")
    fig.update_layout(barmode="group", title=dict(text="Per-family speedup by run", x=0),
                      height=400, margin=dict(t=60, b=40, l=60, r=20),
                      legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"),
                      uirevision="compare_speedup")
    return fig


def compare_projection_figure(curves: dict[str, pd.DataFrame]) -> go.Figure:
    """The Amdahl projection over experiments of several runs, one step line each."""
    fig = go.Figure()
    for i, (run, proj) in enumerate(curves.items()):
        fig.add_trace(go.Scatter(
            x=proj["seq"], y=proj["projected"], mode="lines",
            line=dict(shape="hv", width=2, color=RUN_COLOURS[i % len(RUN_COLOURS)]),
            name=run, hovertemplate="after seq %{x}: %{y:.3f}×<extra>" + run + "</extra>"))
    fig.add_hline(y=1.0, line=dict(color="#888", dash="dash", width=1))
    fig.update_layout(title=dict(text="Projected end-to-end speedup (Amdahl) over experiments",
                                 x=0),
                      xaxis_title="experiment seq", yaxis_title="model speedup ×", height=360,
                      margin=dict(t=60, b=40, l=60, r=20),
                      legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"),
                      uirevision="compare_projection")
    fig.update_yaxes(range=_ratio_range([p["projected"] for p in curves.values()]))
    return fig


# ---- evaluation workers -----------------------------------------------------------------------
def workers_figure(exps: pd.DataFrame, workers: list[str],
                   reference: str | None = None) -> go.Figure:
    """Experiments per evaluation worker, stacked by outcome (kept / reverted / failed).

    exps: experiments with worker and state; workers: the run's worker names in display order
    (a worker with no experiment yet, such as a reference kept busy re-timing, gets an empty
    bar rather than vanishing). Counts, not timings: no interpreter label is needed."""
    fig = go.Figure()
    if exps.empty or "worker" not in exps:
        counts = pd.Series(dtype=int)
    else:
        counts = exps.groupby(["worker", "state"]).size()
    names = [f"{w} (ref)" if w == reference else w for w in workers]
    for state, (colour, _) in STATE_STYLE.items():
        fig.add_trace(go.Bar(
            x=names, y=[int(counts.get((w, state), 0)) for w in workers], name=state,
            marker_color=colour, hovertemplate="%{x}: %{y} " + state + "<extra></extra>"))
    fig.update_layout(barmode="stack", title=dict(text="Experiments per worker", x=0),
                      yaxis_title="experiments", height=300, margin=dict(t=50, b=70, l=60, r=20),
                      legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"),
                      uirevision="workers")
    fig.update_yaxes(rangemode="tozero", tickformat="d")
    return fig
