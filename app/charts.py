"""Plotly figure builders: pure functions from pandas DataFrames (as app/data.py makes them) to
go.Figure. No Streamlit and no database here, so each chart is unit-testable on its own.

Rules every figure follows:
- A speedup is a ratio, drawn on a log axis centred on 1×; a bar starts at 1× and goes up for
  a kernel faster than its baseline, down for a slower one (a 0.735× kernel is a bar hanging
  below the 1× line, never a sliver rising from the bottom of the axis).
- Every figure sets a constant ``uirevision`` (plotly.js keeps zoom, pan and legend choices
  across redraws) and no colour that only works on one background: text and lines take the
  page's theme (light or dark), the few fixed colours are mid-tones readable on both.
- Titles are short (the page says the rest), so they fit a half-width column.
- A run has one colour on every page (run_colour).
"""
from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app import fmt
from app.data import INTERPRETER_LABEL, param_values, stage_order

STATE_STYLE = {  # experiment state -> (colour, marker symbol)
    "kept": ("#2ca02c", "circle"),
    "reverted": ("#ff7f0e", "circle-open"),
    "failed": ("#d62728", "x"),
}
STATUS_COLOURS = {"passed": "#2ca02c", "failed": "#d62728", "skipped": "#9a9a9a",
                  "slower": "#6baed6"}
# "slower": not run because the candidate, timed after its smoke test, did not beat the best
STATUS_NAMES = {"slower": "not run (slower)"}
BEST_COLOUR = "#1f77b4"
FASTER_COLOUR = "#2ca02c"   # a bar above 1×
SLOWER_COLOUR = "#d62728"   # a bar below 1×: slower than its baseline
COMPILE_COLOUR = "#9467bd"  # torch.compile's line: the baseline a kernel must also beat
GUIDE = "#8c8c8c"           # reference lines and notes: a mid grey, readable light and dark
# Run colours: a run keeps its colour on every page (hashed from its id)
RUN_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
               "#bcbd22", "#d62728", "#7f7f7f")


def run_colour(run_id: str) -> str:
    """The run's colour, the same on every page and in every export: a hash of its id."""
    return RUN_COLOURS[zlib.crc32(str(run_id).encode()) % len(RUN_COLOURS)]


def run_colours(run_ids: list[str]) -> dict[str, str]:
    """Colours for runs shown together: each its own run_colour, except that a run whose colour
    an earlier one (in id order) already has takes the next free one, so two runs side by side
    never share a colour."""
    out, used = {}, set()
    for rid in sorted(run_ids):
        base = RUN_COLOURS.index(run_colour(rid))
        for k in range(len(RUN_COLOURS)):
            c = RUN_COLOURS[(base + k) % len(RUN_COLOURS)]
            if c not in used or k == len(RUN_COLOURS) - 1:
                break
        out[rid] = c
        used.add(c)
    return {rid: out[rid] for rid in run_ids}


def _title(text: str, interpreter: bool) -> dict:
    # The interpreter label goes into the chart itself, not only the page, so a screenshot of
    # a chart can never pass interpreter numbers off as GPU performance.
    if interpreter:
        text += f"<br><sup>{INTERPRETER_LABEL}</sup>"
    return dict(text=text, x=0, xanchor="left")


def _empty(fig: go.Figure, message: str) -> go.Figure:
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color=GUIDE))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _seq_ticks(max_seq) -> dict:
    """Whole-number ticks for experiment seq (plotly would put ticks at 0.5 for short runs)."""
    max_seq = int(max_seq) if pd.notna(max_seq) else 1
    return dict(tick0=0, dtick=max(1, math.ceil(max_seq / 10)))


def _ratio_range(series) -> list[float]:
    """A linear y range for end-to-end speedups: around 1x and every value, with a little room.

    Not from zero: a projection moving from 1.00x to 1.08x must be visible, not a flat line."""
    vals = [float(v) for s in series for v in s if pd.notna(v) and math.isfinite(float(v))]
    lo, hi = min(vals + [1.0]), max(vals + [1.0])
    pad = max(0.02, (hi - lo) * 0.12)
    return [lo - pad, hi + pad]


def log_range_around_one(values, pad: float = 0.12) -> list[float]:
    """A log axis range (log10 units) centred on 1×, wide enough for every value: a ratio and
    its inverse are equally far from the middle, so faster and slower read alike."""
    vals = [abs(math.log10(float(v))) for v in values
            if v is not None and pd.notna(v) and float(v) > 0]
    half = max(vals + [math.log10(1.25)]) + pad
    return [-half, half]


def _log_ticks(rng: list[float]) -> dict:
    """Readable ticks on a log ratio axis: 1-2-5 steps within two decades, decades beyond."""
    return dict(tickformat="~g", dtick=1 if rng[1] - rng[0] > 2 else "D2")


def _short(text, n: int = 90) -> str:
    text = "" if text is None or (isinstance(text, float) and pd.isna(text)) else str(text)
    text = text.strip().splitlines()[0] if text.strip() else ""
    return text if len(text) <= n else text[: n - 1] + "…"


def _short_series(texts: pd.Series, n: int = 90) -> pd.Series:
    """_short over a whole column at once (string methods, no Python loop per row)."""
    t = texts.fillna("").astype(str).str.strip().str.split("\n", n=1).str[0].fillna("")
    return t.where(t.str.len() <= n, t.str.slice(0, n - 1) + "…")


