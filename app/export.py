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

from app import data, fmt

def summary_table(summary: pd.DataFrame, interpreter: bool) -> pd.DataFrame:
    """The per-target table as people read it: formatted strings (app/fmt.py), readable
    headers, times per forward pass (every call of the op in one forward), and what the best
    kernel is against the faster of its two baselines: a kernel slower than eager or
    torch.compile says so instead of passing for a win."""
    tag = " (interpreter)" if interpreter else ""
    return pd.DataFrame({
        "target": summary["name"], "dtype": summary["dtype"],
        "share of model time": summary["fraction"].map(fmt.share),
        "experiments": summary["experiments"], "kept": summary["kept"],
        "failed": summary["failed"],
        "eager per forward" + tag: summary["eager_us"].map(fmt.us),
        "torch.compile per forward" + tag: summary["compile_us"].map(
            lambda v: fmt.us(v) if pd.notna(v) else "not timed"),
        "best per forward" + tag: summary["best_us"].map(fmt.us),
        "vs eager" + tag: summary["speedup"].map(fmt.ratio),
        "vs torch.compile" + tag: summary["vs_compile"].map(fmt.ratio),
        "best kernel": summary["verdict"],
        "% of speed of light": summary["pct_sol"].map(fmt.pct),
        "found at experiment": summary["best_seq"].map(
            lambda v: f"#{int(v)}" if pd.notna(v) else fmt.MISSING),
    })


# Integer columns of the experiments CSV: nullable integers, so a missing parent is empty and
# an id is "3", never "3.0"
CSV_INTS = ("id", "seq", "target_id", "parent_id", "tokens_in", "tokens_out", "attempts")
CSV_TIMES = ("created_at",)


def _iso(seconds: pd.Series) -> pd.Series:
    t = pd.to_datetime(pd.to_numeric(seconds, errors="coerce"), unit="s", utc=True)
    return t.dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ").str.replace(r"\.(\d{3})\d{3}Z$", r".\1Z",
                                                                 regex=True)


def experiments_csv(rep: dict) -> bytes:
    """Every experiment of the run (without the kernel sources), one row each, with the run id
    and model so CSVs of several runs can be concatenated. Times are ISO 8601 in UTC, ids are
    integers, latencies are µs per forward pass."""
    exps = rep["exps"].copy()
    for c in CSV_INTS:
        if c in exps:
            exps[c] = pd.to_numeric(exps[c], errors="coerce").astype("Int64")
    for c in CSV_TIMES:
        if c in exps:
            exps[c] = _iso(exps[c])
    exps = exps.rename(columns={"latency_us": "latency_us_per_forward"})
    exps.insert(0, "model", rep["run"]["model"])
    exps.insert(0, "run_id", rep["run"]["id"])
    return exps.to_csv(index=False).encode()


def compare_csv(rows: pd.DataFrame) -> bytes:
    """The comparison's per-family table, one row per (run, family)."""
    out = rows.rename(columns={"run": "run_label", "speedup": "vs_eager",
                               "best_us": "best_us_per_forward",
                               "eager_us": "eager_us_per_forward"})
    return out.to_csv(index=False).encode()


def report_caption(rep: dict) -> str:
    """What a chart taken out of the report must carry: model, device, run, date."""
    run = rep["run"]
    day = dt.datetime.fromtimestamp(run["created_at"], dt.timezone.utc).strftime("%Y-%m-%d")
    dev = data.as_dict(run.get("device")).get("name") or "?"
    mode = " (interpreter timing)" if rep["interpreter"] else ""
    return f"{run['model']} on {dev}{mode} · run {run['id']} · {day}"


def compare_caption(loaded: dict) -> str:
    return "; ".join(f"{label}, {report_caption(d).split(' · ')[-1]}"
                     for label, d in loaded.items())


def titled(figures: dict[str, go.Figure], caption: str) -> dict[str, go.Figure]:
    """Copies of the figures whose titles carry ``caption`` on a second line, for files that
    leave the dashboard (PNG): a chart on a slide still says which run, model, GPU and day."""
    out = {}
    for name, fig in figures.items():
        f = go.Figure(fig)
        text = (f.layout.title.text or "") if f.layout.title else ""
        f.update_layout(title=dict(text=f"{text}<br><sup>{html.escape(caption)}</sup>", x=0,
                                   xanchor="left"),
                        margin=dict(t=max(100, int((f.layout.margin.t or 60) + 30))))
        out[name] = f
    return out


def _facts_html(facts) -> str:
    e = html.escape
    return "<table class='facts'>" + "".join(
        f"<tr><th>{e(str(k))}</th><td>{e(str(v))}</td></tr>" for k, v in facts) + "</table>"


def _charts_html(figures: dict[str, go.Figure]) -> str:
    return "\n".join(
        f"<section class='chart'>{fig.to_html(full_html=False, include_plotlyjs=False, div_id=f'chart-{name}', config={'displaylogo': False})}</section>"  # noqa: E501
        for name, fig in figures.items())


