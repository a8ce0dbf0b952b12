"""Dashboard tests: the Live run page under Streamlit's AppTest, and the chart builders.

The database is real SQLite, filled through the engine's own writer (engine.store.Store), so the
page is tested against exactly the rows the engine writes. No mocks.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import time
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from app import charts, data
from engine.store import STAGES, Store

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "streamlit_app.py")
TIMEOUT = 30  # first run imports pandas/plotly (and the engine, when it is there)
RECORDED_BADGE = "Recorded on NVIDIA H200, torch 2.11, Triton 3.6, 2026-11-30"

# (family, state, failed_stage, speedup) per experiment, in seq order
PLAN = [
    ("rmsnorm", "kept", None, 1.5),
    ("rmsnorm", "reverted", None, 1.2),
    ("softmax", "failed", "shape_sweep", None),
    ("rmsnorm", "kept", None, 2.0),
    ("softmax", "kept", None, 1.25),
    ("softmax", "failed", "stability", None),
]


def _verifications(failed_stage):
    rows, failed = [], False
    for stage in STAGES:
        if failed:
            rows.append(dict(stage=stage, status="skipped"))
        elif stage == failed_stage:
            rows.append(dict(stage=stage, status="failed", worst_error=0.5, failed_case="[7, 13]",
                             detail="max abs error 0.5 > tol"))
            failed = True
        else:
            rows.append(dict(stage=stage, status="passed", worst_error=1e-6))
    return rows


def _fill(path: Path, timing_mode: str, plan=PLAN, status="running") -> str:
    s = Store(path)
    try:
        run_id = s.create_run("llama-tiny", {"model": "llama-tiny", "budget_experiments": 40},
                              {"name": "cpu"}, timing_mode, None)
        s.save_profile(run_id, [
            dict(family="rmsnorm", time_us=400.0, fraction=0.4, calls=5, shapes=[], top_ops=[],
                 has_kernel=True),
            dict(family="softmax", time_us=200.0, fraction=0.2, calls=2, shapes=[], top_ops=[],
                 has_kernel=True),
            dict(family="other", time_us=400.0, fraction=0.4, calls=30, shapes=[], top_ops=[],
                 has_kernel=False)], model_time_us=1000.0)
        tids = {f: s.add_target(run_id, f, "float32", [{"shape": [2, 32, 64], "count": 1}], frac)
                for f, frac in (("rmsnorm", 0.4), ("softmax", 0.2))}
        for i, (fam, state, stage, speedup) in enumerate(plan):
            s.record_experiment(dict(
                run_id=run_id, target_id=tids[fam], family=fam, proposer="search",
                hypothesis=f"try {i}: BLOCK_SIZE={64 << i}", source="def kernel_fn(): pass",
                source_hash=f"h{i}", state=state, failed_stage=stage,
                error="mismatch" if stage else None,
                latency_us=None if speedup is None else 100.0 / speedup,
                speedup=speedup, pct_sol=None if speedup is None else 10.0 * speedup,
                timing_mode=timing_mode), _verifications(stage))
            s.event(run_id, f"experiment {i + 1} on {fam}: {state}")
        s.update_run(run_id, current_target="rmsnorm",
                     current_reason="largest Amdahl headroom: f=0.40", status=status)
        if status in ("running", "paused"):
            # an engine holds a running run: this test process, alive, with a fresh heartbeat
            # (a run without one is shown as stopped: engine.store.effective_status)
            s.claim_run(run_id)
        return run_id
    finally:
        s.close()


@pytest.fixture
def db(tmp_path, monkeypatch):
    """A database with an older finished GPU run and a newer running interpreter run."""
    path = tmp_path / "runs.db"
    gpu = _fill(path, "gpu", plan=PLAN[:2], status="done")
    interp = _fill(path, "interpreter")
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    return dict(path=path, gpu=gpu, interp=interp)


def _app() -> AppTest:
    return AppTest.from_file(APP, default_timeout=TIMEOUT)


def _texts(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "warning", "error", "info", "caption", "title")
             for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


def _frame(at: AppTest, first_column: str) -> pd.DataFrame:
    # AppTest does not expose a dataframe's key; the page's tables differ by their first column.
    return next(d.value for d in at.dataframe if d.value.columns[0] == first_column)


def _run_select(at: AppTest):
    """The sidebar's run selector (its key names the database, so it is found by its label)."""
    return next(s for s in at.sidebar.selectbox if s.label == "Run")