def _legend_below() -> dict:
    return dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0)


def speedup_figure(exps: pd.DataFrame, best: pd.DataFrame, interpreter: bool = False,
                   names: dict[int, str] | None = None,
                   compile_x: dict[int, float] | None = None) -> go.Figure:
    """Per-kernel speedup over experiments, one facet per target, on a log axis around 1×.

    exps: experiments (target_id, seq, family, state, speedup, failed_stage, hypothesis, error);
    best: data.best_so_far(exps) (target_id, seq, best); names: target id -> its name (else the
    family). Each facet has the best-so-far step line, a marker per experiment coloured by
    state, eager at 1× and, where ``compile_x`` has the target (data.compile_speedups: eager /
    torch.compile of its op), torch.compile's line: a kernel under it is slower than the
    baseline that counts; one legend entry per kind, for all facets.

    Failed experiments have no valid speedup: their markers sit on a floor line under every
    real value, and the hover names the verifier stage that failed. The y range is set here;
    the Live run page's chart component keeps the user's zoom over it across refreshes. Built
    from the same parts as speedup_spec (the Live run page's incremental JSON)."""
    parts = _speedup_parts(exps, best, interpreter, names or {}, compile_x=compile_x)
    fig = go.Figure(layout=parts["layout"])
    fig.add_traces([go.Scatter(**t, _validate=False) for t in parts["legend"]]
                   + [go.Scatter(**t, _validate=False) for tid in parts["order"]
                      for t in _target_traces(parts, tid)])
    return fig


def speedup_spec(exps: pd.DataFrame, best: pd.DataFrame, interpreter: bool,
                 names: dict[int, str], cache: dict, look: dict,
                 compile_x: dict[int, float] | None = None) -> tuple[str, int]:
    """speedup_figure as the Live run page's chart component takes it (JSON, height), built
    incrementally: each target's traces are kept as JSON in ``cache`` (the page's session) and
    remade only when that target got an experiment (or its facet moved, or the floor under the
    failed markers did). A new experiment then costs one target's traces and the layout, not
    10,000 markers: the figure was most of a refresh's time. look: layout settings the page
    puts over every live figure (app/livechart.LOOK: template, background, font)."""
    parts = _speedup_parts(exps, best, interpreter, names, cache, compile_x)
    traces = [json.dumps(t, separators=(",", ":")) for t in parts["legend"]]
    keep = {}
    for tid in parts["order"]:
        key = (tid, parts["row"][tid], parts["floor"], parts["titles"][tid],
               parts["counts"].get(tid), parts["last_id"].get(tid))
        hit = cache.get(tid)
        text = hit[1] if hit and hit[0] == key else ",".join(
            json.dumps(t, separators=(",", ":")) for t in _target_traces(parts, tid))
        keep[tid] = (key, text)
        if text:
            traces.append(text)
    layout_memo = cache.get("_layout")
    cache.clear()
    cache.update(keep)
    if layout_memo:
        cache["_layout"] = layout_memo
    layout = dict(parts["layout"], **look)
    spec = '{"data":[' + ",".join(traces) + '],"layout":' + \
        json.dumps(layout, separators=(",", ":"), cls=_Encoder) + "}"
    return spec, int(parts["height"])


class _Encoder(json.JSONEncoder):
    """numpy scalars and arrays in a layout (make_subplots' domains) as plain JSON."""

    def default(self, o):
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
        return super().default(o)


def _speedup_parts(exps: pd.DataFrame, best: pd.DataFrame, interpreter: bool,
                   names: dict[int, str], cache: dict | None = None,
                   compile_x: dict[int, float] | None = None) -> dict:
    """What speedup_figure and speedup_spec share: the facets (targets in name order), the y
    floor, per-target rows of exps and best, the legend entries and the layout (a dict). With
    a cache, the layout is kept under "_layout" and remade only when the facets, the y range
    or the seq ticks changed (plotly's subplot layout is a tenth of a second to make)."""
    if exps.empty:
        fig = _empty(go.Figure(), "no experiments yet")
        fig.update_layout(title=_title("Per-kernel speedup", interpreter), height=300,
                          uirevision="speedup")
        return dict(layout=fig.layout.to_plotly_json(), legend=[],
                    order=[], height=300, floor=None, row={}, titles={}, counts={}, last_id={})
    tids = pd.to_numeric(exps["target_id"], errors="coerce").fillna(-1).astype(int).to_numpy()
    uniq, first = np.unique(tids, return_index=True)
    fam = exps["family"].to_numpy()
    titles = {int(t): names.get(int(t)) or str(fam[i]) for t, i in zip(uniq, first)}
    order = sorted(titles, key=lambda t: (titles[t], t))

    spd = pd.to_numeric(exps["speedup"], errors="coerce")
    valid = spd[spd > 0]
    comp = [float((compile_x or {}).get(t) or 0.0) for t in order]     # 0: not timed
    lo = min(([float(valid.min())] if len(valid) else []) + [1.0] + [c for c in comp if c > 0])
    hi = max(([float(valid.max())] if len(valid) else []) + [1.0] + comp)
    floor = lo / 2  # where failed experiments are drawn: below everything that has a speedup
    # one y range for every facet, so targets compare at a glance (log axis range is in log10)
    y_range = [math.log10(floor) - 0.15, max(math.log10(hi), -math.log10(lo)) + 0.15]
    n = len(order)
    height = 170 * n + 170
    ticks = _seq_ticks(exps["seq"].max())
    lkey = (tuple(titles[t] for t in order), tuple(round(v, 6) for v in y_range),
            tuple(sorted(ticks.items())), interpreter, tuple(round(c, 6) for c in comp))
    memo = (cache or {}).get("_layout")
    layout = memo[1] if memo and memo[0] == lkey else _speedup_layout(
        [titles[t] for t in order], y_range, ticks, interpreter, height, comp)
    if cache is not None:
        cache["_layout"] = (lkey, layout)
    states = set(exps["state"].dropna())

    # legend entries drawn nowhere: one per kind for all facets, whatever each facet holds
    legend = [dict(x=[None], y=[None], mode="lines", name="best so far", legendgroup="best",
                   line=dict(shape="hv", color=BEST_COLOUR, width=2), hoverinfo="skip")]
    for state, (colour, symbol) in STATE_STYLE.items():
        if state in states:
            legend.append(dict(x=[None], y=[None], mode="markers", name=state, legendgroup=state,
                               hoverinfo="skip",
                               marker=dict(color=colour, symbol=symbol, size=9,
                                           line=dict(width=2 if symbol != "circle" else 0,
                                                     color=colour))))
    by_t = {int(t): idx for t, idx in pd.Series(np.arange(len(tids))).groupby(tids)}
    best_tid = pd.to_numeric(best["target_id"], errors="coerce").fillna(-1).astype(int) \
        if not best.empty else pd.Series(dtype=int)
    ids = exps["id"].to_numpy() if "id" in exps else np.arange(len(exps))
    return dict(layout=layout, legend=legend,
                order=order, height=height, floor=floor, titles=titles,
                row={t: r for r, t in enumerate(order, start=1)}, exps=exps, spd=spd,
                rows_of=by_t, best=best, best_tid=best_tid,
                counts={t: len(v) for t, v in by_t.items()},
                last_id={t: int(ids[v.to_numpy()[-1]]) for t, v in by_t.items()})


