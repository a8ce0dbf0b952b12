"""Report exports: a self-contained HTML file, the experiments as CSV, the charts as PNG.

Pure functions from data.report_data's dict and Plotly figures to bytes; no Streamlit, no
database. The HTML inlines plotly.js once (about 4.6 MB), so the file opens offline, anywhere,
with working hover and zoom. PNGs come from kaleido, which drives a Chrome or Chromium that is
already installed (it looks at $BROWSER_PATH, then PATH, then the usual install paths).
"""
from __future__ import annotations

import datetime as dt
import html
import io
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from app import data

SUMMARY_HEADERS = {"family": "family", "dtype": "dtype", "fraction": "share of model time",
                   "experiments": "experiments", "kept": "kept", "failed": "failed",
                   "eager_us": "eager µs", "best_us": "best µs", "speedup": "speedup vs eager",
                   "pct_sol": "% of speed of light", "best_seq": "found at experiment"}


def summary_table(summary: pd.DataFrame, interpreter: bool) -> pd.DataFrame:
    """The per-kernel table as people read it: formatted strings, readable headers."""
    tag = " (interpreter)" if interpreter else ""
    out = pd.DataFrame({
        "family": summary["family"], "dtype": summary["dtype"],
        "share of model time": summary["fraction"].map(lambda v: f"{v:.1%}"),
        "experiments": summary["experiments"], "kept": summary["kept"],
        "failed": summary["failed"],
        "eager µs" + tag: summary["eager_us"].map(_num("{:,.1f}")),
        "best µs" + tag: summary["best_us"].map(_num("{:,.1f}")),
        "speedup vs eager" + tag: summary["speedup"].map(_num("{:.3g}×")),
        "% of speed of light": summary["pct_sol"].map(_num("{:.0f}%")),
        "found at experiment": summary["best_seq"].map(_num("#{:.0f}")),
    })
    return out


def _num(fmt: str):
    return lambda v: fmt.format(v) if v is not None and pd.notna(v) else "—"


def experiments_csv(rep: dict) -> bytes:
    """Every experiment of the run (without the kernel sources), one row each, with the run id
    and model so CSVs of several runs can be concatenated."""
    exps = rep["exps"].copy()
    exps.insert(0, "model", rep["run"]["model"])
    exps.insert(0, "run_id", rep["run"]["id"])
    return exps.to_csv(index=False).encode()


def report_html(rep: dict, figures: dict[str, go.Figure]) -> str:
    """The report as one self-contained HTML page: plotly.js inline (once), the charts as live
    Plotly figures, the tables as HTML; no external script, style or font."""
    run, head = rep["run"], data.headline(rep)
    badge = data.recorded_label(run)
    created = dt.datetime.fromtimestamp(run["created_at"], dt.timezone.utc)
    exps = rep["exps"]
    counts = exps["state"].value_counts() if not exps.empty else pd.Series(dtype=int)
    cfg = run.get("config") or {}
    facts = [("model", run["model"]), ("device", data.device_label(run)),
             ("proposer", cfg.get("proposer", "search")), ("dtype", cfg.get("dtype")),
             ("input", cfg.get("input_shape") or "default"), ("status", run["status"]),
             ("started", created.strftime("%Y-%m-%d %H:%M UTC")),
             ("duration", data.format_duration(data.elapsed_s(run))),
             ("experiments", f"{len(exps)} ({int(counts.get('kept', 0))} kept, "
                             f"{int(counts.get('reverted', 0))} reverted, "
                             f"{int(counts.get('failed', 0))} failed)")]
    ceil = run.get("ceilings") or {}
    if ceil.get("copy_gbps"):
        facts.append(("measured roofs", f"copy {ceil['copy_gbps']:,.0f} GB/s, bf16 matmul "
                                        f"{ceil.get('matmul_tflops', 0):,.0f} TFLOP/s"))
    charts_html = "\n".join(
        f"<section class='chart'>{fig.to_html(full_html=False, include_plotlyjs=False, div_id=f'chart-{name}', config={'displaylogo': False})}</section>"  # noqa: E501
        for name, fig in figures.items())
    table = summary_table(rep["summary"], rep["interpreter"]).to_html(
        index=False, border=0, classes="tbl", escape=True)
    e = html.escape
    warn = ("<p class='warn'>Interpreter timing — not GPU performance: this run had no GPU; its "
            "kernels ran under Triton's CPU interpreter, so its times only compare candidates "
            "with each other.</p>") if rep["interpreter"] else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>nightshift report · {e(run['model'])} · {e(run['id'])}</title>