def _live_charts(at: AppTest) -> list[dict]:
    """The Live run page's figures: drawn by app/livechart.py's component, whose args carry the
    Plotly figure as JSON."""
    return [json.loads(json.loads(c.proto.json_args)["spec"])
            for c in at.get("component_instance")]


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def _event_log(at: AppTest) -> str:
    """The Live run page's event log: one st.html block (app/live.py's event_log)."""
    return next(h.proto.body for h in at.get("html") if "class='nslog'" in h.proto.body)


# ---- the page ---------------------------------------------------------------------------------
def test_live_page_renders_newest_run(db):
    at = _app().run()
    assert not at.exception, at.exception
    # sidebar: the db path from $NIGHTSHIFT_DB, runs newest first, the newest selected
    assert at.sidebar.text_input(key="db_path_box").value == str(db["path"])
    sel = _run_select(at)
    # newest first; a label says model, status and when, and fits the sidebar
    assert [o.split(" · ")[:2] for o in sel.options] == [["llama-tiny", "running"],
                                                          ["llama-tiny", "done"]]
    assert sel.value == db["interp"]
    assert any(c.value.startswith(db["interp"]) for c in at.sidebar.caption)

    assert _metric(at, "Experiments") == str(len(PLAN))
    assert _metric(at, "Status") == "running"
    # Amdahl: f=0.4 at s=2.0, f=0.2 at s=1.25 -> 1 / (0.4 + 0.2 + 0.16) = 1.316
    assert _metric(at, "Projected model speedup") == "1.316×"

    table = _frame(at, "seq")
    assert list(table.columns) == data.TABLE_COLUMNS
    assert len(table) == len(PLAN)
    assert table["seq"].tolist() == list(range(len(PLAN), 0, -1))  # newest first
    failed = table[table["state"] == "failed"].set_index("seq")["failed_stage"].to_dict()
    assert failed == {3: "shape_sweep", 6: "stability"}

    log = _event_log(at)
    assert log.count("<div><span class='t'>") == len(PLAN)
    # newest first, every message whole
    assert log.index(f"experiment {len(PLAN)} on softmax: failed") < \
        log.index("experiment 1 on rmsnorm: kept")

    text = _texts(at)
    assert data.INTERPRETER_LABEL.lower() in text.lower()
    assert "rmsnorm" in text and "largest Amdahl headroom" in text

    figs = _live_charts(at)
    # the three charts, each with a constant uirevision so a refresh keeps the user's zoom
    assert [f["layout"]["uirevision"] for f in figs] == ["speedup", "amdahl", "stages"]
    assert {t["name"] for t in figs[0]["data"]} == {"best so far", "kept", "reverted", "failed"}


def test_gpu_run_has_no_interpreter_label(db):
    at = _app().run()
    _run_select(at).select(db["gpu"]).run()
    assert not at.exception, at.exception
    assert _metric(at, "Experiments") == "2"
    assert _metric(at, "Status") == "done"
    assert "interpreter" not in _texts(at).lower()
    assert len(_frame(at, "seq")) == 2
    # the choice follows the person to the other pages
    at.switch_page("app/report.py").run()
    assert _run_select(at).value == db["gpu"]
    assert any(db["gpu"] in c.value for c in at.caption)


def test_page_never_writes_to_the_database(db):
    before = hashlib.sha256(db["path"].read_bytes()).hexdigest()
    runs_before = len(Store(db["path"], readonly=True).list_runs())
    at = _app().run()
    assert not at.exception
    assert hashlib.sha256(db["path"].read_bytes()).hexdigest() == before
    assert len(Store(db["path"], readonly=True).list_runs()) == runs_before


