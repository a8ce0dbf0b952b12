"""Dashboard and scale-out: the New run page's "Evaluate on" choice (one worker, a local pool, a
Ray cluster) and the Live run page's Workers section.

AppTest against real SQLite written through engine.store.Store: experiments with their worker,
device, re-timing and attempts as the engine records them, and worker rows through
Store.save_workers, the call the engine makes about once a second. No mocks; the pool itself is
run in the engine's own tests.
"""
from __future__ import annotations

import importlib.util
import socket
import sys
import time

import pytest
from streamlit.testing.v1 import AppTest

from app import data
from engine.store import Store
from test_app import (APP, PLAN, TIMEOUT, _fill, _frame, _live_charts, _texts,
                      _verifications)

HAS_RAY = importlib.util.find_spec("ray") is not None
CPU = "x86_64"
POOL_START_AGO = 1800.0   # the pool started half an hour before the rows were written

# (family, state, failed_stage, speedup, worker, re-timed on, attempts), in seq order
POOL_PLAN = [
    ("rmsnorm", "kept", None, 1.5, "w0", None, 1),
    ("rmsnorm", "kept", None, 2.0, "w1", "w0", 1),        # a new best from w1, timed on w0
    ("softmax", "failed", "shape_sweep", None, "w2", None, 1),
    ("softmax", "reverted", None, 0.9, "w1", None, 1),
    ("rmsnorm", "reverted", None, 1.1, "w0", None, 2),    # w2 died under it: retried on w0
    ("softmax", "kept", None, 1.25, "w1", "w0", 1),
]


def _new_run(s: Store, workers: int | None) -> tuple[str, dict]:
    run_id = s.create_run("llama-tiny", {"model": "llama-tiny", "workers": workers},
                          {"name": "cpu"}, "interpreter", None)
    tids = {f: s.add_target(run_id, f, "float32", [{"shape": [2, 32, 64], "count": 1}], frac)
            for f, frac in (("rmsnorm", 0.4), ("softmax", 0.2))}
    return run_id, tids


def _record(s: Store, run_id: str, tids: dict, plan, t0: float) -> None:
    """The plan's experiments, 200 s apart from t0, with what the loop records of each worker."""
    for i, (fam, state, stage, speedup, worker, retimed, attempts) in enumerate(plan):
        lat = None if speedup is None else 100.0 / speedup
        s.record_experiment(dict(
            run_id=run_id, target_id=tids[fam], family=fam, proposer="search",
            hypothesis=f"try {i}", source="def kernel_fn(): pass", source_hash=f"p{i}",
            state=state, failed_stage=stage, error="mismatch" if stage else None,
            latency_us=lat, speedup=speedup, timing_mode="interpreter",
            created_at=t0 + 200.0 * (i + 1), worker=worker, gpu=f"cpu {CPU}",
            first_latency_us=lat * 1.1 if retimed else None, retimed_on=retimed,
            attempts=attempts), _verifications(stage),
            # each keep is a new best here, as the loop records it
            dict(best_is_this=True, best_latency_us=lat, speedup=speedup)
            if state == "kept" else None)


def fill_pool_run(path, status: str = "running") -> dict:
    """A run evaluated on three local interpreter workers, as the engine records one: w0 the
    reference, idle; w1 busy on softmax for 12 s; w2 dead 5 minutes ago after its process died
    twice (restarted once, 15 minutes ago). A finished run has its live workers closed when it
    ended. Returns the run id, the pool's start time and the time the rows describe."""
    s = Store(path)
    try:
        run_id, tids = _new_run(s, 3)
        t0 = time.time() - POOL_START_AGO
        _record(s, run_id, tids, POOL_PLAN, t0)
        now = t0 + POOL_START_AGO
        done = status not in data.ACTIVE_STATUSES
        common = dict(backend="local", host="node-a", device="cpu", gpu_name=CPU)
        s.save_workers(run_id, [
            dict(common, name="w0", reference=1, pid=101, state="closed" if done else "idle",
                 family=None, since=now if done else now - 5, jobs=8, died=0, restarts=0,
                 busy_s=1200.0, started_at=t0),
            dict(common, name="w1", reference=0, pid=102, state="closed" if done else "busy",
                 family=None if done else "softmax", since=now if done else now - 12, jobs=5,
                 died=0, restarts=0, busy_s=1500.0, started_at=t0 + 2),
            dict(common, name="w2", reference=0, pid=103, state="dead", family=None,
                 since=now - 300, jobs=3, died=2, restarts=1, busy_s=600.0,
                 started_at=now - 900),
        ])
        s.update_run(run_id, status=status)
        if status in data.ACTIVE_STATUSES:
            s.claim_run(run_id)   # its engine: this process, alive (else shown as stopped)
        return dict(run_id=run_id, t0=t0, now=now)
    finally:
        s.close()