def _speedup_layout(titles: list[str], y_range: list[float], ticks: dict, interpreter: bool,
                    height: int, comp: list[float] | None = None) -> dict:
    """The speedup figure's layout as a plain dict: one facet per target, shared x, eager at 1×
    in each and torch.compile's speedup over eager where ``comp`` (per facet, 0: not timed)
    has it, one log y setting for all."""
    n = len(titles)
    # ~50 px between facets whatever their number (the spacing is a fraction of the plot area)
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, subplot_titles=titles,
                        vertical_spacing=min(0.3, 50 / (height - 180)))
    # The baseline at 1x in every facet, and one y axis setting for all: made in one call each
    # (per-facet add_hline / update_yaxes calls cost more than the traces at a few facets).
    comp = comp or [0.0] * n
    fig.update_layout(shapes=[
        dict(type="line", xref=f"x{r if r > 1 else ''} domain", x0=0, x1=1,
             yref=f"y{r if r > 1 else ''}", y0=1.0, y1=1.0,
             line=dict(color=GUIDE, dash="dash", width=1)) for r in range(1, n + 1)] + [
        dict(type="line", xref=f"x{r if r > 1 else ''} domain", x0=0, x1=1,
             yref=f"y{r if r > 1 else ''}", y0=c, y1=c,
             line=dict(color=COMPILE_COLOUR, dash="dot", width=1.5))
        for r, c in enumerate(comp, start=1) if c > 0], annotations=list(fig.layout.annotations) + [
        dict(text=f"torch.compile {c:.3g}×", xref=f"x{r if r > 1 else ''} domain", x=1,
             xanchor="right", yref=f"y{r if r > 1 else ''}", y=math.log10(c), yanchor="bottom",
             showarrow=False, font=dict(size=10, color=COMPILE_COLOUR))
        for r, c in enumerate(comp, start=1) if c > 0])
    # plain numbers at each decade (or 1-2-5 steps within one), not 10^-1 with minor labels
    fig.update_yaxes(title_text="speedup ×", type="log", range=y_range, **_log_ticks(y_range))
    fig.update_xaxes(**ticks)
    fig.update_xaxes(title_text="experiment seq", row=n, col=1)
    fig.update_layout(title=_title("Per-kernel speedup over eager", interpreter),
                      height=height, margin=dict(t=90, b=90, l=60, r=20),
                      # in the bottom margin, whatever the number of facets
                      legend=_legend_below(), hovermode="closest", uirevision="speedup")
    layout = fig.layout.to_plotly_json()
    layout.pop("template", None)    # the page's look decides (charts are themed where drawn)
    return layout