def test_missing_database_opens_the_recorded_run(tmp_path, monkeypatch):
    """A fresh machine: the chosen database does not exist, so the pages open the run recorded
    on an H200 (shipped in data/), labelled as recorded, without writing anything anywhere."""
    recorded = ROOT / data.RECORDED_DB
    before = hashlib.sha256(recorded.read_bytes()).hexdigest()
    monkeypatch.setenv("NIGHTSHIFT_DB", str(tmp_path / "nothing-here.db"))
    at = _app().run()
    assert not at.exception, at.exception
    assert not at.error
    assert any("recorded on an NVIDIA H200" in i.value for i in at.sidebar.info)
    assert RECORDED_BADGE in _texts(at)
    assert _metric(at, "Status") == "done" and int(_metric(at, "Experiments")) > 0
    assert "interpreter" not in _texts(at).lower()
    # a recorded run is never continued or steered from here
    assert not {"ctl_stop", "ctl_continue"} & {b.key for b in at.button}
    assert not (tmp_path / "nothing-here.db").exists()  # reading never creates the file
    assert hashlib.sha256(recorded.read_bytes()).hexdigest() == before
    assert not list(recorded.parent.glob(recorded.name + "-*"))  # no -wal / -shm / -journal


def test_bad_start_form_shows_error_and_starts_nothing(db):
    pytest.importorskip("engine.loop", reason="engine/loop.py has not landed yet")
    at = _app().run()
    at.switch_page("app/new_run.py").run()
    assert not at.exception, at.exception
    at.text_input(key="nr_shape").input("2by32")
    at.text_input(key="nr_budget_exp").input("0")
    at.button(key="nr_start").click().run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert any(e.startswith("Input shape:") and "2by32" in e for e in errors), errors
    assert any(e.startswith("Budget:") for e in errors), errors
    # nothing was started: still the same two runs, and still on the New run page
    assert len(Store(db["path"], readonly=True).list_runs()) == 2
    assert at.button(key="nr_start")
    # a sequence longer than the model's context is caught here, not after profiling
    at.text_input(key="nr_shape").input("2x100000")
    at.text_input(key="nr_budget_exp").input("3")
    at.button(key="nr_start").click().run()
    assert [e.value for e in at.error] == [
        "Input shape: sequence length 100000 exceeds llama-tiny's context of 64 tokens."]
    assert len(Store(db["path"], readonly=True).list_runs()) == 2


def test_fresh_run_without_experiments_renders(tmp_path, monkeypatch):
    # what the page sees right after the engine created the run row, before any experiment
    path = tmp_path / "runs.db"
    s = Store(path)
    s.create_run("gpt2-tiny", {"model": "gpt2-tiny"}, {"name": "cpu"}, "interpreter", None)
    s.close()
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = _app().run()
    assert not at.exception, at.exception
    assert _metric(at, "Experiments") == "0"
    assert _metric(at, "Projected model speedup") == "1.000×"
    assert len(_frame(at, "seq")) == 0
    assert "No events yet." in [c.value for c in at.caption]
    assert len(_live_charts(at)) == 3