def fill_single_worker_run(path) -> str:
    """A run on the default single worker, an hour old, with its one worker row."""
    s = Store(path)
    try:
        run_id, tids = _new_run(s, None)
        started = time.time() - 3600
        _record(s, run_id, tids, [p[:4] + ("w0", None, 1) for p in POOL_PLAN[:2]], started)
        s.save_workers(run_id, [dict(name="w0", backend="single", reference=1, host="node-a",
                                     device="cpu", gpu_name=CPU, pid=100, state="busy",
                                     family="rmsnorm", since=time.time() - 3, jobs=2, died=0,
                                     restarts=0, busy_s=1800.0, started_at=started)])
    finally:
        s.close()
    return run_id


def _app() -> AppTest:
    return AppTest.from_file(APP, default_timeout=TIMEOUT)


def _new_run_page() -> AppTest:
    at = _app().run()
    at.switch_page("app/new_run.py").run()
    assert not at.exception, at.exception
    return at


# ---- the data layer ---------------------------------------------------------------------------
def test_worker_summary_from_the_store(tmp_path):
    path = tmp_path / "runs.db"
    pool = fill_pool_run(path)
    store = Store(path, readonly=True)
    try:
        run = data.get_run(store, pool["run_id"])
        workers = data.workers_frame(store, pool["run_id"])
        exps = data.experiments_frame(store, pool["run_id"])
    finally:
        store.close()
    assert workers["name"].tolist() == ["w0", "w1", "w2"]     # the reference first
    s = data.worker_summary(workers, exps, run, now=pool["now"]).set_index("name")
    assert s["label"].tolist() == ["w0 · reference", "w1", "w2"]
    assert s["state"].tolist() == ["idle 5s", "busy 12s", "dead"]
    assert s["family"].fillna("").tolist() == ["", "softmax", ""]   # what it evaluates now
    assert s["device"].tolist() == [f"cpu {CPU}"] * 3
    assert s["experiments"].tolist() == [2, 3, 1]
    # the clock starts when the pool started (w2's own started_at moved on at its restart) and
    # stops for w2 when it died: 1800 s for w0 and w1, 1500 s for w2
    assert s["busy_share"].tolist() == pytest.approx([1200 / 1800, 1500 / 1800, 600 / 1500])
    assert s["per_hour"].tolist() == pytest.approx([2 * 2.0, 3 * 2.0, 1 * 3600 / 1500])
    assert s[["jobs", "died", "restarts"]].loc["w2"].tolist() == [3, 2, 1]
    caption = data.workers_caption(workers)
    assert caption.startswith("3 workers (local pool on node-a) · 1 busy · 1 dead · reference w0")

    # the experiments say who evaluated them and which the reference re-timed
    labels = dict(zip(exps["seq"], data.worker_labels(exps)))
    assert labels[2] == "w1 · re-timed on w0" and labels[5] == "w0 · retried"
    assert labels[3] == "w2"


def test_worker_summary_of_a_finished_run_stops_at_its_last_update(tmp_path):
    path = tmp_path / "runs.db"
    pool = fill_pool_run(path, status="done")
    store = Store(path, readonly=True)
    try:
        run = data.get_run(store, pool["run_id"])
        s = data.worker_summary(data.workers_frame(store, pool["run_id"]),
                                data.experiments_frame(store, pool["run_id"]), run,
                                now=pool["now"] + 7 * 86400)   # opened a week later
    finally:
        store.close()
    s = s.set_index("name")
    assert s["state"].tolist() == ["closed", "closed", "dead"]   # no ever-growing durations
    # closed when the run ended: the clock stops there, not at the time the page is opened
    assert s.loc["w0", "busy_share"] == pytest.approx(1200 / 1800)
    assert s.loc["w1", "per_hour"] == pytest.approx(6.0)


def test_runs_without_workers_rows_have_empty_worker_data(tmp_path):
    path = tmp_path / "runs.db"
    run_id = _fill(path, "interpreter")
    store = Store(path, readonly=True)
    try:
        workers = data.workers_frame(store, run_id)
        summary = data.worker_summary(workers, data.experiments_frame(store, run_id),
                                      data.get_run(store, run_id))
    finally:
        store.close()
    assert workers.empty and summary.empty
    # the recorded database predates the workers table and the new experiment columns
    rec = data.open_store(str(data.ROOT / data.RECORDED_DB))
    try:
        run_id = data.list_runs(rec)[0]["id"]
        assert data.workers_frame(rec, run_id).empty
        exps = data.experiments_frame(rec, run_id)
    finally:
        rec.close()
    assert len(exps) and exps["retimed_on"].isna().all() and set(exps["worker"]) == {"w0"}


