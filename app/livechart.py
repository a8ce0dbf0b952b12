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
// Streamlit's component protocol by hand: say ready, get "render" messages with the args,
// report the height the iframe needs.
const gd = document.getElementById("chart");
const post = (type, extra) =>
  window.parent.postMessage(Object.assign({isStreamlitMessage: true, type: type}, extra), "*");
let lastSpec = null;
window.addEventListener("message", (event) => {
  const msg = event.data;
  if (!msg || msg.type !== "streamlit:render") return;
  const spec = msg.args.spec;
  if (spec === lastSpec) return;  // a refresh with nothing new: leave the plot alone
  lastSpec = spec;
  const fig = JSON.parse(spec);
  const height = (fig.layout && fig.layout.height) || 450;
  fig.layout.autosize = true;
  delete fig.layout.width;
  // same div every time: Plotly.react diffs, and a constant uirevision keeps zoom and legend
  Plotly.react(gd, fig.data, fig.layout, {responsive: true, displaylogo: false});
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


def spec(fig: go.Figure) -> str:
    """The figure as the component takes it: JSON, in the page's look. An empty template leaves
    plotly.js's own defaults (white, light grid), close to what st.plotly_chart's theme gives the
    other pages' charts, and costs nothing: applying a named one takes up to 0.1 s a figure.
    Made once per data change by the Live run page, which keeps the string between refreshes."""
    fig.update_layout(template=_EMPTY, paper_bgcolor="rgba(0,0,0,0)",
                      font=dict(family="Source Sans Pro, sans-serif", color="#31333f"))
    return fig.to_json()


_EMPTY = go.layout.Template()


def live_chart(figure_json: str, height: int, key: str) -> None:
    """Draw a figure (spec()) in a plot that stays mounted under ``key`` across reruns."""
    with st.container(key=key):
        _component()(spec=figure_json, key=key + "_plot", default=None, height=height)