def test_start_from_the_form_then_stop(tmp_path, monkeypatch):
    """The real engine, started from the form: the new run is selected, this process's engine
    owns it so Stop is offered, and Stop ends it; a stopped run can then be continued."""
    pytest.importorskip("engine.loop", reason="engine/loop.py has not landed yet")
    from app.shared import _engine
    path = tmp_path / "runs.db"
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = _app().run()
    at.switch_page("app/new_run.py").run()
    at.multiselect(key="nr_families").select("rmsnorm")
    at.text_input(key="nr_budget_exp").input("5")
    at.button(key="nr_start").click().run(timeout=120)  # start() returns once profiled
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.title[0].value == "Live run"  # the page switched to watch the new run
    at.switch_page("app/live.py")  # AppTest reruns the page it was last told, not the switch
    runs = Store(path, readonly=True).list_runs()
    assert len(runs) == 1 and runs[0]["model"] == "llama-tiny"
    assert _run_select(at).value == runs[0]["id"]
    engine = _engine()
    # interpreted experiments take 10 s or more each: the run cannot be over yet
    assert engine.status()["state"] in ("starting", "running"), engine.status()
    assert _metric(at, "Status") in ("starting", "running")
    assert {"ctl_stop", "ctl_pause"} <= {b.key for b in at.button}
    at.button(key="ctl_stop").click().run()
    assert not at.exception, at.exception
    deadline = time.monotonic() + 120  # it stops after the step in flight
    while engine.status()["state"] in ("starting", "running", "stopping") and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    assert engine.status()["state"] == "stopped", engine.status()
    at.run()
    assert _metric(at, "Status") == "stopped"
    keys = {b.key for b in at.button}
    assert "ctl_stop" not in keys and "ctl_continue" in keys


def test_app_package_never_imports_triton_nor_writes_sql():
    for f in (ROOT / "app").glob("*.py"):
        src = f.read_text()
        assert not re.search(r"^\s*(import|from)\s+triton\b", src, re.M), f
        assert not re.search(r"\b(INSERT|UPDATE|DELETE|CREATE|DROP|ALTER)\s", src), f
    assert not re.search(r"plotly", (ROOT / "streamlit_app.py").read_text())


# ---- data and chart builders ------------------------------------------------------------------
TARGET_IDS = {"rmsnorm": 1, "softmax": 2}


def _exps(rows) -> pd.DataFrame:
    return pd.DataFrame([dict(seq=i + 1, family=f, target_id=TARGET_IDS[f], state=s,
                              failed_stage=st, speedup=sp, hypothesis=f"h{i}", error=None,
                              created_at=1000.0 + i)
                         for i, (f, s, st, sp) in enumerate(rows)])


TARGETS = pd.DataFrame([dict(id=1, family="rmsnorm", fraction=0.4),
                        dict(id=2, family="softmax", fraction=0.2)])


def test_amdahl_math():
    assert data.amdahl({"a": 0.5}, {"a": 2.0}) == pytest.approx(4 / 3)
    assert data.amdahl({"a": 0.5}, {}) == 1.0
    assert data.amdahl({"a": 0.5}, {"a": 0.5}) == 1.0  # slower than reference: not used
    assert data.amdahl({"a": 0.3, "b": 0.2}, {"a": 3.0, "b": 2.0}) == pytest.approx(1 / 0.7)
    assert data.amdahl_limit(TARGETS) == pytest.approx(1 / 0.4)


def test_amdahl_projection_from_experiments():
    proj = data.amdahl_projection(_exps(PLAN), TARGETS)
    assert proj["seq"].tolist() == [0, 1, 2, 3, 4, 5, 6]
    f, g = 0.4, 0.2
    expect = [1.0,
              1 / ((1 - f - g) + f / 1.5 + g),          # rmsnorm kept at 1.5
              1 / ((1 - f - g) + f / 1.5 + g),          # reverted: no change
              1 / ((1 - f - g) + f / 1.5 + g),          # failed: no change
              1 / ((1 - f - g) + f / 2.0 + g),          # rmsnorm kept at 2.0
              1 / ((1 - f - g) + f / 2.0 + g / 1.25),   # softmax kept at 1.25
              1 / ((1 - f - g) + f / 2.0 + g / 1.25)]
    assert proj["projected"].tolist() == pytest.approx(expect)
    # one family at half the model's time, made 2x faster -> 1.333x
    one = data.amdahl_projection(_exps([("rmsnorm", "kept", None, 2.0)]),
                                 pd.DataFrame([dict(id=1, family="rmsnorm", fraction=0.5)]))
    assert one["projected"].iloc[-1] == pytest.approx(1.3333, abs=1e-4)