# ---- the Live run page ------------------------------------------------------------------------
def test_live_page_shows_the_workers(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    pool = fill_pool_run(path)
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = _app().run()
    assert not at.exception, at.exception
    assert "Workers" in [h.value for h in at.subheader]
    assert any(c.value.startswith("3 workers (local pool on node-a) · 1 busy · 1 dead · "
                                  "reference w0") for c in at.caption)
    table = _frame(at, "label")
    assert table["label"].tolist() == ["w0 · reference", "w1", "w2"]
    assert "host" not in table.columns     # one host: said in the caption above
    assert table["device"].tolist() == [f"cpu {CPU}"] * 3
    # the page is live: durations count on from when the rows were written; w1's family with it
    state = table["state"].str.split(" ")
    assert state.str[0].tolist() == ["idle", "busy", "dead"]
    assert table["state"].iloc[1].endswith("s · softmax")
    assert table["experiments"].tolist() == [2, 3, 1]
    assert table[["jobs", "died", "restarts"]].values.tolist() == [[8, 0, 0], [5, 0, 0], [3, 2, 1]]
    elapsed = time.time() - pool["now"]   # the seconds since the rows were written
    wall = POOL_START_AGO + elapsed
    assert table["busy_share"].tolist() == pytest.approx([1200 / wall, 1500 / wall, 0.4],
                                                         rel=1e-3)
    assert table["per_hour"].tolist() == pytest.approx(
        [2 * 3600 / wall, 3 * 3600 / wall, 2.4], rel=1e-3)

    # experiments per worker, stacked by outcome; the reference marked
    charts = {f["layout"]["uirevision"]: f for f in _live_charts(at)}
    assert list(charts) == ["speedup", "amdahl", "stages", "workers"]
    bars = {t["name"]: dict(zip(t["x"], t["y"])) for t in charts["workers"]["data"]}
    assert bars["kept"] == {"w0 (ref)": 1, "w1": 2, "w2": 0}
    assert bars["reverted"] == {"w0 (ref)": 1, "w1": 1, "w2": 0}
    assert bars["failed"] == {"w0 (ref)": 0, "w1": 0, "w2": 1}

    # the experiment table says who evaluated each one and which the reference re-timed
    exps = _frame(at, "seq").set_index("seq")
    assert exps.loc[2, "worker"] == "w1 · re-timed on w0"
    assert exps.loc[5, "worker"] == "w0 · retried" and exps.loc[3, "gpu"] == f"cpu {CPU}"
    # nothing of the one-worker line on a pool run
    assert not any(c.value.startswith("Evaluated on one worker") for c in at.caption)

    # the experiment's detail on the Kernels page: B is the best rmsnorm kernel, #2
    at.switch_page("app/kernel_page.py").run()
    assert not at.exception, at.exception
    assert any(c.value.startswith(f"Evaluated on w1 (cpu {CPU}); re-timed on the reference "
                                  "worker w0 (w1 measured 55.0 µs)") for c in at.caption), \
        [c.value for c in at.caption]


def test_single_worker_run_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    fill_single_worker_run(path)
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = _app().run()
    assert not at.exception, at.exception
    line = [c.value for c in at.caption if c.value.startswith("Evaluated on one worker")]
    assert len(line) == 1, [c.value for c in at.caption]
    assert line[0].startswith(f"Evaluated on one worker, w0 on node-a (cpu {CPU}) · busy ")
    assert " on rmsnorm · 2 jobs · busy 50% of the time · 2 experiments/h" in line[0]
    assert "Workers" not in [h.value for h in at.subheader]
    assert [f["layout"]["uirevision"] for f in _live_charts(at)] == ["speedup", "amdahl",
                                                                     "stages"]
    assert list(_frame(at, "seq").columns) == data.TABLE_COLUMNS


def test_run_without_workers_rows_shows_nothing_of_them(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    _fill(path, "interpreter")
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = _app().run()
    assert not at.exception, at.exception
    assert not at.error
    assert "Workers" not in [h.value for h in at.subheader]
    assert "worker" not in _texts(at).lower()
    assert list(_frame(at, "seq").columns) == data.TABLE_COLUMNS


# ---- the New run page -------------------------------------------------------------------------
def test_new_run_evaluate_on_builds_the_run_config(tmp_path, monkeypatch):
    pytest.importorskip("engine.loop")
    from app import new_run
    monkeypatch.setenv("NIGHTSHIFT_DB", str(tmp_path / "runs.db"))
    at = _new_run_page()
    db = str(tmp_path / "runs.db")
    radio = at.radio(key="nr_eval")
    assert radio.options == list(new_run.EVAL_CHOICES) and radio.value == new_run.EVAL_ONE
    cfg, errors = new_run.config_from_inputs(at.session_state, db)
    assert errors == [] and (cfg.workers, cfg.ray_address) == (None, None)

    # a local pool: one worker per GPU, or up to 8 interpreter workers on a machine without one
    radio.set_value(new_run.EVAL_LOCAL).run()
    gpus = new_run.gpu_count()
    top = gpus or new_run.MAX_CPU_WORKERS
    workers = at.text_input(key="nr_workers")
    assert workers.value == str(gpus or 2) and f"1 to {top}" in workers.help
    workers.input(str(min(2, top))).run()
    cfg, errors = new_run.config_from_inputs(at.session_state, db)
    assert errors == [] and (cfg.workers, cfg.ray_address) == (min(2, top), None)
    # typed out of range: an error that says the bounds, never a silently clamped value
    at.text_input(key="nr_workers").input(str(top + 1)).run()
    cfg, errors = new_run.config_from_inputs(at.session_state, db)
    assert cfg is None and errors == [
        f"Workers: {top + 1} is out of range; give a number between 1 and {top}."]
    at.text_input(key="nr_workers").input(str(min(2, top))).run()

    # a Ray cluster: the address defaults to auto, the number of workers may stay blank
    at.radio(key="nr_eval").set_value(new_run.EVAL_RAY).run()
    assert at.text_input(key="nr_ray_address").value == "auto"
    assert at.text_input(key="nr_ray_workers").value in ("", None)
    if not HAS_RAY:   # without the package the engine refuses any address: checked below
        return
    cfg, errors = new_run.config_from_inputs(at.session_state, db)
    assert errors == [] and (cfg.workers, cfg.ray_address) == (None, "auto")
    # an address with host and port must answer: here a listening socket stands for the head
    with socket.create_server(("127.0.0.1", 0)) as head:
        address = f"ray://127.0.0.1:{head.getsockname()[1]}"
        at.text_input(key="nr_ray_address").input(f" {address} ").run()
        at.text_input(key="nr_ray_workers").input("16").run()
        cfg, errors = new_run.config_from_inputs(at.session_state, db)
    assert errors == [] and (cfg.workers, cfg.ray_address) == (16, address)
    at.text_input(key="nr_ray_address").input("local").run()
    cfg, errors = new_run.config_from_inputs(at.session_state, db)
    assert errors == [] and cfg.ray_address == "local"


def test_new_run_bad_evaluation_input_shows_one_error(tmp_path, monkeypatch):
    pytest.importorskip("engine.loop")
    from app import new_run
    path = tmp_path / "runs.db"
    _fill(path, "gpu", plan=PLAN[:1], status="done")
    monkeypatch.setenv("NIGHTSHIFT_DB", str(path))
    at = _new_run_page()
    at.radio(key="nr_eval").set_value(new_run.EVAL_RAY).run()
    # a blank address: the engine's own check, as one error under Start
    at.text_input(key="nr_ray_address").input("   ").run()
    at.button(key="nr_start").click().run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("Not started: --ray"), errors
    assert ("cluster address" if HAS_RAY else "pip install") in errors[0]
    if HAS_RAY:
        # nothing listening at the address: found before the engine creates a run for it
        with socket.create_server(("127.0.0.1", 0)) as gone:
            port = gone.getsockname()[1]
        at.text_input(key="nr_ray_address").input(f"127.0.0.1:{port}").run()
        at.button(key="nr_start").click().run()
        errors = [e.value for e in at.error]
        assert len(errors) == 1 and errors[0].startswith(
            f"Ray address: nothing answers at 127.0.0.1:{port}"), errors
    # ray not installed (an import of it fails): one error that says how to get it
    monkeypatch.setitem(sys.modules, "ray", None)
    at.text_input(key="nr_ray_address").input("auto").run()
    at.button(key="nr_start").click().run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == [
        "Not started: --ray needs the ray package: pip install 'ray[default]'"]
    assert at.title[0].value == "New run"          # still here, nothing started
    assert len(Store(path, readonly=True).list_runs()) == 1
    # the choice made without its number (what the page reads when the input is missing)
    form = {"nr_model": "llama-tiny", "nr_budget_exp": "3", "nr_eval": new_run.EVAL_LOCAL}
    cfg, errors = new_run.config_from_inputs(form, str(path))
    assert cfg is None and errors == ["Workers: give a number."]
    # more Ray actors than the engine allows: an error that says the bounds, not a crash
    cfg, errors = new_run.config_from_inputs(
        dict(form, nr_eval=new_run.EVAL_RAY, nr_ray_address="auto",
             nr_ray_workers=str(new_run.max_workers() + 1)), str(path))
    assert cfg is None and errors == [
        f"Workers: {new_run.max_workers() + 1} is out of range; give a number between 1 and "
        f"{new_run.max_workers()}."]