def _page(title: str, body: str) -> str:
    """A self-contained HTML page: plotly.js inline once, our CSS; no external script, style
    or font."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{REPORT_CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
{body}
<footer>Made by nightshift's dashboard from its SQLite record of the runs. Every kernel counted
here passed the verifier's five stages before it was timed.</footer>
</body></html>
"""


def report_html(rep: dict, figures: dict[str, go.Figure]) -> str:
    """The report as one self-contained HTML page: the headline as the Report page says it, the
    run's facts, the per-target table and the charts as live Plotly figures."""
    run, head = rep["run"], data.headline(rep)
    badge = data.recorded_label(run)
    created = dt.datetime.fromtimestamp(run["created_at"], dt.timezone.utc)
    exps = rep["exps"]
    counts = exps["state"].value_counts() if not exps.empty else pd.Series(dtype=int)
    cfg = run.get("config") or {}
    facts = [("model", run["model"]), ("device", data.device_label(run)),
             ("proposer", cfg.get("proposer", "search")), ("dtype", rep.get("dtype")),
             ("input", cfg.get("input_shape") or "default"), ("status", run["status"]),
             ("started", created.strftime("%Y-%m-%d %H:%M UTC")),
             ("duration", fmt.duration(data.elapsed_s(run))),
             ("experiments", f"{len(exps)} ({int(counts.get('kept', 0))} kept, "
                             f"{int(counts.get('reverted', 0))} reverted, "
                             f"{int(counts.get('failed', 0))} failed)")]
    ceil = run.get("ceilings") or {}
    if ceil.get("copy_gbps"):
        facts.append(("measured roofs", f"copy {ceil['copy_gbps']:,.0f} GB/s, bf16 matmul "
                                        f"{ceil.get('matmul_tflops', 0):,.0f} TFLOP/s"))
    table = summary_table(rep["summary"], rep["interpreter"]).to_html(
        index=False, border=0, classes="tbl", escape=True)
    e = html.escape
    warn = ("<p class='warn'>Interpreter timing — not GPU performance: this run had no GPU; its "
            "kernels ran under Triton's CPU interpreter, so its times only compare candidates "
            "with each other.</p>") if rep["interpreter"] else ""
    body = f"""<header><h1>nightshift report: {e(run['model'])}</h1>
<p class="sub">run {e(run['id'])}{' · <span class="badge">' + e(badge) + '</span>' if badge else ''}</p></header>
<section class="headline {head['kind']}"><div class="label">{e(head['label'])}</div>
<div class="value">{e(head['text'])}</div><div class="note">{e(head['note'])}</div></section>
{warn}
{_facts_html(facts)}
<h2>Per target</h2>
{table}
<h2>Charts</h2>
{_charts_html(figures)}"""
    return _page(f"nightshift report · {run['model']} · {run['id']}", body)


def compare_html(loaded: dict, figures: dict[str, go.Figure], overview: pd.DataFrame,
                 rows: pd.DataFrame) -> str:
    """The Compare runs page as one self-contained HTML file: the runs' facts side by side, the
    per-family speedups and the charts."""
    per_family = rows.pivot_table(index="family", columns="run", values="speedup",
                                  aggfunc="first").map(fmt.ratio)
    interp = [d["interpreter"] for d in loaded.values()]
    warn = ("<p class='warn'>These runs were timed differently: interpreter speedups only "
            "compare candidates with each other, not GPU performance.</p>"
            if any(interp) and not all(interp) else "")
    body = f"""<header><h1>nightshift: {len(loaded)} runs compared</h1>
<p class="sub">{html.escape(compare_caption(loaded))}</p></header>
{warn}
<h2>Runs</h2>
{overview.to_html(border=0, classes="tbl", escape=True)}
<h2>Best kernel per family, over eager</h2>
{per_family.to_html(border=0, classes="tbl", escape=True, na_rep=fmt.MISSING)}
<h2>Charts</h2>
{_charts_html(figures)}"""
    return _page("nightshift comparison", body)


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


def charts_png_zip(figures: dict[str, go.Figure], width: int = 1200, scale: float = 2) -> bytes:
    """The figures as PNG files in one zip (one browser start for all of them), at ``scale``
    times their CSS size (2: sharp on a slide or a high-density screen)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f"{name}.png") for name in figures]
        heights = [int(fig.layout.height or 450) for fig in figures.values()]
        # plotly starts one kaleido browser for the whole list; the figures' own heights are kept
        pio.write_images(list(figures.values()), paths, width=width, height=heights,
                         scale=scale)
        # under load kaleido has returned with a file unwritten (a render that timed out in
        # the browser): each missing one is rendered again on its own, once
        for fig, p, h in zip(figures.values(), paths, heights):
            if not os.path.exists(p):
                pio.write_image(fig, p, width=width, height=h, scale=scale)
            if not os.path.exists(p):
                raise RuntimeError(f"kaleido wrote no PNG for the chart {os.path.basename(p)[:-4]!r}")
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for p in paths:
                z.write(p, arcname=os.path.basename(p))
        return buf.getvalue()