def test_the_projection_is_against_the_faster_of_eager_and_compile():
    """A kernel 2x faster than eager where torch.compile of the op is 4x faster does not count
    (the engine does not place it); one 8x faster than eager is 2x the baseline, over the
    target's share of the model's time under that baseline (half its eager share here)."""
    comp = pd.DataFrame([dict(id=1, family="rmsnorm", fraction=0.4, ref_latency_us=100.0,
                              compile_latency_us=25.0)])
    assert data.amdahl_projection(_exps([("rmsnorm", "kept", None, 2.0)]), comp)[
        "projected"].iloc[-1] == pytest.approx(1.0)
    f = 0.4 * 0.25
    assert data.amdahl_projection(_exps([("rmsnorm", "kept", None, 8.0)]), comp)[
        "projected"].iloc[-1] == pytest.approx(1 / ((1 - f) + f / 2.0))
    rows = comp.to_dict("records")
    assert data.projected_final([dict(rows[0], speedup=2.0)]) == pytest.approx(1.0)
    assert data.projected_final([dict(rows[0], speedup=8.0)]) == pytest.approx(1 / ((1 - f) + f / 2.0))
    assert data.amdahl_limit(comp) == pytest.approx(1 / (1 - f))
    # compile not timed yet: eager is the baseline
    assert data.to_baseline({"ref_latency_us": 100.0, "compile_latency_us": None}) == 1.0


def test_best_so_far_only_counts_kept_and_carries_forward():
    best = data.best_so_far(_exps([
        ("rmsnorm", "reverted", None, 3.0),   # never kept: not a best
        ("rmsnorm", "kept", None, 1.5),
        ("rmsnorm", "failed", "smoke", None),
        ("rmsnorm", "kept", None, 1.2),       # kept but worse than the best: best stays
        ("rmsnorm", "kept", None, 2.0)]))
    vals = best["best"].tolist()
    assert pd.isna(vals[0]) and vals[1:] == [1.5, 1.5, 1.5, 2.0]


def test_speedup_figure():
    exps = _exps(PLAN)
    fig = charts.speedup_figure(exps, data.best_so_far(exps), interpreter=True)
    assert isinstance(fig, go.Figure)
    assert fig.layout.uirevision == "speedup"
    assert data.INTERPRETER_LABEL in fig.layout.title.text
    titles = [a.text for a in fig.layout.annotations]
    assert "rmsnorm" in titles and "softmax" in titles  # one facet per family
    by_name = {}
    for t in fig.data:
        if t.showlegend is False:          # the drawn traces; legend entries are drawn nowhere
            by_name.setdefault(t.name, []).append(t)
    assert set(by_name) == {"best so far", "kept", "reverted", "failed"}
    assert len(by_name["best so far"]) == 2    # one per facet
    # one legend entry per kind, for every facet
    assert sorted(t.name for t in fig.data if t.showlegend is not False) == \
        ["best so far", "failed", "kept", "reverted"]
    failed = by_name["failed"][0]
    # no valid speedup: drawn on a floor under every real value of the log axis
    assert list(failed.y) == [0.5, 0.5]  # lowest value is the 1x baseline -> floor 0.5
    assert all(fig.layout[f"yaxis{i}"].type == "log" for i in ("", "2"))
    assert [h.split("</b>")[0] for h in failed.hovertext] == ["<b>failed at shape_sweep",
                                                             "<b>failed at stability"]
    assert "%{hovertext}" in failed.hovertemplate
    # baseline at 1x in each facet
    assert sum(1 for s in fig.layout.shapes if s.y0 == 1.0 and s.y1 == 1.0) == 2
    # a GPU run's chart carries no interpreter label
    gpu = charts.speedup_figure(exps, data.best_so_far(exps), interpreter=False)
    assert data.INTERPRETER_LABEL not in gpu.layout.title.text