def _target_traces(parts: dict, tid: int) -> list[dict]:
    """One target's traces as plotly dicts: its best-so-far line and a marker trace per state,
    on its facet's axes. Hover texts are one string per experiment."""
    row, label, floor = parts["row"][tid], parts["titles"][tid], parts["floor"]
    axis = "" if row == 1 else str(row)
    idx = parts["rows_of"][tid].to_numpy()
    e = parts["exps"].iloc[idx]
    spd = parts["spd"].to_numpy()[idx]
    hyp = _short_series(e["hypothesis"])
    failed_text = ("<b>failed at " + e["failed_stage"].fillna("?").astype(str) + "</b><br>"
                   + hyp + "<br>" + _short_series(e["error"]))
    hover = hyp.where(e["state"] != "failed", failed_text).to_numpy()
    seq, state_all = e["seq"].to_numpy(), e["state"].to_numpy()
    best = parts["best"]
    fb = best[(parts["best_tid"] == tid).to_numpy()].sort_values("seq") if not best.empty \
        else best
    out = [dict(x=fb["seq"].astype(int).tolist(),
                y=[None if pd.isna(v) else float(v) for v in fb["best"]], mode="lines",
                line=dict(shape="hv", color=BEST_COLOUR, width=2), name="best so far",
                legendgroup="best", showlegend=False, xaxis="x" + axis, yaxis="y" + axis,
                hovertemplate="seq %{x}<br>best so far %{y:.3g}×<extra>" + label + "</extra>")]
    for state, (colour, symbol) in STATE_STYLE.items():
        sel = state_all == state
        if not sel.any():
            continue
        y = spd[sel]
        if state == "failed":
            y = np.where(y > 0, y, floor)
            tmpl = "seq %{x}: %{hovertext}<extra>" + label + "</extra>"
        else:
            tmpl = ("seq %{x}: <b>" + state + "</b> %{y:.3g}×<br>%{hovertext}"
                    "<extra>" + label + "</extra>")
        out.append(dict(
            x=seq[sel].astype(int).tolist(), y=[float(v) for v in y], mode="markers",
            name=state, legendgroup=state, showlegend=False, hovertext=hover[sel].tolist(),
            hovertemplate=tmpl, xaxis="x" + axis, yaxis="y" + axis,
            marker=dict(color=colour, symbol=symbol, size=9,
                        line=dict(width=2 if symbol != "circle" else 0, color=colour))))
    return out


def amdahl_figure(proj: pd.DataFrame, limit: float | None = None,
                  interpreter: bool = False, measured: pd.DataFrame | None = None) -> go.Figure:
    """Projected end-to-end speedup over experiments: data.amdahl_projection as a step line.

    limit: the Amdahl ceiling 1 / (1 - Σf), what the model would gain if every targeted kernel
    took no time at all. Drawn as a line when it is near the data; when it is far above (a 73×
    limit over a projection at 1.1×) the axis follows the data and the limit is written at the
    top instead, so the projection never flattens into a line at the bottom.
    measured: data.e2e_frame (seq, speedup, label): end-to-end speedups measured with kept
    kernels in the model, drawn as diamonds over the projection when there are any."""
    fig = go.Figure()
    # 10,000 points on a live page: built without plotly's per-property checks (known columns)
    fig.add_trace(go.Scatter(
        x=proj["seq"].to_numpy(), y=proj["projected"].to_numpy(), mode="lines+markers",
        line=dict(shape="hv", width=2, color=BEST_COLOUR),
        marker=dict(size=5), name="projected (Amdahl)",
        customdata=proj["family"].fillna("—").astype(str).to_numpy(),
        hovertemplate="after seq %{x} (%{customdata})<br>projected %{y:.3f}×<extra></extra>",
        _validate=False))
    has_measured = measured is not None and not measured.empty
    if has_measured:
        fig.add_trace(go.Scatter(
            x=measured["seq"], y=measured["speedup"].astype(float), mode="markers",
            name="measured", marker=dict(symbol="diamond", size=11, color="#2ca02c",
                                         line=dict(width=1, color="#145214")),
            customdata=measured["label"].fillna("").astype(str),
            hovertemplate="measured after seq %{x}: %{y:.3f}× %{customdata}<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color=GUIDE, dash="dash", width=1))
    values = [proj["projected"]] + ([measured["speedup"].astype(float)] if has_measured else [])
    rng = _ratio_range(values)
    finite = limit is not None and 1.005 < limit < float("inf")
    if finite and limit <= rng[1] + 2 * (rng[1] - rng[0]):
        # near the data: drawn, and the axis stretched to it
        rng = _ratio_range(values + [pd.Series([limit])])
        fig.add_hline(y=limit, line=dict(color="#9467bd", dash="dot", width=1),
                      annotation_text=f"Amdahl limit {fmt.ratio(limit)}",
                      annotation_position="bottom right")
    elif finite:
        fig.add_annotation(text=f"Amdahl limit {fmt.ratio(limit)} (off the top of the axis)",
                           xref="paper", yref="paper", x=1, y=1, xanchor="right",
                           yanchor="top", showarrow=False, font=dict(size=11, color="#9467bd"))
    title = "End-to-end: projected and measured" if has_measured else \
        "Projected end-to-end speedup"
    fig.update_layout(title=_title(title, interpreter),
                      xaxis_title="experiment seq", yaxis_title="model speedup ×", height=320,
                      margin=dict(t=70, b=40, l=60, r=20), showlegend=has_measured,
                      legend=dict(orientation="h", x=1, xanchor="right", y=1.02, yanchor="bottom"),
                      uirevision="amdahl")
    fig.update_yaxes(range=rng)
    fig.update_xaxes(**_seq_ticks(proj["seq"].max()))
    return fig


def stage_figure(outcomes: pd.DataFrame) -> go.Figure:
    """Verifier outcomes per stage: stacked passed / failed / skipped / slower counts, stages in
    pipeline order from the top (slower: stages bench-first did not run for a candidate that
    lost on time). Horizontal bars: a stage name is never cut or turned on its side.

    outcomes: data.stage_outcomes_frame (stage, status, n)."""
    fig = go.Figure()
    stages = stage_order(outcomes)
    counts = (outcomes.pivot_table(index="stage", columns="status", values="n", aggfunc="sum")
              .reindex(stages).fillna(0) if not outcomes.empty else pd.DataFrame(index=stages))
    labels = [s.replace("_", " ") for s in stages]
    for status, colour in STATUS_COLOURS.items():
        x = counts[status] if status in counts else pd.Series(0, index=stages)
        name = STATUS_NAMES.get(status, status)
        fig.add_trace(go.Bar(y=labels, x=x.astype(int), name=name, marker_color=colour,
                             orientation="h",
                             hovertemplate="%{y}: %{x} " + name + "<extra></extra>"))
    fig.update_layout(barmode="stack", title=dict(text="Verifier outcomes per stage", x=0),
                      xaxis_title="experiments", height=340, margin=dict(t=60, b=80, l=20, r=20),
                      legend=_legend_below(), uirevision="stages")
    fig.update_yaxes(autorange="reversed", automargin=True)
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
        x=roof_x, y=roof_y, mode="lines", line=dict(color=GUIDE, width=2), name="measured roofs",
        hovertemplate="%{y:.3s}FLOP/s at %{x:.3g} flop/byte<extra>roof</extra>"))
    fig.add_annotation(x=math.log10(lo * 1.5), y=math.log10(bw * lo * 1.5), xref="x", yref="y",
                       text=f"copy {copy_gbps:,.0f} GB/s", showarrow=False, yshift=14,
                       textangle=0, xanchor="left", font=dict(size=11, color=GUIDE))
    if peak:
        fig.add_annotation(x=math.log10(hi), y=math.log10(peak), xref="x", yref="y",
                           text=f"bf16 matmul {matmul_tflops:,.0f} TFLOP/s", showarrow=False,
                           yshift=10, xanchor="right", font=dict(size=11, color=GUIDE))
    labels = list(dict.fromkeys(points["label"])) if not points.empty else []
    for i, label in enumerate(labels):
        p = points[points["label"] == label]
        colour = ROOFLINE_COLOURS.get(label.split(" ")[0], None)
        pct = 100 * p["bytes_per_s"] / bw
        fig.add_trace(go.Scatter(
            x=p["intensity"], y=p["flops_per_s"], mode="markers", name=label,
            marker=dict(size=12, symbol=ROOFLINE_SYMBOLS[i % len(ROOFLINE_SYMBOLS)],
                        color=colour, line=dict(width=1, color=GUIDE)),
            customdata=list(zip(p["shape"], p["us"], p["bytes_per_s"] / 1e9, pct)),
            hovertemplate=("%{customdata[0]}: %{customdata[1]:.1f} µs per call<br>"
                           "%{y:.3s}FLOP/s, %{customdata[2]:,.0f} GB/s = %{customdata[3]:.0f}% "
                           "of the copy roof<extra>" + label + "</extra>")))
    fig.update_xaxes(type="log", title_text="arithmetic intensity (flop / byte)")
    fig.update_yaxes(type="log", title_text="achieved FLOP/s", tickformat="~s")
    fig.update_layout(title=dict(text=title, x=0), height=420,
                      margin=dict(t=60, b=50, l=70, r=20), legend=_legend_below(),
                      uirevision="roofline")
    return fig


