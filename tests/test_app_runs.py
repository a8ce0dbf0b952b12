"""The dashboard's rules, below the browser: number formats, numbers typed on New run, a target's
two baselines and its verdict, one family as two targets, runs shown by their engine's state,
the Runs table across databases, the parameter analysis, the exports' formats and the view in
the URL. AppTest and the data functions against real SQLite written through engine.store.Store
(and the recorded H200 databases shipped in data/, read-only). No mocks.
"""
from __future__ import annotations

import io
import subprocess
import sys
import time

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app import data, export, fmt
from app import report as report_page
from engine.store import Store, this_owner
from test_app import APP, PLAN, ROOT, TIMEOUT, _fill, _metric, _run_select, _texts

HOPPER = "data/recorded_h200_hopper.db"
MATMUL = "20261201-122744-cd5dc2"     # 128 experiments with their search points
RUNNING_RECORDED = "20261201-124901-15dfe4"


# ---- formats ----------------------------------------------------------------------------------
def test_ratio_format_is_one_rule():
    assert [fmt.ratio(v) for v in (1.3158, 0.735, 9.679, 12.27, 150.2, 0.0123, 0.000633,
                                   0.0000633)] == \
        ["1.316×", "0.735×", "9.679×", "12.3×", "150×", "0.0123×", "0.000633×", "0.0000633×"]
    assert fmt.ratio(None) == fmt.ratio(float("nan")) == "—"
    assert "e" not in fmt.ratio(1e-7) and fmt.ratio(1e-7) != "0.00×"


def test_time_error_and_share_formats():
    assert [fmt.us(v) for v in (9.87, 208.4, 21455.8, 1_234_567.0)] == \
        ["9.87 µs", "208 µs", "21.5 ms", "1.23 s"]
    # errors always scientific, so two of them read side by side
    assert [fmt.error(v) for v in (9.54e-7, 0.00000191, 0.0)] == ["9.54e-07", "1.91e-06", "0"]
    assert fmt.share(0.1234) == "12.3%" and fmt.pct(87.64) == "87.6%"


def test_error_messages_lose_the_exception_chain():
    raw = ("cannot reach http://127.0.0.1:9: server unreachable or failing (APIConnectionError: "
           "litellm.APIConnectionError: OllamaException - [Errno 111] Connection refused)")
    assert fmt.message(raw) == ("cannot reach http://127.0.0.1:9: server unreachable or failing "
                                "([Errno 111] Connection refused)")
    assert fmt.message("sqlite3.OperationalError: unable to open database file") == \
        "unable to open database file"
    assert fmt.message("ConfigError: choose at least one family") == "choose at least one family"


# ---- numbers typed on New run -------------------------------------------------------------------
def test_numbers_are_read_never_replaced():
    from app.new_run import parse_number
    assert parse_number("40", "Experiments", int, 0) == (40, None)
    assert parse_number("-3", "Experiments", int, 0) == (
        None, "Experiments: -3 is out of range; give a number at least 0.")
    assert parse_number("2.5", "Experiments", int, 0) == (
        None, "Experiments: '2.5' is not a whole number.")
    assert parse_number("forty", "Experiments", int, 0) == (
        None, "Experiments: 'forty' is not a number.")
    assert parse_number("nan", "Minutes", float, 0)[1] == "Minutes: 'nan' is not a finite number."
    assert parse_number("", "Minutes", float, 0, blank=0.0) == (0.0, None)
    assert parse_number("", "Workers", int, 1, 8) == (None, "Workers: give a number.")
    assert parse_number("9", "Workers", int, 1, 8)[1] == \
        "Workers: 9 is out of range; give a number between 1 and 8."