def test_the_speedup_figure_draws_torch_compiles_line_per_target():
    """Per facet, torch.compile's speedup over eager of the target's op: the line a kernel must
    also clear (an rmsnorm 5.9x faster than eager is still slower than compile's 6.0x)."""
    exps = _exps([("rmsnorm", "kept", None, 5.9), ("softmax", "kept", None, 1.3)])
    targets = pd.DataFrame([dict(id=1, ref_latency_us=1102.0, compile_latency_us=182.3),
                            dict(id=2, ref_latency_us=50.0, compile_latency_us=None)])
    comp = data.compile_speedups(targets)
    assert comp == {1: pytest.approx(1102.0 / 182.3)}          # softmax: compile not timed
    fig = charts.speedup_figure(exps, data.best_so_far(exps), names={1: "rmsnorm", 2: "softmax"},
                                compile_x=comp)
    lines = [(sh.yref, sh.y0) for sh in fig.layout.shapes if sh.line.color == charts.COMPILE_COLOUR]
    assert lines == [("y", pytest.approx(6.045, abs=1e-3))]     # rmsnorm's facet only
    assert any(a.text.startswith("torch.compile 6.04") for a in fig.layout.annotations)
    assert fig.layout.yaxis.range[1] >= math.log10(6.045)       # the line is inside the axis
    spec, _ = charts.speedup_spec(exps, data.best_so_far(exps), False, {1: "rmsnorm", 2: "softmax"},
                                  {}, {}, comp)
    assert "torch.compile 6.04" in spec


def test_speedup_figure_empty():
    empty = pd.DataFrame(columns=data.EXPERIMENT_FIELDS)
    fig = charts.speedup_figure(empty, data.best_so_far(empty))
    assert fig.layout.uirevision == "speedup" and not fig.data


def test_amdahl_figure():
    proj = data.amdahl_projection(_exps(PLAN), TARGETS)
    fig = charts.amdahl_figure(proj, data.amdahl_limit(TARGETS), interpreter=True)
    assert fig.layout.uirevision == "amdahl"
    assert list(fig.data[0].y) == pytest.approx(proj["projected"].tolist())
    assert fig.data[0].line.shape == "hv"
    assert data.INTERPRETER_LABEL in fig.layout.title.text
    # the limit (2.5x) is far above a projection that reaches 1.316x: the axis follows the
    # data, and the limit is written at the top instead of squashing the line to the bottom
    assert [s.y0 for s in fig.layout.shapes] == [1.0]
    assert fig.layout.yaxis.range[1] < 1.5
    assert any(a.text == "Amdahl limit 2.500× (off the top of the axis)"
               for a in fig.layout.annotations)
    # a limit near the data is drawn as a line, inside the axis
    near = charts.amdahl_figure(proj, 1.5)
    assert sorted(s.y0 for s in near.layout.shapes) == pytest.approx([1.0, 1.5])
    assert near.layout.yaxis.range[1] > 1.5


def test_amdahl_figure_with_a_73x_limit_keeps_the_projection_readable():
    """Targets covering 98.6% of the model: the limit is 73x. The projection (1.0 to 1.1) must
    fill the plot, not be a line at the bottom of a 0-73 axis."""
    proj = pd.DataFrame(dict(seq=[0, 1, 2], created_at=[None, 1.0, 2.0],
                             projected=[1.0, 1.05, 1.1], family=[None, "matmul", "matmul"]))
    fig = charts.amdahl_figure(proj, 1 / (1 - 0.9863))
    lo, hi = fig.layout.yaxis.range
    assert lo < 1.0 and 1.1 < hi < 1.2
    assert (1.1 - 1.0) / (hi - lo) > 0.5   # the projection spans most of the plot's height
    assert any("73.0×" in a.text for a in fig.layout.annotations)