<style>{REPORT_CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<header><h1>nightshift report: {e(run['model'])}</h1>
<p class="sub">run {e(run['id'])}{' · <span class="badge">' + e(badge) + '</span>' if badge else ''}</p></header>
<section class="headline {head['kind']}"><div class="label">{e(head['label'])}</div>
<div class="value">{data.format_speedup(head['value'])}</div><div class="note">{e(head['note'])}</div></section>
{warn}
<table class="facts">{''.join(f'<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>' for k, v in facts)}</table>
<h2>Per kernel</h2>
{table}
<h2>Charts</h2>
{charts_html}
<footer>Made by nightshift's dashboard from its SQLite record of the run. Every kernel counted here
passed the verifier's five stages before it was timed.</footer>
</body></html>
"""


REPORT_CSS = """
body {font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 2rem auto;
  max-width: 1100px; color: #1f2328; padding: 0 1rem;}
h1 {margin-bottom: .2rem;} .sub {color: #57606a; margin-top: 0;}
.badge {background: #ede4ff; color: #5a32a3; border-radius: 1rem; padding: .1rem .6rem;}
.headline {border-radius: .6rem; padding: 1rem 1.4rem; margin: 1rem 0; background: #f0f7ff;}
.headline.measured {background: #ecfdf1;}
.headline .label {font-size: 1rem; color: #57606a;} .headline .value {font-size: 3rem; font-weight: 700;}
.headline .note {color: #57606a; font-size: .9rem;}
.warn {background: #fff8c5; border-radius: .4rem; padding: .6rem 1rem;}
table {border-collapse: collapse; margin: .5rem 0 1rem;}
.facts th {text-align: left; color: #57606a; font-weight: 500; padding: .15rem 1rem .15rem 0;}
.tbl th, .tbl td {padding: .3rem .7rem; border-bottom: 1px solid #d0d7de; text-align: right;}
.tbl th:first-child, .tbl td:first-child {text-align: left;}
.chart {margin: 1rem 0;} footer {color: #57606a; font-size: .85rem; margin-top: 2rem;}
"""


# ---- PNG through kaleido ------------------------------------------------------------------------
def png_support() -> tuple[bool, str]:
    """(True, browser path) when charts can be exported as PNG, else (False, why).

    kaleido >= 1 renders in a Chrome or Chromium it finds through choreographer: $BROWSER_PATH
    first, then chromium / chrome on PATH, then the usual install paths (e.g. /usr/bin/chromium)."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return False, "kaleido is not installed (pip install -r requirements.txt)"
    env = os.environ.get("BROWSER_PATH")
    if env:
        return (True, env) if Path(env).exists() else (False, f"$BROWSER_PATH={env} does not exist")
    try:
        from choreographer.browsers.chromium import Chromium
        found = Chromium.find_browser(skip_local=False)
    except Exception:
        found = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                      if shutil.which(n)), None)
    if found:
        return True, found
    return False, ("no Chrome or Chromium found (install one, e.g. apt-get install chromium, or "
                   "point $BROWSER_PATH at it)")


def charts_png_zip(figures: dict[str, go.Figure], width: int = 1200) -> bytes:
    """The figures as PNG files in one zip (one browser start for all of them)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f"{name}.png") for name in figures]
        heights = [int(fig.layout.height or 450) for fig in figures.values()]
        # plotly starts one kaleido browser for the whole list; the figures' own heights are kept
        pio.write_images(list(figures.values()), paths, width=width, height=heights)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for p in paths:
                z.write(p, arcname=os.path.basename(p))
        return buf.getvalue()
