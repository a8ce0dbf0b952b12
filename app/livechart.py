"""A Plotly chart that keeps the user's zoom while its data changes: for the Live run page.

Why not st.plotly_chart: Streamlit (1.5x-1.6x) gives a chart a new element identity whenever its
figure changes, even with a key, so the browser mounts a new plot at every refresh that brings a
new experiment, and the zoom, pan and legend choices are gone; uirevision cannot help a plot
that is new. This is a small component (Streamlit's v1 component protocol, no build step): one
iframe per key that stays mounted across reruns and gets each new figure by message, then calls
Plotly.react on the same plot, where a constant layout.uirevision keeps what the user did.

plotly.js comes from the installed plotly package (package_data/plotly.min.js), copied once with
the page into a folder Streamlit serves the component from; nothing is fetched from the network.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import plotly
import plotly.graph_objects as go
import streamlit as st
import streamlit.components.v1 as components

INDEX_HTML = """<!DOCTYPE html>
<html><head><meta charset="utf-8">
<style>html, body {margin: 0; padding: 0; background: transparent; overflow: hidden;}</style>
<script src="plotly.min.js"></script>
</head><body><div id="chart"></div>
<script>
// Streamlit's component protocol by hand: say ready, get "render" messages with the args and
// the page's theme, report the height the iframe needs.
const gd = document.getElementById("chart");
const post = (type, extra) =>
  window.parent.postMessage(Object.assign({isStreamlitMessage: true, type: type}, extra), "*");
// The axis ranges the user set by zooming or panning, by axis ("xaxis", "yaxis2", ...), kept
// over every new figure until a double-click (autorange) gives the axis back to the data:
// uirevision alone keeps a range only while the new figure asks for the same one, and the
// y range of a live chart moves with each new experiment.
const userRanges = {};
let specRanges = {};   // the ranges the current figure asks for itself (a reset returns there)
let lastKey = null;
function themed(layout, theme) {
  const dark = theme && theme.base === "dark";
  const text = (theme && theme.textColor) || (dark ? "#fafafa" : "#31333f");
  const grid = dark ? "rgba(250,250,250,0.12)" : "rgba(49,51,63,0.10)";
  layout.paper_bgcolor = "rgba(0,0,0,0)";
  layout.plot_bgcolor = "rgba(0,0,0,0)";
  layout.font = Object.assign({}, layout.font || {}, {color: text});
  layout.legend = Object.assign({}, layout.legend || {}, {font: {color: text}});
  layout.hoverlabel = Object.assign({}, layout.hoverlabel || {},
    {bgcolor: dark ? "#262730" : "#ffffff", font: {color: text}});
  for (const k of Object.keys(layout)) {
    if (/^[xy]axis\\d*$/.test(k)) {
      layout[k] = Object.assign({gridcolor: grid, zerolinecolor: grid, linecolor: grid},
                                layout[k]);
    }
  }
  for (const a of layout.annotations || []) {   // subplot titles and notes follow the text
    a.font = Object.assign({color: text}, a.font || {});
  }
  return layout;
}
function keepUserRanges(layout) {
  for (const [axis, range] of Object.entries(userRanges)) {
    if (!layout[axis]) continue;
    layout[axis] = Object.assign({}, layout[axis], {range: range.slice(), autorange: false});
  }
  return layout;
}
window.addEventListener("message", (event) => {
  const msg = event.data;
  if (!msg || msg.type !== "streamlit:render") return;
  const spec = msg.args.spec;
  const key = spec + "|" + ((msg.theme && msg.theme.base) || "");
  if (key === lastKey) return;  // a refresh with nothing new: leave the plot alone
  lastKey = key;
  const fig = JSON.parse(spec);
  const height = (fig.layout && fig.layout.height) || 450;
  fig.layout.autosize = true;
  delete fig.layout.width;
  specRanges = {};
  for (const [k, v] of Object.entries(fig.layout)) {
    if (/^[xy]axis\\d*$/.test(k) && v && v.range) specRanges[k] = v.range.slice();
  }
  keepUserRanges(themed(fig.layout, msg.theme));
  // same div every time: Plotly.react diffs, and a constant uirevision keeps legend choices
  Plotly.react(gd, fig.data, fig.layout, {responsive: true, displaylogo: false}).then(() => {
    if (!gd._nsListening) {
      gd._nsListening = true;
      gd.on("plotly_relayout", (ev) => {
        for (const [k, v] of Object.entries(ev)) {
          const m = k.match(/^([xy]axis\\d*)\\.(range\\[([01])\\]|range|autorange)$/);
          if (!m) continue;
          const axis = m[1];
          if (m[2] === "autorange") { delete userRanges[axis]; continue; }
          if (m[2] === "range") { userRanges[axis] = v.slice(); continue; }
          const r = (userRanges[axis] || gd._fullLayout[axis].range).slice();
          r[Number(m[3])] = v;
          userRanges[axis] = r;
        }
        // a double-click that reset an axis to the figure's own range gives it back too
        for (const [axis, r] of Object.entries(userRanges)) {
          const own = specRanges[axis];
          if (own && Math.abs(own[0] - r[0]) < 1e-9 && Math.abs(own[1] - r[1]) < 1e-9) {
            delete userRanges[axis];
          }
        }
      });
    }
  });
  post("streamlit:setFrameHeight", {height: height});
});
window.addEventListener("resize", () => { if (gd.data) Plotly.Plots.resize(gd); });
post("streamlit:componentReady", {apiVersion: 1});
</script></body></html>
"""


@st.cache_resource(show_spinner=False)
def _component():
    """The component, declared once per process from a folder holding the page and plotly.js."""
    folder = Path(tempfile.gettempdir()) / f"nightshift-livechart-{plotly.__version__}"
    folder.mkdir(exist_ok=True)
    js = folder / "plotly.min.js"
    if not js.exists():
        shutil.copyfile(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", js)
    (folder / "index.html").write_text(INDEX_HTML)
    return components.declare_component("nightshift_livechart", path=str(folder))


# What the page puts over every live figure: no template (a named one costs up to 0.1 s a figure;
# the component's page themes the plot in the browser), a transparent paper, the page's font.
LOOK = dict(template={}, paper_bgcolor="rgba(0,0,0,0)")


def look(font: dict | None = None) -> dict:
    return dict(LOOK, font=dict({"family": "Source Sans Pro, sans-serif"}, **(font or {})))


def spec(fig: go.Figure) -> str:
    """The figure as the component takes it: JSON, with an empty template (applying a named one
    takes up to 0.1 s a figure). The component's page gives it the dashboard's theme in the
    browser (text colour, transparent backgrounds, grid lines for light or dark), so one JSON
    serves both themes.
    Made once per data change by the Live run page, which keeps the string between refreshes."""
    fig.update_layout(template=_EMPTY, paper_bgcolor="rgba(0,0,0,0)",
                      font=dict(family="Source Sans Pro, sans-serif"))
    return fig.to_json()


_EMPTY = go.layout.Template()


def live_chart(figure_json: str, height: int, key: str) -> None:
    """Draw a figure (spec()) in a plot that stays mounted under ``key`` across reruns."""
    with st.container(key=key):
        _component()(spec=figure_json, key=key + "_plot", default=None, height=height)