# ---- speedups as bars from 1× ------------------------------------------------------------------
def _ratio_bars(x, ratios, colour, name: str, hover_extra=None, pattern: str = "",
                offsetgroup=None) -> go.Bar:
    """Bars that start at 1× and end at each ratio (up when faster, down when slower), on a log
    axis: base=1 and length ratio - 1, so plotly draws [1, ratio]. Each bar is labelled with the
    ratio as app/fmt writes it; the marker colour may be one colour or one per bar."""
    r = [float(v) for v in ratios]
    hover = [f"{fmt.ratio(v)}" + (f"<br>{e}" if e else "")
             for v, e in zip(r, hover_extra or [""] * len(r))]
    return go.Bar(x=list(x), y=[v - 1.0 for v in r], base=[1.0] * len(r), name=name,
                  marker=dict(color=colour, pattern_shape=pattern),
                  text=[fmt.ratio(v) for v in r], textposition="outside", cliponaxis=False,
                  hovertext=hover, hovertemplate="%{x}: %{hovertext}<extra>" + name + "</extra>",
                  offsetgroup=offsetgroup)


def _ratio_axis(fig: go.Figure, values, title: str) -> None:
    rng = log_range_around_one(values, pad=0.18)
    fig.add_hline(y=1.0, line=dict(color=GUIDE, width=1.5))
    fig.update_yaxes(type="log", range=rng, title_text=title, **_log_ticks(rng))


