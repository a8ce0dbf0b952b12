"""Dashboard pages besides the live view: New run, Kernels, Compare runs, Report, the recorded
run, and the report's exports. AppTest against real SQLite written through engine.store.Store
(and the recorded H200 database shipped in data/, opened read-only). No mocks.
"""
from __future__ import annotations

import hashlib
import io
import json
import zipfile

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app import data, export
from app import report as report_page
from engine.store import Store
from test_app import (APP, PLAN, RECORDED_BADGE, ROOT, TIMEOUT, _fill, _frame, _metric,
                      _run_select, _texts)

RECORDED = ROOT / data.RECORDED_DB
GPT2 = "20261130-030352-e079e8"    # the recorded gpt2 run: 16 experiments, 3 targets
LLAMA = "20261130-030304-a8b2d6"   # the recorded llama run: 2 experiments


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def recorded(monkeypatch):
    """The sidebar pointed straight at the recorded database; the test checks it is untouched."""
    before = _sha(RECORDED)
    monkeypatch.setenv("NIGHTSHIFT_DB", str(RECORDED))
    yield RECORDED
    assert _sha(RECORDED) == before, "a page wrote to the recorded database"


@pytest.fixture
def db(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    gpu = _fill(path, "gpu", plan=PLAN[:2], status="done")
    interp = _fill(path, "interpreter")
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    return dict(path=path, gpu=gpu, interp=interp)


def _page(path: str, run_id: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    if run_id:
        _run_select(at).select(run_id).run()
    at.switch_page(path).run()
    assert not at.exception, at.exception
    return at


def _add_e2e(path, run_id, checks, flags=None):
    """End-to-end checks as engine/integrate.py records them: (status, eager us, optimized us),
    with the family flags it writes (default: rmsnorm's kernel in the model, "ok")."""
    flags = {"rmsnorm": "ok"} if flags is None else flags
    s = Store(path)
    try:
        for status, eager, opt in checks:
            used = [dict(family=f, kernel=f"{f}#1", calls=1 if v == "ok" else 0, fallthrough=0,
                         swapped=[]) for f, v in flags.items()]
            s.add_e2e_check(run_id, "check", status, 1e-6, 1e-3, "", used, flags, timings=[
                dict(variant="eager", latency_us=eager, timing_mode="interpreter"),
                dict(variant="optimized", latency_us=opt, timing_mode="interpreter")])
    finally:
        s.close()


# ---- the recorded run -------------------------------------------------------------------------
def test_recorded_badge_text():
    store = data.open_store(str(RECORDED))
    try:
        runs = {r["id"]: data.get_run(store, r["id"]) for r in data.list_runs(store)}
    finally:
        store.close()
    assert set(runs) == {GPT2, LLAMA}
    assert {data.recorded_label(r) for r in runs.values()} == {RECORDED_BADGE}
    assert data.recorded_label(dict(runs[GPT2], recorded=0)) is None


def test_every_page_renders_the_recorded_run_read_only(recorded):
    for path in ("app/live.py", "app/kernel_page.py", "app/compare.py", "app/report.py",
                 "app/new_run.py"):
        at = _page(path)
        assert not at.error, (path, [e.value for e in at.error])
        if path != "app/new_run.py":
            assert RECORDED_BADGE in _texts(at), path


def test_live_page_says_when_the_measured_speedup_is_another_gpus(monkeypatch):
    """data/recorded_h200_gpt2_bert.db: BERT's kernels were found on the H200 and its latest
    end-to-end check timed on an H100; the Live page's measured figure says so in plain view."""
    path = ROOT / "data" / "recorded_h200_gpt2_bert.db"
    before = _sha(path)
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = _page("app/live.py", "20261205-172403-26b958")
    assert not at.error, [e.value for e in at.error]
    assert any(i.value.startswith("The measured model speedup was timed on NVIDIA H100 80GB HBM3")
               and "found and tuned on NVIDIA H200" in i.value for i in at.info)
    assert _sha(path) == before


# ---- New run ----------------------------------------------------------------------------------
def test_new_run_file_model_without_loader(db):
    from app import new_run
    at = _page("app/new_run.py")
    at.radio(key="nr_source").set_value(new_run.PATH).run()
    at.text_input(key="nr_path").input("models/mine.py:MyModel").run()
    if new_run.file_loader() is not None:
        pytest.skip("engine.models can load models from files in this checkout")
    assert any("loading models from files is not available yet" in e.value.lower()
               for e in at.error)
    at.button(key="nr_start").click().run()
    assert not at.exception, at.exception
    assert any(e.value == "Loading models from files is not available yet." for e in at.error)
    assert len(Store(db["path"], readonly=True).list_runs()) == 2  # nothing started
    # the upload input is offered too, with the same answer
    at.radio(key="nr_source").set_value(new_run.UPLOAD).run()
    assert at.get("file_uploader") and at.text_input(key="nr_upload_class")


TINY_MODEL = """import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        return torch.softmax(self.norm(x), dim=-1)


def get_inputs():
    return [torch.randn(4, 64)]
"""


def test_new_run_file_model_with_loader(db, tmp_path):
    from app import new_run
    if new_run.file_loader() is None:
        pytest.skip("engine.models has no loader for model files in this checkout")
    at = _page("app/new_run.py")
    at.radio(key="nr_source").set_value(new_run.PATH).run()
    assert not at.error  # the engine can load files: no "not available" message
    at.text_input(key="nr_path").input(str(tmp_path / "missing.py") + ":Net").run()
    at.button(key="nr_start").click().run()
    assert [e.value for e in at.error] == [f"Model file: no file at {tmp_path / 'missing.py'}."]
    model = tmp_path / "tiny_model.py"
    model.write_text(TINY_MODEL)
    at.text_input(key="nr_path").input(f"{model}:Missing").run()
    at.button(key="nr_start").click().run()
    assert len(at.error) == 1 and "Missing" in at.error[0].value  # the engine's own check
    assert len(Store(db["path"], readonly=True).list_runs()) == 2  # nothing started
    # a good file gives a config naming it (checking it starts nothing)
    cfg, errors = new_run.config_from_inputs(
        {"nr_source": new_run.PATH, "nr_path": f"{model}:Net", "nr_budget_exp": 2,
         "nr_verify_order": "bench-first"}, str(db["path"]))
    assert errors == [] and cfg.model == f"{model}:Net" and cfg.verify_order == "bench-first"
    from engine.verify import VERIFY_ORDERS
    assert new_run.VERIFY_ORDERS == VERIFY_ORDERS


def test_new_run_llm_inputs_are_checked_and_the_key_never_shown(db, monkeypatch):
    from app import new_run
    secret = "sk-test-do-not-show-0123456789"
    monkeypatch.setenv("NIGHTSHIFT_LLM_API_KEY", secret)
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    at = _page("app/new_run.py")
    llm, why = new_run.llm_support()
    if llm is None:  # no LLM proposer in this checkout: the choice is there, disabled, with why
        radio = at.radio(key="nr_proposer")
        assert radio.disabled and radio.value == "search"
        assert any("Only the built-in search" in c.value for c in at.caption)
        return
    at.radio(key="nr_proposer").set_value("llm").run()
    assert any("found in $NIGHTSHIFT_LLM_API_KEY (not shown)" in c.value for c in at.caption)
    at.text_input(key="nr_api_base").input("localhost:1234").run()
    at.button(key="nr_start").click().run()
    errors = [e.value for e in at.error]
    assert any(e.startswith("LLM model:") for e in errors), errors
    assert any(e.startswith("API base:") for e in errors), errors
    assert secret not in _texts(at)
    assert len(Store(db["path"], readonly=True).list_runs()) == 2


# ---- Live run: filters, LLM columns, measured end-to-end ---------------------------------------
def test_live_table_filters(db):
    at = _page("app/live.py")
    at.multiselect(key="flt_state").select("failed").run()
    table = _frame(at, "seq")
    assert table["state"].tolist() == ["failed", "failed"]
    assert any("2 of 6 experiments" in c.value for c in at.caption)
    at.multiselect(key="flt_state").unselect("failed").run()
    at.text_input(key="flt_text").input("stability").run()
    assert _frame(at, "seq")["seq"].tolist() == [6]
    at.text_input(key="flt_text").input("").run()
    # by target id: the options are the run's targets, shown by name
    softmax = next(t["id"] for t in Store(db["path"], readonly=True).targets(db["interp"])
                   if t["family"] == "softmax")
    at.multiselect(key="flt_target").select(softmax).run()
    assert set(_frame(at, "seq")["family"]) == {"softmax"}
    assert _metric(at, "Experiments") == str(len(PLAN))  # the metrics count every experiment


def test_live_llm_run_shows_tokens_and_cost(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    s = Store(path)
    run_id = s.create_run("llama-tiny", {"model": "llama-tiny", "proposer": "llm"},
                          {"name": "cpu"}, "interpreter", None)
    tid = s.add_target(run_id, "rmsnorm", "float32", [{"shape": [2, 32, 64], "count": 1}], 0.5)
    for i, (state, tin, tout, cost) in enumerate([("kept", 1200, 300, 0.01),
                                                  ("failed", 1500, 420, 0.02)]):
        s.record_experiment(dict(run_id=run_id, target_id=tid, family="rmsnorm", proposer="llm",
                                 hypothesis=f"llm idea {i}", source="x", source_hash=f"s{i}",
                                 state=state, failed_stage=None if state == "kept" else "proposal",
                                 speedup=1.5 if state == "kept" else None, tokens_in=tin,
                                 tokens_out=tout, cost_usd=cost, timing_mode="interpreter"), [])
    s.close()
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = _page("app/live.py")
    assert _metric(at, "Tokens in / out") == "2,700 / 720"
    assert _metric(at, "LLM cost") == "$0.03"
    table = _frame(at, "seq")
    assert {"tokens_in", "tokens_out", "cost_usd", "proposer"} <= set(table.columns)
    assert table["tokens_in"].tolist() == [1500, 1200]


def test_search_run_has_no_token_columns(db):
    at = _page("app/live.py")
    assert "tokens_in" not in _frame(at, "seq").columns
    assert not [m for m in at.metric if m.label in ("Tokens in / out", "LLM cost")]


def test_measured_end_to_end_is_shown_when_it_exists(db):
    store = Store(db["path"], readonly=True)
    assert data.e2e_frame(store, db["interp"]).empty  # no e2e_checks table yet: nothing, no error
    store.close()
    # a check whose outputs did not match is not a result: only the matched ones count
    _add_e2e(db["path"], db["interp"], [("passed", 1050.0, 1000.0), ("failed", 900.0, 300.0),
                                        ("passed", 1200.0, 1000.0)])
    at = _page("app/live.py")
    assert _metric(at, "Measured model speedup") == "1.200×"
    at.switch_page("app/report.py").run()
    head = at.metric[0]
    assert head.label.startswith("Measured end-to-end speedup") and head.value == "1.200×"
    assert "rmsnorm swapped in" in next(c.value for c in at.caption if "swapped in" in c.value)
    rep = _report(db["path"], db["interp"])
    fig = report_page.figures(rep)["end_to_end"]
    measured = [t for t in fig.data if t.name == "measured"]
    assert measured and list(measured[0].y) == pytest.approx([1.05, 1.2])
    assert list(measured[0].x) == [len(PLAN), len(PLAN)]  # both after the last experiment


def test_a_check_without_a_kernel_in_the_model_is_not_a_measurement(db):
    """The only kept kernel was left out of the model (slower): the check timed the original
    model twice. Its ratio is not a result: the headline says "not measured" and why."""
    _add_e2e(db["path"], db["interp"], [("passed", 1000.0, 1000.0)], flags={"rmsnorm": "slower"})
    rep = _report(db["path"], db["interp"])
    assert rep["measured"].empty
    head = data.headline(rep)
    assert head["kind"] == "not_measured" and head["value"] is None
    assert "rmsnorm: the model ran slower with it" in head["note"]
    at = _page("app/report.py", db["interp"])
    assert at.metric[0].value == "not measured"
    at.switch_page("app/live.py").run()
    assert _metric(at, "Projected model speedup") == "1.316×"


def _target_id(path, run_id, family) -> int:
    store = Store(path, readonly=True)
    try:
        return next(t["id"] for t in store.targets(run_id) if t["family"] == family)
    finally:
        store.close()


def _roofline(at):
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    return [s for s in specs if any(t.get("name") == "measured roofs" for t in s["data"])]


# ---- Kernels ----------------------------------------------------------------------------------
def test_kernels_page_on_the_recorded_gpu_run(recorded):
    at = _page("app/kernel_page.py")
    # the largest share first, chosen by target id
    assert at.selectbox(key="k_target").value == _target_id(RECORDED, GPT2, "softmax")
    assert _metric(at, "Share of model time") == "12.1%"
    assert _metric(at, "Best vs eager") == "1.580×"
    # baseline (first experiment) against best (#16) as a unified diff
    code = at.code[0]
    assert code.language == "diff" and "--- #1 (kept)" in code.value and "+++ #16 (kept)" in code.value
    shapes = _frame(at, "shape")
    assert shapes["shape"].tolist() == ["8x12x1024x1024"]
    assert shapes["best speedup"].iloc[0] == pytest.approx(156.384 / 99.0, rel=1e-3)
    roof = _roofline(at)
    assert len(roof) == 1  # the roofline, under the roofs the run measured
    spec = roof[0]
    assert "copy 4,192 GB/s" in [a["text"] for a in spec["layout"]["annotations"]]
    names = [t["name"] for t in spec["data"]]
    assert names[0] == "measured roofs" and "eager" in names and "best" in names
    stages = [d.value for d in at.dataframe if d.value.columns[0] == "stage"]
    assert len(stages) == 2 and all((s["status"] == "passed").all() for s in stages)
    # side by side, and another target
    at.radio(key="k_diffmode").set_value("side by side").run()
    assert at.get("html") and "diff_add" in at.get("html")[0].proto.body
    at.selectbox(key="k_target").set_value(_target_id(RECORDED, GPT2, "layernorm")).run()
    assert not at.exception, at.exception
    # its starter (#3) is still its best: B starts at the latest experiment instead
    rec = Store(RECORDED, readonly=True)
    seqs = {int(r["id"]): r["seq"] for r in rec.experiments(GPT2)}
    rec.close()
    assert seqs[at.selectbox(key="k_a").value] == 3 and seqs[at.selectbox(key="k_b").value] == 15
    assert any("still the best" in c.value for c in at.caption)


def test_kernels_page_interpreter_run_has_no_roofline(db):
    at = _page("app/kernel_page.py")
    assert any("No roofline" in i.value for i in at.info)
    assert not _roofline(at)
    # pick the experiment that failed at the shape sweep: its stage table says so
    at.selectbox(key="k_target").set_value(_target_id(db["path"], db["interp"], "softmax")).run()
    failed_id = int(Store(db["path"], readonly=True).db.execute(
        "SELECT id FROM experiments WHERE run_id = ? AND failed_stage = 'shape_sweep'",
        [db["interp"]]).fetchone()[0])
    at.selectbox(key="k_b").set_value(failed_id).run()
    stages = [d.value for d in at.dataframe if d.value.columns[0] == "stage"][1]
    row = stages.set_index("stage").loc["shape_sweep"]
    assert row["status"] == "failed" and row["failed_case"] == "[7, 13]"
    assert (stages.set_index("stage").loc[["stability", "determinism", "edge_cases"], "status"]
            == "skipped").all()


# ---- Compare ----------------------------------------------------------------------------------
def test_compare_the_two_recorded_runs(recorded):
    at = _page("app/compare.py")
    ov = at.table[0].value           # facts as rows, one column per run
    assert ov.shape[1] == 2 and set(ov.loc["device"]) == {"NVIDIA H200"}
    assert set(ov.loc["timing"]) == {"GPU"}
    assert sorted(ov.loc["projected (Amdahl)"]) == ["1.084×", "1.108×"]
    assert set(ov.loc["end to end vs eager"]) == {"not measured (never checked)"}
    assert set(ov.loc["dtype"]) == {"bfloat16"}      # what "auto" resolved to
    fam = at.table[1].value
    assert set(fam.index) == {"softmax", "cross_entropy", "layernorm", "rmsnorm"}
    assert len(at.get("plotly_chart")) == 3     # per family, kernel curves, projections


def test_compare_a_cpu_run_with_the_recorded_gpu_run(db):
    at = _page("app/compare.py")
    opts = at.multiselect(key="cmp_runs").options
    recorded_runs = sum(len(Store(ROOT / r, readonly=True).list_runs())
                        for r in data.recorded_db_paths())
    assert len(opts) == 2 + recorded_runs  # two runs here and every recorded one
    keys = [data.run_key(str(db["path"]), db["interp"]), data.run_key(data.RECORDED_DB, GPT2)]
    at.multiselect(key="cmp_runs").set_value(keys).run()
    assert not at.exception, at.exception
    ov = at.table[0].value
    assert ov.loc["timing"].tolist() == ["interpreter", "GPU"]
    assert any("timed differently" in w.value for w in at.warning)


# ---- Report and its exports -------------------------------------------------------------------
def _report(path, run_id) -> dict:
    store = data.open_store(str(path))
    try:
        return data.report_data(store, run_id)
    finally:
        store.close()


def test_report_page_on_the_recorded_run(recorded):
    at = _page("app/report.py")
    head = at.metric[0]
    assert head.label == "Projected end-to-end speedup (Amdahl, not measured)"
    assert head.value == "1.084×"
    summary = at.table[0].value
    assert summary["target"].tolist() == ["softmax", "cross_entropy", "layernorm"]
    assert summary["vs eager"].tolist() == ["1.580×", "9.679×", "1.662×"]
    assert summary["torch.compile per forward"].tolist() == ["not timed"] * 3
    assert len(at.get("plotly_chart")) == 4
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["Report (HTML)", "Experiments (CSV)", "Charts (PNG, zip)"]


def test_report_html_is_self_contained(tmp_path):
    rep = _report(RECORDED, GPT2)
    page = export.report_html(rep, report_page.figures(rep))
    from plotly.offline import get_plotlyjs
    assert get_plotlyjs()[:2000] in page            # plotly.js inline, once
    assert page.count(get_plotlyjs()[:200]) == 1
    assert '<script src="http' not in page.replace("'", '"')
    assert "<link" not in page
    assert RECORDED_BADGE in page and "Projected end-to-end speedup (Amdahl, not measured)" in page
    assert page.count('class="plotly-graph-div"') == 4
    csv = pd.read_csv(io.BytesIO(export.experiments_csv(rep)))
    assert len(csv) == 16 and {"run_id", "model", "seq", "state", "speedup"} <= set(csv.columns)


def test_report_charts_as_png():
    ok, why = export.png_support()
    if not ok:
        pytest.skip(f"no PNG export here: {why}")
    rep = _report(RECORDED, LLAMA)
    figs = report_page.figures(rep)
    z = zipfile.ZipFile(io.BytesIO(export.charts_png_zip(figs)))
    assert sorted(z.namelist()) == sorted(f"{n}.png" for n in figs)
    assert all(z.read(n)[:8] == b"\x89PNG\r\n\x1a\n" for n in z.namelist())


def test_no_page_writes_to_the_database(db):
    before = _sha(db["path"])
    for path in ("app/live.py", "app/kernel_page.py", "app/compare.py", "app/report.py",
                 "app/new_run.py"):
        _page(path)
    assert _sha(db["path"]) == before


def test_new_run_hf_and_op_specs(db):
    """hf: and op: specs are typed in; the engine's own check judges them before anything runs."""
    from app import new_run
    at = _page("app/new_run.py")
    at.radio(key="nr_source").set_value(new_run.SPEC).run()
    assert not at.error
    at.text_input(key="nr_spec").input("softmax:64x64").run()
    at.button(key="nr_start").click().run()
    assert [e.value for e in at.error] == ["Model spec: expected hf:NAME or op:FAMILY[:SHAPE], "
                                           "got 'softmax:64x64'."]
    at.text_input(key="nr_spec").input("op:nosuch:64x64").run()
    at.button(key="nr_start").click().run()
    assert len(at.error) == 1 and "unknown family 'nosuch'" in at.error[0].value
    assert len(Store(db["path"], readonly=True).list_runs()) == 2  # nothing started
    cfg, errors = new_run.config_from_inputs(
        {"nr_source": new_run.SPEC, "nr_spec": "op:softmax:7x1000,reduce:3x50",
         "nr_budget_exp": 2}, str(db["path"]))
    assert errors == [] and cfg.model == "op:softmax:7x1000,reduce:3x50"