def test_a_bad_number_on_new_run_starts_nothing(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    _fill(path, "gpu", plan=PLAN[:1], status="done")
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("app/new_run.py").run()
    at.text_input(key="nr_budget_exp").input("-3")
    at.text_input(key="nr_budget_min").input("-5")
    at.button(key="nr_start").click().run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert errors == ["Experiments: -3 is out of range; give a number at least 0.",
                      "Minutes: -5 is out of range; give a number at least 0."]
    assert at.text_input(key="nr_budget_exp").value == "-3"     # what was typed stays
    assert len(Store(path, readonly=True).list_runs()) == 1    # nothing started


# ---- a target's two baselines -------------------------------------------------------------------
def _target(**kw):
    return dict(dict(id=1, family="rmsnorm", ref_latency_us=100.0, compile_latency_us=None,
                     best_latency_us=None), **kw)


def test_the_best_counts_against_the_faster_baseline():
    b = data.baselines(_target(best_latency_us=50.0))
    assert (b["vs_eager"], b["vs_compile"], b["base"]) == (2.0, None, "eager")
    assert b["verdict"] == "faster than eager (torch.compile not timed)" and not b["slower"]
    b = data.baselines(_target(compile_latency_us=40.0, best_latency_us=50.0))
    assert b["base"] == "torch.compile" and b["vs_base"] == pytest.approx(0.8)
    assert b["slower"] and b["verdict"] == "slower than torch.compile (0.800×)"
    b = data.baselines(_target(compile_latency_us=40.0, best_latency_us=30.0))
    assert not b["slower"] and b["verdict"] == "faster than eager and torch.compile"
    b = data.baselines(_target(compile_latency_us=90.0, best_latency_us=120.0))
    assert b["slower"] and b["verdict"] == "slower than eager and torch.compile (0.750×)"
    assert data.baselines(_target())["verdict"] == "no kernel kept"


def _two_rmsnorm_targets(path):
    """A run holding rmsnorm under two contracts (as a model with two norms does), one of them
    with its torch.compile baseline timed and beaten only by eager."""
    s = Store(path)
    try:
        run_id = s.create_run("llama-tiny", {"model": "llama-tiny", "dtype": "auto"},
                              {"name": "NVIDIA H200"}, "gpu", {"copy_gbps": 4000.0})
        a = s.add_target(run_id, "rmsnorm", "bfloat16", [{"shape": [8, 64], "count": 2}], 0.3,
                         spec={"dims": [1], "weight": True})
        b = s.add_target(run_id, "rmsnorm", "bfloat16", [{"shape": [8, 64], "count": 1}], 0.1,
                         spec={"dims": [1], "weight": False}, label="final norm")
        s.update_target(a, ref_latency_us=100.0, compile_latency_us=60.0, compile_mode="default")
        s.update_target(b, ref_latency_us=50.0)
        for tid, lat in ((a, 80.0), (b, 25.0)):
            s.record_experiment(dict(
                run_id=run_id, target_id=tid, family="rmsnorm", proposer="search",
                hypothesis="starter", source="def kernel_fn(): pass", source_hash=f"h{tid}",
                state="kept", latency_us=lat, speedup=(100.0 if tid == a else 50.0) / lat,
                timing_mode="gpu"), [],
                dict(best_is_this=True, best_latency_us=lat,
                     speedup=(100.0 if tid == a else 50.0) / lat))
        s.update_run(run_id, status="done")
        return run_id, a, b
    finally:
        s.close()


def test_one_family_under_two_contracts_is_two_targets(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    run_id, a, b = _two_rmsnorm_targets(path)
    store = Store(path, readonly=True)
    try:
        rep = data.report_data(store, run_id)
    finally:
        store.close()
    names = data.target_names(rep["targets"])
    assert names == {a: "rmsnorm · dims=[1], weight=True",
                     b: "final norm · dims=[1], weight=False"}
    # Amdahl by target id: both shares count (by family one would overwrite the other), each
    # against its baseline: a's kernel (1.25x eager) is 0.75x torch.compile, which runs the op
    # in 0.6 of eager's time, so a counts at 1x over its share under compile (0.3 x 0.6)
    fa = 0.3 * 0.6
    expect = 1 / ((1 - fa - 0.1) + fa / 1.0 + 0.1 / 2.0)
    assert rep["projected"] == pytest.approx(expect)
    assert rep["projection"]["projected"].iloc[-1] == pytest.approx(expect)
    summary = rep["summary"].set_index("target_id")
    assert summary.loc[a, "verdict"] == "slower than torch.compile (0.750×)"
    assert bool(summary.loc[a, "slower"]) and not bool(summary.loc[b, "slower"])
    assert rep["dtype"] == "bfloat16"             # not the configured "auto"

    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("app/kernel_page.py").run()
    assert not at.exception, at.exception
    sel = at.selectbox(key="k_target")
    assert sel.value == a and len(sel.options) == 2 and len(set(sel.options)) == 2
    assert _metric(at, "Best vs torch.compile") == "0.750×"
    assert any("slower than torch.compile" in w.value for w in at.warning)
    sel.set_value(b).run()
    assert _metric(at, "Best vs eager") == "2.000×"
    at.switch_page("app/report.py").run()
    table = at.table[0].value
    assert table["target"].tolist() == list(names.values())
    assert table["vs torch.compile"].tolist() == ["0.750×", "—"]
    assert any("final norm" not in w.value and "slower than torch.compile" in w.value
               for w in at.warning)


# ---- runs shown by their engine's state ---------------------------------------------------------
def test_a_run_whose_engine_is_gone_is_stopped(tmp_path, monkeypatch):
    """Stored "running" with no live owner (its process died): shown as stopped, its clock
    stopped at its last sign of life, and it can be continued."""
    path = tmp_path / "runs.db"
    run_id = _fill(path, "interpreter", status="done")
    s = Store(path)
    # as a killed engine leaves it: "running", owned by a process that is gone
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    s.release_run(run_id)
    s.claim_run(run_id, owner=dict(this_owner(), pid=gone.pid))
    s.update_run(run_id, status="running")
    s.close()
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    assert _metric(at, "Status") == "stopped"
    assert "Its engine is gone" in _texts(at)
    assert "ctl_continue" in {b.key for b in at.button}
    row = data.list_runs(data.open_store(str(path)))[0]
    assert row["status"] == "stopped" and row["stored_status"] == "running"
    assert data.elapsed_s(row, now=time.time() + 3600) < 60   # not counting


def test_a_recorded_run_that_says_running_is_stopped():
    store = data.open_store(HOPPER)
    try:
        run = data.get_run(store, RUNNING_RECORDED)
    finally:
        store.close()
    assert run["stored_status"] == "running" and run["status"] == "stopped"
    assert data.format_duration(data.elapsed_s(run, now=time.time())) == "1m 40s"


# ---- the Runs table ------------------------------------------------------------------------------
def _many_runs(path, n: int) -> list[str]:
    ids = []
    for i in range(n):
        ids.append(_fill(path, "gpu" if i % 2 else "interpreter", plan=PLAN[: 1 + i % 5],
                         status="done"))
    return ids


def test_the_runs_table_lists_every_database(tmp_path):
    path = tmp_path / "runs.db"
    mine = _many_runs(path, 3)
    s = Store(path)
    s.set_run_notes(mine[0], notes="the one with the wide rows", tags=["keep", "cpu"])
    s.add_e2e_check(mine[1], "check", "passed", 1e-6, 1e-3, "", [], {"rmsnorm": "ok"}, timings=[
        dict(variant="eager", latency_us=1200.0, timing_mode="gpu"),
        dict(variant="optimized", latency_us=1000.0, timing_mode="gpu"),
        dict(variant="compile", latency_us=1100.0, timing_mode="gpu"),
        dict(variant="compile_optimized", latency_us=1050.0, timing_mode="gpu")])
    s.add_e2e_check(mine[2], "check", "passed", 1e-6, 1e-3, "", [], {"rmsnorm": "slower"},
                    timings=[dict(variant="eager", latency_us=1000.0, timing_mode="gpu"),
                             dict(variant="optimized", latency_us=990.0, timing_mode="gpu")])
    s.close()
    dbs = [str(path)] + data.recorded_db_paths()
    runs, problems = data.runs_table(dbs, writable={str(path)})
    assert problems == []
    recorded = sum(len(Store(ROOT / r, readonly=True).list_runs()) for r in dbs[1:])
    assert len(runs) == 3 + recorded and list(runs.columns) == data.RUNS_COLUMNS
    by_id = runs.set_index("id")
    assert by_id.loc[mine[0], "notes"] == "the one with the wide rows"
    assert by_id.loc[mine[0], "tags"] == "cpu, keep" and bool(by_id.loc[mine[0], "writable"])
    assert by_id.loc[mine[1], "e2e_vs_eager"] == pytest.approx(1.2)
    assert by_id.loc[mine[1], "e2e_vs_compile"] == pytest.approx(1100 / 1000)
    assert pd.isna(by_id.loc[mine[2], "e2e_vs_eager"])      # the only kernel was left out
    assert by_id.loc[RUNNING_RECORDED, "status"] == "stopped"
    assert not by_id.loc[RUNNING_RECORDED, "writable"]
    assert set(runs["dtype"]) >= {"float32", "bfloat16"}
    assert len(data.filter_runs(runs, "keep")) == 1
    # every word must match somewhere (model, device, database name, ...): attention runs on H200s
    on_h200 = (runs["device"].str.contains("h200", case=False)
               | runs["db"].str.contains("h200", case=False))
    assert len(data.filter_runs(runs, "attention h200")) == \
        int((runs["model"].str.contains("attention", case=False) & on_h200).sum()) > 0
    assert len(data.filter_runs(runs, statuses=["stopped"])) == 1
    day = runs["created"].min().date()
    assert len(data.filter_runs(runs, since=day, until=day)) >= 1


def test_the_runs_page_and_its_search(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    _many_runs(path, 2)
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("app/runs_page.py").run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    total = len(table)
    assert total >= 20 and table.columns[0] == "model"
    at.text_input(key="runs_q").input("matmul").run()
    shown = at.dataframe[0].value
    assert 0 < len(shown) < total and shown["model"].str.contains("matmul", case=False).all()
    assert at.query_params.get("q") in ("matmul", ["matmul"])    # the search is in the URL


# ---- parameters -----------------------------------------------------------------------------------
def test_params_frame_of_the_recorded_matmul_run():
    store = data.open_store(HOPPER)
    try:
        tid = store.targets(MATMUL)[0]["id"]
        pf, params, fixed = data.params_frame(store, MATMUL, tid)
    finally:
        store.close()
    assert len(pf) == 128 and {"block_k", "split_k", "loads", "num_stages"} <= set(params)
    assert all(pf[p].astype(str).nunique() > 1 for p in params)
    assert all(k not in params for k in fixed)
    assert pf["best"].iloc[-1] == pytest.approx(pd.to_numeric(
        pf["speedup"].where(pf["state"] == "kept")).max())
    imp = data.param_importance(pf, params)
    assert list(imp.columns) == ["parameter", "importance", "values", "timed"]
    assert imp["importance"].between(0, 1).all() and imp["importance"].is_monotonic_decreasing


def test_importance_finds_the_parameter_that_decides():
    rows = [dict(seq=i, state="reverted", speedup=(2.0 if i % 2 else 0.5) * (1 + 0.01 * (i % 3)),
                 block=64 if i % 2 else 128, warps=[4, 8, 16][i % 3]) for i in range(12)]
    pf = pd.DataFrame(rows)
    imp = data.param_importance(pf, ["block", "warps"]).set_index("parameter")["importance"]
    assert imp["block"] > 0.99 and imp["warps"] < 0.01


# ---- exports ------------------------------------------------------------------------------------
def _report(path, run_id):
    store = data.open_store(str(path))
    try:
        return data.report_data(store, run_id)
    finally:
        store.close()


def test_the_csv_has_iso_times_and_whole_ids():
    rep = _report(ROOT / HOPPER, MATMUL)
    csv = pd.read_csv(io.BytesIO(export.experiments_csv(rep)), dtype=str)
    assert csv["created_at"].str.match(r"^2026-12-01T\d\d:\d\d:\d\d\.\d{3}Z$").all()
    for col in ("id", "seq", "target_id"):
        assert csv[col].str.fullmatch(r"\d+").all(), col
    assert csv["parent_id"].dropna().str.fullmatch(r"\d+").all()
    assert "latency_us_per_forward" in csv.columns


def test_exported_charts_name_the_run_model_device_and_day():
    rep = _report(ROOT / HOPPER, MATMUL)
    figs = export.titled(report_page.figures(rep), export.report_caption(rep))
    caption = "op:matmul:4096x4096x4096 on NVIDIA H200 · run 20261201-122744-cd5dc2 · 2026-12-01"
    assert all(caption in f.layout.title.text for f in figs.values())


def test_the_report_html_says_not_measured_for_the_matmul_run():
    rep = _report(ROOT / HOPPER, MATMUL)
    page = export.report_html(rep, report_page.figures(rep))
    assert "not measured" in page and "Measured end-to-end" not in page
    assert "slower than eager (0.940×)" in page


# ---- the view in the URL ----------------------------------------------------------------------------
def test_the_url_selects_the_run_and_follows_the_choice(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    old, new = _many_runs(path, 2)
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["db"] = str(path)
    at.query_params["run"] = old
    at.run()
    assert not at.exception, at.exception
    assert _run_select(at).value == old          # not the newest
    _run_select(at).select(new).run()
    assert at.query_params["run"] in (new, [new])
    at.switch_page("app/kernel_page.py").run()
    assert "target" in at.query_params and "a" in at.query_params


def test_every_recorded_run_reads_into_a_report_with_a_headline():
    """Each run of every shipped database (data/recorded_*.db, the sidebar's list) reads into
    the Report page's data with a headline that says what it is; a check timed on another GPU
    than its run's says which in the headline's note (the GPT-2 run found on the H200 and
    timed again on an H100)."""
    seen, elsewhere = 0, []
    for path in data.recorded_db_paths():
        store = data.open_store(path)
        try:
            for run in data.list_runs(store):
                rep = data.report_data(store, run["id"])
                head = data.headline(rep)
                assert head["kind"] in ("measured", "not_measured", "projected"), (path, run["id"])
                assert head["label"] and head["text"], (path, run["id"])
                if "timed on NVIDIA H100" in head["note"]:
                    elsewhere.append(run["id"])
                seen += 1
        finally:
            store.close()
    assert seen >= 30
    assert "20261205-171950-baaacc" in elsewhere