def test_stage_figure_stacks_outcomes_in_pipeline_order():
    outcomes = pd.DataFrame([
        dict(stage="smoke", status="passed", n=5), dict(stage="smoke", status="failed", n=1),
        dict(stage="shape_sweep", status="passed", n=4), dict(stage="shape_sweep", status="skipped", n=2),
        dict(stage="stability", status="slower", n=3), dict(stage="static", status="failed", n=1)])
    fig = charts.stage_figure(outcomes)
    assert fig.layout.barmode == "stack" and fig.layout.uirevision == "stages"
    # horizontal bars, stages in pipeline order from the top: a label is never cut or turned
    assert all(t.orientation == "h" for t in fig.data)
    assert fig.layout.yaxis.autorange == "reversed"
    bars = {t.name: dict(zip(t.y, t.x)) for t in fig.data}
    assert set(bars) == {"passed", "failed", "skipped", "not run (slower)"}
    assert list(fig.data[0].y) == [s.replace("_", " ") for s in STAGES] + ["static"]
    assert bars["passed"]["smoke"] == 5 and bars["failed"]["smoke"] == 1
    assert bars["skipped"]["shape sweep"] == 2 and bars["passed"]["edge cases"] == 0
    assert bars["failed"]["static"] == 1
    assert bars["not run (slower)"]["stability"] == 3 and bars["not run (slower)"]["smoke"] == 0


def test_stage_outcomes_from_store(db):
    store = Store(db["path"], readonly=True)
    out = data.stage_outcomes_frame(store, db["interp"])
    total = out.groupby("stage")["n"].sum()
    assert (total.reindex(list(STAGES)) == len(PLAN)).all()  # every stage recorded per experiment
    fig = charts.stage_figure(out)
    bars = {t.name: dict(zip(t.y, t.x)) for t in fig.data}
    assert bars["failed"]["shape sweep"] == 1 and bars["failed"]["stability"] == 1
    assert bars["skipped"]["edge cases"] == 2


def test_experiments_frame_reads_incrementally(db):
    store = Store(db["path"], readonly=True)
    cache: dict = {}
    first = data.experiments_frame(store, db["interp"], cache)
    assert len(first) == len(PLAN) and "source" not in first.columns
    w = Store(db["path"])
    tid = w.targets(db["interp"])[0]["id"]
    w.record_experiment(dict(run_id=db["interp"], target_id=tid, family="rmsnorm",
                             proposer="search", hypothesis="new", source="x", source_hash="n",
                             state="reverted", speedup=1.1, timing_mode="interpreter"), [])
    w.close()
    second = data.experiments_frame(store, db["interp"], cache)
    assert second["seq"].tolist() == list(range(1, len(PLAN) + 2))
    assert cache["last_id"] == second["id"].max()


def test_the_live_speedup_spec_is_the_figure_and_is_remade_per_target():
    """speedup_spec (the Live run page's JSON) draws what speedup_figure draws, and after one
    new experiment it remakes only the traces of the target that got it."""
    import json
    exps = _exps(PLAN)
    names = {1: "rmsnorm", 2: "softmax"}
    cache: dict = {}
    from app import livechart
    spec, height = charts.speedup_spec(exps, data.best_so_far(exps), True, names, cache,
                                       livechart.look())
    fig = charts.speedup_figure(exps, data.best_so_far(exps), True, names)
    got = json.loads(spec)
    assert height == fig.layout.height
    assert [(t["name"], len(t["x"])) for t in got["data"]] == \
        [(t.name, len(t.x)) for t in fig.data]
    assert got["layout"]["yaxis"]["range"] == list(fig.layout.yaxis.range)
    assert got["layout"]["template"] == {} and got["layout"]["uirevision"] == "speedup"
    kept = {tid: text for tid, (key, text) in cache.items() if tid != "_layout"}
    more = pd.concat([exps, _exps(PLAN + [("softmax", "reverted", None, 1.1)]).iloc[[-1]]],
                     ignore_index=True)
    spec2, _ = charts.speedup_spec(more, data.best_so_far(more), True, names, cache,
                                   livechart.look())
    assert cache[1][1] is kept[1]            # rmsnorm's traces reused as they were
    assert cache[2][1] != kept[2]            # softmax's remade with its new point
    assert sum(len(t["x"]) for t in json.loads(spec2)["data"] if t["mode"] == "markers"
               and t["x"] != [None]) == len(PLAN) + 1