def family_speedup_figure(summary: pd.DataFrame, interpreter: bool = False,
                          title: str = "Best kernel per target") -> go.Figure:
    """One bar per target from 1×: the best kept kernel's speedup over eager, and over
    torch.compile where the engine timed it (a second bar). A bar below the line is a kernel
    slower than that baseline, in red, and its hover says so.

    summary: data.target_summary (name, speedup, vs_compile, slower, verdict, fraction)."""
    fig = go.Figure()
    s = summary.dropna(subset=["speedup"]) if not summary.empty else summary
    if s.empty:
        fig = _empty(fig, "no kept kernel yet")
    else:
        x = s["name"] if "name" in s else s["family"]
        eager = s["speedup"].astype(float)
        share = [f"{100 * float(f):.1f}% of model time" if pd.notna(f) else ""
                 for f in s["fraction"]]
        fig.add_trace(_ratio_bars(
            x, eager, [FASTER_COLOUR if v >= 1 else SLOWER_COLOUR for v in eager],
            "vs eager", [f"{v}<br>{w}" for v, w in zip(s.get("verdict", [""] * len(s)), share)],
            offsetgroup="eager"))
        values = list(eager)
        comp = pd.to_numeric(s.get("vs_compile"), errors="coerce") if "vs_compile" in s else None
        if comp is not None and comp.notna().any():
            have = comp.notna()
            fig.add_trace(_ratio_bars(
                x[have], comp[have],
                ["#98df8a" if v >= 1 else "#ff9896" for v in comp[have]], "vs torch.compile",
                pattern="/", offsetgroup="compile"))
            values += list(comp[have])
            fig.update_layout(barmode="group", showlegend=True, legend=_legend_below())
        else:
            fig.update_layout(showlegend=False)
        _ratio_axis(fig, values, "speedup × (log; the baseline at 1)")
    fig.update_layout(title=_title(title, interpreter), height=360,
                      margin=dict(t=70, b=60, l=60, r=20), uirevision="family_speedup")
    return fig


def compare_speedup_figure(rows: pd.DataFrame, colours: dict[str, str] | None = None) -> go.Figure:
    """Per-family best speedups of several runs side by side: grouped bars from 1×, one colour
    per run (charts.run_colours), below the line when slower than eager.

    rows: run (label), run_id, family, speedup, interpreter (bool). Interpreter runs are hatched
    and say so in the legend: their speedups only compare candidates with each other."""
    fig = go.Figure()
    rows = rows.dropna(subset=["speedup"]) if not rows.empty else rows
    if rows.empty:
        fig = _empty(fig, "no kept kernel in these runs")
    colours = colours or {}
    for run in (dict.fromkeys(rows["run"]) if not rows.empty else []):
        r = rows[rows["run"] == run]
        interp = bool(r["interpreter"].any())
        rid = r["run_id"].iloc[0] if "run_id" in r else run
        fig.add_trace(_ratio_bars(
            r["family"], r["speedup"].astype(float), colours.get(rid, run_colour(rid)),
            run + (" (interpreter timing)" if interp else ""),
            pattern="/" if interp else "", offsetgroup=run))
    if not rows.empty:
        _ratio_axis(fig, rows["speedup"], "best speedup over eager × (log)")
    fig.update_layout(barmode="group", title=dict(text="Per-family speedup by run", x=0),
                      height=420, margin=dict(t=60, b=40, l=60, r=20),
                      legend=_legend_below(), uirevision="compare_speedup")
    return fig


def compare_projection_figure(curves: dict[str, pd.DataFrame],
                              colours: dict[str, str] | None = None) -> go.Figure:
    """The Amdahl projection over experiments of several runs, one step line each, in each
    run's colour (colours: label -> colour)."""
    fig = go.Figure()
    colours = colours or {}
    for i, (run, proj) in enumerate(curves.items()):
        fig.add_trace(go.Scatter(
            x=proj["seq"], y=proj["projected"], mode="lines",
            line=dict(shape="hv", width=2, color=colours.get(run, RUN_COLOURS[i % 10])),
            name=run, hovertemplate="after seq %{x}: %{y:.3f}×<extra>" + run + "</extra>"))
    fig.add_hline(y=1.0, line=dict(color=GUIDE, dash="dash", width=1))
    fig.update_layout(title=dict(text="Projected end-to-end speedup over experiments", x=0),
                      xaxis_title="experiment seq", yaxis_title="model speedup ×", height=360,
                      margin=dict(t=60, b=40, l=60, r=20),
                      legend=_legend_below(), uirevision="compare_projection")
    fig.update_yaxes(range=_ratio_range([p["projected"] for p in curves.values()]))
    return fig


def compare_curves_figure(curves: dict[str, pd.DataFrame],
                          colours: dict[str, str] | None = None) -> go.Figure:
    """Kernel curves of several runs overlaid: per family, each run's best-so-far speedup over
    its experiments on that family (1, 2, ... in the order the run tried them), one facet per
    family, one colour per run. curves: run label -> data.best_so_far frame (family, seq, best)
    of that run's experiments (NaN before the first keep: the curve starts there)."""
    colours = colours or {}
    fams = sorted({f for c in curves.values() for f in c["family"].dropna().unique()})
    if not fams:
        fig = _empty(go.Figure(), "no kept kernel in these runs")
        fig.update_layout(title=dict(text="Best so far per family", x=0), height=300)
        return fig
    fig = make_subplots(rows=1, cols=len(fams), subplot_titles=fams, shared_yaxes=True,
                        horizontal_spacing=min(0.08, 0.3 / len(fams)))
    values = []
    for i, (run, c) in enumerate(curves.items()):
        first = True
        for j, fam in enumerate(fams, start=1):
            f = c[c["family"] == fam].sort_values("seq")
            n = np.arange(1, len(f) + 1)
            have = f["best"].notna().to_numpy()
            if not have.any():
                continue
            values += list(f["best"].dropna())
            fig.add_trace(go.Scatter(
                x=n[have], y=f["best"].astype(float).to_numpy()[have], mode="lines+markers",
                line=dict(shape="hv", width=2, color=colours.get(run, RUN_COLOURS[i % 10])),
                marker=dict(size=5), name=run, legendgroup=run, showlegend=first,
                hovertemplate=f"{fam}: %{{y:.3g}}× after %{{x}} experiment(s)"
                              f"<extra>{run}</extra>"), row=1, col=j)
            first = False
    rng = log_range_around_one(values)
    for j in range(1, len(fams) + 1):
        fig.add_hline(y=1.0, line=dict(color=GUIDE, dash="dash", width=1), row=1, col=j)
    fig.update_yaxes(type="log", range=rng, **_log_ticks(rng))
    fig.update_yaxes(title_text="best so far × eager", row=1, col=1)
    fig.update_xaxes(title_text="experiments on it", tick0=1, rangemode="tozero")
    fig.update_layout(title=dict(text="Kernel curves: best so far per family", x=0), height=380,
                      margin=dict(t=70, b=60, l=60, r=20), legend=_legend_below(),
                      uirevision="compare_curves")
    return fig


# ---- one target: parameters and time ------------------------------------------------------------
def parcoords_figure(pf: pd.DataFrame, params: list[str]) -> go.Figure:
    """Parallel coordinates of a target's experiments: one line per experiment through each
    parameter's value to its speedup (log2 axis, ticks as ×). Failed experiments (no speedup)
    end on a "failed" tick under every speedup and are drawn red; the others are coloured by
    speedup. pf: data.params_frame; params: the parameters to show, in order."""
    fig = go.Figure()
    if pf.empty or not params:
        fig = _empty(fig, "no parameters recorded for this target")
        fig.update_layout(title=dict(text="Parameters → speedup", x=0), height=300)
        return fig
    dims = []
    for p in params:
        vals, numeric = param_values(pf[p])
        if numeric:
            ticks = sorted(vals.unique())
            dims.append(dict(label=p, values=vals,
                             tickvals=ticks if len(ticks) <= 12 else None,
                             ticktext=[f"{v:g}" for v in ticks] if len(ticks) <= 12 else None))
        else:
            cats = sorted(vals.unique())
            code = {c: i for i, c in enumerate(cats)}
            dims.append(dict(label=p, values=vals.map(code), tickvals=list(range(len(cats))),
                             ticktext=cats, range=[-0.5, len(cats) - 0.5]))
    spd = pd.to_numeric(pf["speedup"], errors="coerce")
    ok = spd > 0
    lg = np.log2(spd.where(ok))
    lo = float(lg.min()) if ok.any() else 0.0
    hi = float(lg.max()) if ok.any() else 0.0
    fail = lo - max(0.5, (hi - lo) * 0.15)
    y = lg.where(ok, fail)
    ticks = sorted({fail} | {float(v) for v in np.arange(math.floor(lo), math.ceil(hi) + 1)})
    dims.append(dict(label="speedup × eager", values=y, tickvals=ticks,
                     ticktext=["failed" if t == fail else fmt.ratio(2 ** t) for t in ticks]))
    # red for failed (a hard stop just above it), then orange below 1×, grey at 1×, blue above:
    # mid-tones that read on a light and a dark page
    cmax = max(hi, 0.25)
    edge = 0.02
    one = min(0.98, max(edge + 0.01, (0.0 - fail) / (cmax - fail)))
    scale = [[0, SLOWER_COLOUR], [edge, SLOWER_COLOUR], [edge, "#ff7f0e"], [one, GUIDE],
             [1, BEST_COLOUR]]
    fig.add_trace(go.Parcoords(
        dimensions=dims, line=dict(color=y, colorscale=scale, cmin=fail, cmax=cmax,
                                   showscale=False),
        labelangle=0, labelside="top", unselected=dict(line=dict(opacity=0.05))))
    fig.update_layout(title=dict(text="Parameters → speedup (one line per experiment; failed "
                                      "in red)", x=0),
                      height=420, margin=dict(t=110, b=30, l=70, r=110), uirevision="parcoords")
    return fig


def param_scatter_figure(pf: pd.DataFrame, params: list[str]) -> go.Figure:
    """Speedup against each parameter, one small panel per parameter (values as categories, in
    order), markers by state, failed ones on a floor under every speedup. Log y around 1×."""
    if pf.empty or not params:
        fig = _empty(go.Figure(), "no parameters recorded for this target")
        fig.update_layout(height=260)
        return fig
    cols = min(4, len(params))
    nrows = math.ceil(len(params) / cols)
    fig = make_subplots(rows=nrows, cols=cols, subplot_titles=params, shared_yaxes=True,
                        horizontal_spacing=0.04, vertical_spacing=min(0.25, 0.5 / nrows))
    spd = pd.to_numeric(pf["speedup"], errors="coerce")
    ok = spd > 0
    lo = float(spd[ok].min()) if ok.any() else 1.0
    floor = min(lo, 1.0) / 1.6
    shown = set()
    for i, p in enumerate(params):
        r, c = divmod(i, cols)
        vals, numeric = param_values(pf[p])
        order = [f"{v:g}" for v in sorted(vals.unique())] if numeric else sorted(vals.unique())
        xs = vals.map(lambda v: f"{v:g}") if numeric else vals
        for state, (colour, symbol) in STATE_STYLE.items():
            sel = pf["state"] == state
            if not sel.any():
                continue
            yv = spd[sel].where(spd[sel] > 0, floor)
            fig.add_trace(go.Scatter(
                x=xs[sel], y=yv, mode="markers", name=state, legendgroup=state,
                showlegend=state not in shown,
                marker=dict(color=colour, symbol=symbol, size=8, opacity=0.8,
                            line=dict(width=1.5 if symbol != "circle" else 0, color=colour)),
                customdata=pf.loc[sel, "seq"],
                hovertemplate=f"#%{{customdata}} {p}=%{{x}}: %{{y:.3g}}×<extra>{state}</extra>"),
                row=r + 1, col=c + 1)
            shown.add(state)
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=order,
                         row=r + 1, col=c + 1)
    rng = log_range_around_one(list(spd[ok]) + [floor])
    fig.update_yaxes(type="log", range=rng, **_log_ticks(rng))
    for r in range(1, nrows + 1):
        for c in range(1, cols + 1):
            fig.add_hline(y=1.0, line=dict(color=GUIDE, dash="dash", width=1), row=r, col=c)
    fig.update_layout(title=dict(text="Speedup against each parameter (failed at the bottom)",
                                 x=0),
                      height=200 * nrows + 140, margin=dict(t=80, b=70, l=50, r=20),
                      legend=_legend_below(), uirevision="param_scatter")
    return fig


def time_figure(pf: pd.DataFrame, run_exps: pd.DataFrame, bucket_s: float) -> go.Figure:
    """History against wall-clock time: the target's experiments (speedup by state, best so
    far) over the time they landed, and below it the whole run's throughput, experiments per
    hour in buckets of bucket_s seconds. Times are UTC. pf: data.params_frame (created_at,
    speedup, state, best); run_exps: the run's experiments (created_at)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.65, 0.35],
                        vertical_spacing=0.08,
                        subplot_titles=("this target's experiments", "the run's throughput"))
    if pf.empty:
        return _empty(fig, "no experiments on this target yet")
    t = pd.to_datetime(pf["created_at"], unit="s")
    spd = pd.to_numeric(pf["speedup"], errors="coerce")
    ok = spd > 0
    floor = min(float(spd[ok].min()) if ok.any() else 1.0, 1.0) / 1.6
    fig.add_trace(go.Scatter(x=t, y=pf["best"], mode="lines", line=dict(shape="hv", width=2,
                                                                       color=BEST_COLOUR),
                             name="best so far", hovertemplate="%{x}<br>best %{y:.3g}×"
                                                               "<extra></extra>"), row=1, col=1)
    for state, (colour, symbol) in STATE_STYLE.items():
        sel = pf["state"] == state
        if sel.any():
            fig.add_trace(go.Scatter(
                x=t[sel], y=spd[sel].where(spd[sel] > 0, floor), mode="markers", name=state,
                marker=dict(color=colour, symbol=symbol, size=8,
                            line=dict(width=1.5 if symbol != "circle" else 0, color=colour)),
                customdata=pf.loc[sel, "seq"],
                hovertemplate="#%{customdata} at %{x}: %{y:.3g}×<extra>" + state + "</extra>"),
                row=1, col=1)
    rng = log_range_around_one(list(spd[ok]) + [floor])
    fig.update_yaxes(type="log", range=rng, title_text="speedup ×", row=1, col=1,
                     **_log_ticks(rng))
    fig.add_hline(y=1.0, line=dict(color=GUIDE, dash="dash", width=1), row=1, col=1)
    created = pd.to_numeric(run_exps["created_at"], errors="coerce").dropna()
    if len(created):
        start = float(created.min())
        edges = start + bucket_s * np.arange(0, int((created.max() - start) // bucket_s) + 2)
        counts, _ = np.histogram(created, bins=edges)
        fig.add_trace(go.Bar(x=pd.to_datetime(edges[:-1] + bucket_s / 2, unit="s"),
                             y=counts * 3600.0 / bucket_s, width=bucket_s * 1000 * 0.9,
                             marker_color=GUIDE, name="experiments / h", showlegend=False,
                             hovertemplate="%{x}: %{y:.0f} experiments/h<extra></extra>"),
                      row=2, col=1)
    fig.update_yaxes(title_text="exp / h", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="wall-clock time (UTC)", row=2, col=1)
    fig.update_layout(title=dict(text="Over time", x=0), height=460,
                      margin=dict(t=80, b=70, l=60, r=20), legend=_legend_below(),
                      uirevision="time")
    return fig


def importance_figure(imp: pd.DataFrame) -> go.Figure:
    """The parameters ranked by how much of the speedups' spread their value explains
    (data.param_importance: parameter, importance in [0, 1])."""
    fig = go.Figure()
    if imp.empty:
        fig = _empty(fig, "too few timed experiments to rank parameters")
    else:
        s = imp.sort_values("importance")
        fig.add_trace(go.Bar(x=s["importance"], y=s["parameter"], orientation="h",
                             marker_color=BEST_COLOUR, text=[fmt.share(v) for v in s["importance"]],
                             textposition="outside", cliponaxis=False,
                             hovertemplate="%{y}: explains %{x:.0%} of the spread<extra></extra>"))
        fig.update_xaxes(range=[0, 1.25], tickformat=".0%", title_text="variance explained")
        fig.update_yaxes(automargin=True)
    fig.update_layout(title=dict(text="Parameter importance", x=0),
                      height=max(220, 40 * len(imp) + 120), showlegend=False,
                      margin=dict(t=60, b=50, l=20, r=30), uirevision="importance")
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
                      legend=_legend_below(), uirevision="workers")
    fig.update_yaxes(rangemode="tozero", tickformat="d")
    return fig
