"""The loop end to end on the CPU (Triton interpreter): runs, survives bad candidates, resumes
after SIGKILL with nothing committed lost, and the CLI turns bad input into one clear message."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kernels
from engine import plan
from engine.loop import ConfigError, Engine, RunConfig, execute
from engine.proposers import Proposal
from engine.report import run_markdown
from engine.store import Store

ROOT = Path(__file__).resolve().parent.parent
CAND = Path(__file__).parent / "candidates"


def cli(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env or os.environ.copy())


class Scripted:
    """A proposer that replays given sources (starter first), then defers to the search."""

    def __init__(self, sources):
        from engine.proposers import SearchProposer
        self.sources = list(sources)
        self.search = SearchProposer(0)

    def propose(self, family, history, best):
        if not history:
            return self.search.propose(family, history, best)
        if self.sources:
            name = self.sources.pop(0)
            src = (CAND / name).read_text() if name.endswith(".py") else name
            return Proposal(src, f"scripted {name[:40]}",
                            parent_id=best["id"] if best else None, proposer="scripted")
        return self.search.propose(family, history, best)


def test_loop_survives_every_bad_candidate(tmp_path):
    """Each bad candidate is one failed experiment and the run goes on: wrong results at their
    stage, a crash (signal; a hang is the same path, tests/test_verify.py), what the allow list
    refuses (a 300,000-deep
    expression among them), a candidate that rewrites the verifier. Bench-first order, so the
    loop logic is tested without five interpreted stages per candidate."""
    hostile = Path(__file__).parent / "hostile"
    bad = ["softmax_unmasked.py", "softmax_no_max.py", "softmax_cache_by_shape.py",
           "softmax_partial_write.py", "softmax_in_place.py", "softmax_returns_torch.py",
           "softmax_torch_ops.py", "softmax_segfault.py",
           "softmax_patch_clock.py", (hostile / "patch_verifier.py").read_text(),
           (hostile / "deep_expression.py").read_text(), "softmax_two_kernels.py"]
    cfg = RunConfig(model="op:softmax:6x100", families=["softmax"],
                    budget_experiments=len(bad) + 1, db=str(tmp_path / "runs.db"),
                    worker_timeout_s=150, patience=100, verify_order="bench-first",
                    e2e_check=False)
    lines = []
    run_id = execute(cfg, log=lines.append, proposer=Scripted(bad))
    s = Store(tmp_path / "runs.db", readonly=True)
    exps = s.experiments(run_id)
    assert len(exps) == len(bad) + 1
    states = {i: e for i, e in enumerate(exps[1:])}
    by_name = {(b if b.endswith(".py") else f"#{i}"): states[i] for i, b in enumerate(bad)}
    assert exps[0]["state"] == "kept"                       # the starter
    for i, name in enumerate(bad[:-1]):
        e = states[i]
        assert e["state"] in ("failed", "reverted"), (name[:40], e)
        if e["state"] == "reverted":      # bench-first: slower than the best, so not verified
            assert name in ("softmax_no_max.py", "softmax_cache_by_shape.py"), (name, e)
        else:
            assert e["failed_stage"] and e["error"]
    for name in ("softmax_returns_torch.py", "softmax_torch_ops.py", "softmax_patch_clock.py"):
        assert by_name[name]["failed_stage"] == "static", by_name[name]
    assert states[9]["failed_stage"] == "static" and "torch.sys" in states[9]["error"]
    assert states[10]["failed_stage"] == "static" and "bytes" in states[10]["error"]
    assert "signal 11" in by_name["softmax_segfault.py"]["error"]
    assert by_name["softmax_two_kernels.py"]["state"] in ("kept", "reverted"), \
        by_name["softmax_two_kernels.py"]["error"]
    for e in exps:   # verifier rows for every experiment, one per stage
        assert [v["stage"] for v in s.verifications(e["id"])] == list(
            ("smoke", "shape_sweep", "stability", "determinism", "edge_cases"))
    assert s.get_run(run_id)["status"] == "done"


@pytest.mark.slow   # ~15 min on 2 cores: 24 interpreted experiments over five families
def test_cli_run_targets_every_found_family_and_decides_by_its_timings(tmp_path):
    # llama-tiny's graph has six families with kernels (matmul, attention, fused_mlp, rotary,
    # rmsnorm, cross_entropy); the run asks for five (an interpreted attention candidate takes
    # minutes to verify, and the kernel tests judge attention): patience 1 rests a family at its
    # first non-improvement, so 24 experiments reach all five even when some keep improving
    db = tmp_path / "runs.db"
    asked = "matmul,fused_mlp,rotary,rmsnorm,cross_entropy"
    r = cli("run", "--model", "llama-tiny", "--budget-experiments", "24", "--patience", "1",
            "--families", asked, "--db", str(db), timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [l for l in r.stdout.splitlines() if l.startswith("exp ")]
    assert len(lines) == 24
    assert "[interpreter timing]" in r.stdout
    assert "Amdahl-projected end-to-end speedup" in r.stdout
    s = Store(db, readonly=True)
    run = s.list_runs()[0]
    found = {p["family"] for p in s.profile(run["id"]) if p["has_kernel"]}
    targeted = {e["family"] for e in s.experiments(run["id"])}
    assert found == set(asked.split(",")) == targeted
    assert all(e["timing_mode"] == "interpreter" for e in s.experiments(run["id"]))
    # Whether a search step wins under interpreter timings is the machine's business; that every
    # decision follows from the recorded timings is the engine's: kept = faster than the best so
    # far by more than the noise margin, reverted = not. Per target: one family can be two
    # targets (llama-tiny's matmuls: W^T of its linear layers, and a row-major b)
    best = {}
    for e in s.experiments(run["id"]):
        if e["state"] == "failed":
            continue
        prev = best.get(e["target_id"])
        if e["state"] == "kept":
            assert prev is None or e["latency_us"] < prev["latency_us"], e
            best[e["target_id"]] = e
        else:
            assert prev is not None and e["latency_us"] >= prev["latency_us"] * (1 - max(
                0.01, e["noise"] or 0, prev["noise"] or 0)) - 1e-9, (e, prev)
    for t in s.targets(run["id"]):
        if t["id"] in best:
            assert t["best_experiment_id"] == best[t["id"]]["id"]


@pytest.mark.slow   # a minute: two rmsnorm kernels verified in full, interpreted
def test_a_clearly_faster_candidate_is_kept(tmp_path):
    # rmsnorm's starter runs one row per program; eight rows per program launch 8x fewer programs,
    # which under the interpreter (per-program cost dominates) is several times faster, far beyond
    # any noise margin: the loop must keep it over the starter.
    fam = kernels.get("rmsnorm")
    faster = fam.render({**fam.default, "rows_per_prog": 8})
    # the plain norm alone (llama-tiny's norms follow residual adds: the fused contract's targets)
    cfg = RunConfig(model="op:rmsnorm:2x32x64", families=["rmsnorm"], budget_experiments=2,
                    db=str(tmp_path / "runs.db"), patience=100, e2e_check=False)
    run_id = execute(cfg, log=lambda _: None, proposer=Scripted([faster]))
    s = Store(tmp_path / "runs.db", readonly=True)
    exps = s.experiments(run_id)
    assert [e["state"] for e in exps] == ["kept", "kept"], [(e["state"], e["error"]) for e in exps]
    assert exps[1]["latency_us"] < exps[0]["latency_us"] / 2
    assert s.targets(run_id)[0]["best_experiment_id"] == exps[1]["id"]


@pytest.mark.slow   # minutes: two rmsnorm kernels verified in full, interpreted
def test_bench_first_verifies_only_candidates_that_beat_the_best(tmp_path):
    # The starter (one row per program) is kept, fully verified: there is no best yet. Eight rows
    # per program is several times faster under the interpreter: it beats the best, so it is
    # verified in full and kept. A one-row variant (other warps: another source) is slower than
    # that: timed after its smoke test, not verified further, reverted.
    fam = kernels.get("rmsnorm")
    faster = fam.render({**fam.default, "rows_per_prog": 8})
    slower = fam.render({**fam.default, "rows_per_prog": 1, "num_warps": 2})
    assert slower != fam.starter()
    cfg = RunConfig(model="op:rmsnorm:2x32x64", families=["rmsnorm"], budget_experiments=3,
                    db=str(tmp_path / "runs.db"), patience=100, e2e_check=False,
                    verify_order="bench-first")
    run_id = execute(cfg, log=lambda _: None, proposer=Scripted([faster, slower]))
    s = Store(tmp_path / "runs.db", readonly=True)
    exps = s.experiments(run_id)
    assert [e["state"] for e in exps] == ["kept", "kept", "reverted"], [
        (e["state"], e["error"]) for e in exps]
    for e in exps[:2]:
        assert [v["status"] for v in s.verifications(e["id"])] == ["passed"] * 5
    gated = s.verifications(exps[2]["id"])
    assert [v["stage"] for v in gated] == ["smoke", "shape_sweep", "stability", "determinism",
                                           "edge_cases"]
    assert [v["status"] for v in gated] == ["passed"] + ["slower"] * 4
    assert exps[2]["error"].startswith("not verified further: ") and exps[2]["latency_us"] > 0
    assert exps[2]["failed_stage"] is None
    assert s.targets(run_id)[0]["best_experiment_id"] == exps[1]["id"]
    assert s.get_run(run_id)["config"]["verify_order"] == "bench-first"
    report = run_markdown(s, run_id)
    assert ("Outcomes: 2 kept as their target's best, 1 reverted (1 timed after the smoke test "
            "only, bench-first)") in report
    assert "verify_order=bench-first" in report


def test_the_loop_reads_each_committed_experiment_once(tmp_path, monkeypatch):
    # A proposal reads only the experiments committed since the previous one: re-reading the
    # whole run each time is quadratic, ~0.35 s per proposal 50,000 experiments into a night.
    from engine import loop
    read = []

    class CountingStore(Store):
        def experiments(self, run_id, since_id=0, with_source=False):
            rows = super().experiments(run_id, since_id, with_source)
            read.append(len(rows))
            return rows

    monkeypatch.setattr(loop, "Store", CountingStore)
    n = 5
    # bench-first on one small softmax: the loop's reads are under test, not five stages
    cfg = RunConfig(model="op:softmax:6x100", families=["softmax"], budget_experiments=n,
                    db=str(tmp_path / "runs.db"), patience=100, e2e_check=False,
                    verify_order="bench-first")
    run_id = execute(cfg, log=lambda _: None)
    assert len(Store(tmp_path / "runs.db", readonly=True).experiments(run_id)) == n
    # each row once while proposing, and once more for the closing summary (quadratic: 15 + 5)
    assert sum(read) <= 2 * n, read


def test_no_experiment_starts_that_the_time_left_would_not_hold(tmp_path):
    # under a time budget the loop starts no experiment once the time left is shorter than its
    # recent ones took (their median), and says so once; with no experiment done yet it starts,
    # past the budget too (the top target's starter), and says that once
    from engine.loop import Control, _Dispatch
    store = Store(tmp_path / "runs.db")
    run_id = store.create_run("op:softmax:6x100", {}, {}, "interpreter", None)
    d = _Dispatch(RunConfig(budget_minutes=1.0, budget_experiments=None), store, None, None,
                  run_id, "interpreter", Control(), lambda _: None)
    now = time.monotonic()
    assert not d._over(now - 50)                 # 10 s left, nothing measured yet
    assert not d._over(now - 70)                 # 10 s over: the first experiment still starts
    for took in (12.0, 20.0, 14.0):          # what _commit notes of each experiment it records
        d.took.append(took)
    assert not d._over(now - 40)                 # 20 s left: the median, 14 s, fits
    assert d._over(now - 50)                     # 10 s left: it does not
    assert d._over(now - 55) and d._over(now - 61)
    said = [e["message"] for e in store.events(run_id) if "no experiment started" in e["message"]]
    assert len(said) == 1 and "14 s" in said[0], said
    late = [e["message"] for e in store.events(run_id) if "spent before the loop" in e["message"]]
    assert len(late) == 1 and "10 s over" in late[0], late


@pytest.mark.slow   # minutes: a run killed, resumed and finished (the quick one-engine-per-run test kills and resumes too)
def test_sigkill_mid_run_then_resume_loses_nothing(tmp_path):
    db = tmp_path / "runs.db"
    p = subprocess.Popen([sys.executable, "-m", "engine", "run", "--model", "op:softmax:6x100",
                          "--verify-order", "bench-first",
                          "--budget-experiments", "6", "--db", str(db)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    deadline = time.time() + 400
    committed = []
    while time.time() < deadline:
        time.sleep(1)
        if db.exists():
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
                try:
                    committed = c.execute("SELECT id, source_hash FROM experiments").fetchall()
                except sqlite3.OperationalError:
                    committed = []
            if len(committed) >= 2:
                break
    os.killpg(p.pid, signal.SIGKILL)                         # engine and its worker, no warning
    p.wait()
    assert len(committed) >= 2
    s = Store(db)
    run = s.list_runs()[0]
    assert run["status"] == "running"                        # it never got to say otherwise
    from engine.store import effective_status
    assert effective_status(run) == "stopped"                # but its engine is gone
    before = {(e["id"], e["source_hash"]) for e in s.experiments(run["id"])}
    assert set(committed) <= before
    s.close()
    r = cli("run", "--resume", run["id"], "--db", str(db))
    assert r.returncode == 0, r.stderr[-3000:]
    s = Store(db, readonly=True)
    after = s.experiments(run["id"])
    assert before <= {(e["id"], e["source_hash"]) for e in after}
    assert len(after) == 6 and [e["seq"] for e in after] == list(range(1, 7))
    assert s.get_run(run["id"])["status"] == "done"
    assert len({e["source_hash"] for e in after}) == 6      # the resumed search did not repeat


@pytest.mark.parametrize("args, words", [
    (["run", "--model", "gpt5"], "unknown model"),
    (["run", "--input-shape", "2xbanana"], "shape"),
    (["run", "--families", "rmsnorm,warpdrive"], "unknown family"),
    (["run", "--budget-experiments", "0"], "budget"),
    (["verify", "--family", "warpdrive", "--candidate", "x.py"], "unknown family"),
    (["verify", "--family", "softmax", "--candidate", "does/not/exist.py"], "no such candidate"),
    (["verify", "--family", "softmax+sideways", "--candidate", "x.py"], "takes a spec"),
    (["verify", "--family", "softmax", "--candidate", "README.md", "--shape", "4xx"], "malformed shape"),
    (["run", "--verify-order", "sideways"], "invalid choice"),
    (["run", "--budget-minutes", "nan"], "budget-minutes"),
    (["run", "--budget-minutes", "inf"], "budget-minutes"),
    (["run", "--model", "llama-tiny", "--input-shape", "100000000x64"], "does not fit in memory"),
    (["run", "--model", "tests/models/does_not_exist.py:Net"], "no such model file"),
    (["frobnicate"], "invalid choice"),
])
def test_cli_bad_input_one_clear_message(tmp_path, args, words):
    db = tmp_path / "sub" / "runs.db"
    r = cli(*args, *(["--db", str(db)] if args[0] == "run" else []), timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and words in err[0].lower(), r.stderr
    assert not db.exists() and not db.parent.exists()       # nothing written, not even a file


def test_cli_unwritable_database(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    r = cli("run", "--db", str(blocker / "runs.db"), timeout=120)
    assert r.returncode == 2 and "cannot open database" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_database_errors_are_one_line(tmp_path):
    """A file that is not a database, one from a newer version, and export to a path that
    cannot be written: one line, exit 2, and the file untouched."""
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite")
    for args in (["report", "latest", "--db", str(junk)], ["run", "--db", str(junk)]):
        r = cli(*args, timeout=120)
        assert r.returncode == 2 and "not a database" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert junk.read_text() == "not sqlite"
    newer = tmp_path / "newer.db"
    Store(newer).close()
    c = sqlite3.connect(newer)
    c.execute("INSERT INTO schema_version VALUES ('9999_from_the_future', 0)")
    c.commit()
    c.close()

    def dump():
        c = sqlite3.connect(f"file:{newer}?mode=ro", uri=True)
        try:
            return list(c.iterdump())
        finally:
            c.close()
    before = dump()
    for args in (["run", "--db", str(newer)], ["report", "latest", "--db", str(newer)]):
        r = cli(*args, timeout=120)
        assert r.returncode == 2 and "newer schema" in r.stderr, r.stderr
    assert dump() == before
    r = cli("export", "latest", "--db", str(ROOT / "data" / "recorded_h200.db"), "--out",
            str(junk / "pkg"), timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.skipif(subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0,
                    reason="needs mount namespaces (unshare -m) for a read-only file system")
def test_cli_read_only_database(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "runs.db").write_bytes((ROOT / "data" / "recorded_h200.db").read_bytes())
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind -o ro {ro} {ro} && "
                        f"{sys.executable} -m engine run --db {ro / 'runs.db'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "readonly" in r.stderr.replace("-", ""), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_one_engine_per_run_and_a_dead_engine_shows_stopped(tmp_path):
    """A second engine on a live run refuses in one line; SIGTERM ends a run as stopped; a
    SIGKILLed engine's run shows as stopped (it cannot say so itself) and resumes."""
    from engine.store import effective_status
    db = tmp_path / "runs.db"
    first = subprocess.Popen([sys.executable, "-m", "engine", "run", "--model", "op:softmax:6x100",
                              "--budget-experiments", "50", "--db", str(db)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_id = None
        deadline = time.time() + 300
        while time.time() < deadline and run_id is None:
            time.sleep(1)
            if db.exists():
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
                    try:
                        row = c.execute("SELECT id FROM runs").fetchone()
                    except sqlite3.OperationalError:
                        row = None
                run_id = row[0] if row else None
        assert run_id
        second = cli("run", "--resume", run_id, "--db", str(db), timeout=120)
        assert second.returncode == 2 and "another engine" in second.stderr, second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    s = Store(db, readonly=True)
    run = s.get_run(run_id)
    assert run["status"] == "stopped" and effective_status(run) == "stopped"
    s.close()
    # a run whose engine was killed outright still says "running"; it is shown as stopped
    with sqlite3.connect(db) as c:
        c.execute("UPDATE runs SET status = 'running', owner = ? WHERE id = ?",
                  [json.dumps({"host": os.uname().nodename, "pid": 2**22 + 7,
                               "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip()}),
                   run_id])
    s = Store(db, readonly=True)
    assert effective_status(s.get_run(run_id)) == "stopped"


@pytest.mark.slow   # a minute and a half: three candidates judged in full from the command line
def test_cli_verify_judges_a_candidate(tmp_path):
    good = cli("verify", "--family", "softmax", "--candidate",
               str(CAND / "softmax_two_kernels.py"), "--shape", "5x100", "--no-time")
    assert good.returncode == 0, good.stderr
    out = json.loads(good.stdout)
    assert out["passed"] is True
    assert [s["name"] for s in out["stages"]] == ["static", "smoke", "shape_sweep", "stability",
                                                  "determinism", "edge_cases"]
    assert all({"name", "status", "detail"} <= set(s) for s in out["stages"])
    bad = cli("verify", "--family", "softmax", "--candidate", str(CAND / "softmax_no_max.py"),
              "--shape", "5x100", "--no-time")
    assert bad.returncode == 1
    out = json.loads(bad.stdout)
    assert out["passed"] is False and out["failed_stage"] == "stability"
    syntax = tmp_path / "broken.py"
    syntax.write_text("def kernel_fn(x):\n    return (\n")
    r = cli("verify", "--family", "softmax", "--candidate", str(syntax))
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out["failed_stage"] == "static" and "syntax error" in out["error"]


def test_cli_verify_takes_a_contract_flag(tmp_path):
    """``--family cross_entropy+linear`` judges under that contract (the LM head fused in): its
    starter passes; the plain loss's candidate fails it (another signature)."""
    import kernels
    src = tmp_path / "lce.py"
    src.write_text(kernels.get("cross_entropy", {"linear": True}).starter())
    r = cli("verify", "--family", "cross_entropy+linear", "--candidate", str(src),
            "--shape", "3x40x500", "--no-time")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["passed"] is True and out["spec"] == {"linear": True}
    plain = tmp_path / "ce.py"
    plain.write_text(kernels.get("cross_entropy").starter())
    r = cli("verify", "--family", "cross_entropy+linear", "--candidate", str(plain),
            "--shape", "3x40x500", "--no-time")
    assert r.returncode == 1 and json.loads(r.stdout)["failed_stage"] == "static"


@pytest.mark.slow   # 45 s: a starter's five stages interpreted before the stop (the stopped state: test_one_engine_per_run_...)
def test_engine_handle_runs_in_a_thread_and_stops(tmp_path):
    eng = Engine()
    with pytest.raises(ConfigError):
        eng.start(RunConfig(model="nope", db=str(tmp_path / "x.db")))
    run_id = eng.start(RunConfig(model="op:softmax:6x100", budget_experiments=50,
                                 verify_order="bench-first", db=str(tmp_path / "x.db")))
    assert run_id
    deadline = time.time() + 300
    while time.time() < deadline and eng.status()["experiments"] < 1:
        time.sleep(0.5)
    eng.stop()
    eng.join(120)
    st = eng.status()
    assert st["state"] == "stopped", st
    s = Store(tmp_path / "x.db", readonly=True)
    assert s.get_run(run_id)["status"] == "stopped"
    assert 1 <= s.get_run(run_id)["experiments_done"] < 50


MODEL_THAT_TELLS = """
import os, sys
from pathlib import Path
import torch
# every process that imports this file says so, and prints to stdout as models do
with open(Path(__file__).with_suffix(".pids"), "a") as f:
    f.write(f"{os.getpid()}\\n")
print("model file imported")


class Net(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x * 2.0, dim=-1)


def get_inputs():
    return [torch.randn(4, 96)]
"""


def test_dashboard_engine_never_imports_the_model_file_into_its_own_process(tmp_path):
    """The Engine (the dashboard's handle) builds, profiles and checks a model file in a child
    process: the file's module code runs there, never in this process, and the run still ends
    with its end-to-end check; a model that fails to build is one usage error, no run left."""
    path = tmp_path / "told.py"
    path.write_text(MODEL_THAT_TELLS)
    db = tmp_path / "runs.db"
    eng = Engine()
    run_id = eng.start(RunConfig(model=f"{path}:Net", families=["softmax"], budget_experiments=1,
                                 db=str(db)))
    eng.join(600)
    assert eng.status()["state"] == "done", eng.status()
    pids = [int(p) for p in path.with_suffix(".pids").read_text().split()]
    assert len(pids) >= 2 and os.getpid() not in pids     # the profile and the end-to-end check
    assert not [m for m in sys.modules.values() if getattr(m, "__file__", None) == str(path)]
    s = Store(db, readonly=True)
    assert s.get_run(run_id)["status"] == "done" and s.e2e_checks(run_id)
    assert any("profiled" in e["message"] for e in s.events(run_id))
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nclass Net(torch.nn.Module):\n    def __init__(self):\n"
                   "        raise ValueError('needs a config')\n"
                   "def get_inputs():\n    return [torch.randn(2, 8)]\n")
    with pytest.raises(ConfigError, match="needs a config"):
        Engine().start(RunConfig(model=f"{bad}:Net", db=str(tmp_path / "new" / "x.db")))
    assert not (tmp_path / "new").exists()


def test_amdahl():
    assert plan.amdahl([(0.5, 2.0)]) == pytest.approx(1 / 0.75)
    assert plan.amdahl([(0.3, 0.5)]) == 1.0                 # slower kernels are never swapped in
    assert plan.amdahl([(0.2, 4.0), (0.3, 3.0)]) == pytest.approx(1 / (0.5 + 0.05 + 0.1))


def test_planner_rests_targets_and_comes_back():
    ts = [dict(family="a", fraction=0.5, state="active", experiments=3, no_improve=0,
               best_latency_us=None, ref_latency_us=10, sol_latency_us=None),
          dict(family="b", fraction=0.2, state="active", experiments=0, no_improve=0,
               best_latency_us=None, ref_latency_us=10, sol_latency_us=None)]
    t, why, new_round = plan.choose_next(ts, patience=2)
    assert t["family"] == "a" and not new_round and "50.0%" in why
    ts[0]["no_improve"] = 2
    t, _, _ = plan.choose_next(ts, patience=2)
    assert t["family"] == "b"
    ts[1]["no_improve"] = 2
    t, why, new_round = plan.choose_next(ts, patience=2)
    assert new_round and "new round" in why
    # with a roofline, the most end-to-end time left wins, and near-SOL targets are done
    ts = [dict(family="a", fraction=0.5, state="active", experiments=1, no_improve=0,
               best_latency_us=10.5, ref_latency_us=30, sol_latency_us=10),
          dict(family="b", fraction=0.2, state="active", experiments=1, no_improve=0,
               best_latency_us=40, ref_latency_us=40, sol_latency_us=10)]
    t, _, _ = plan.choose_next(ts, patience=5)
    assert t["family"] == "b"
    # near its speed of light but slower than torch.compile of its op: still open, and alone
    # it is the one chosen (the budget is there to close the gap)
    a = dict(family="a", fraction=1.0, state="active", experiments=1, no_improve=0,
             best_latency_us=136.4, best_noise=0.01, ref_latency_us=1148.1, ref_noise=0.01,
             compile_latency_us=134.0, compile_noise=0.01, sol_latency_us=128.5)
    t, _, _ = plan.choose_next([a], patience=5)
    assert t is a
    a["best_latency_us"] = 130.0                       # beats compile: it rests
    t, why, _ = plan.choose_next([a], patience=5)
    assert t is None and "speed of light" in why


def test_search_does_not_repeat_a_one_parameter_move_that_lost():
    """A single-parameter move that made its parent 1.3x slower, or failed a verifier stage, is
    not proposed again as a mutation; a move that changed two parameters, a worker's death and a
    small loss teach nothing. Pure proposer logic: no kernel runs."""
    from engine.proposers import LOSING_RATIO, SearchProposer, losing_moves
    from engine.verify import source_hash
    import kernels
    fam = kernels.get("softmax")
    base = dict(fam.default)
    other = {k: next(v for v in vals if v != base[k]) for k, vals in fam.space.items() if len(vals) > 1}
    k1, k2, k3, k4 = list(other)[:4]
    parent = {"id": 1, "params": base, "latency_us": 100.0, "state": "kept",
              "source_hash": source_hash(fam.render(base))}

    def child(i, changes, **kw):
        p = dict(base, **changes)
        return dict({"id": i, "parent_id": 1, "params": p, "latency_us": 100.0, "state": "reverted",
                     "source_hash": source_hash(fam.render(p))}, **kw)
    hist = [parent,
            child(2, {k1: other[k1]}, latency_us=LOSING_RATIO * 100.0 + 1),        # lost
            child(3, {k2: other[k2]}, state="failed", failed_stage="smoke", latency_us=None),
            child(4, {k3: other[k3]}, state="failed", failed_stage="worker", latency_us=None),
            child(5, {k1: other[k1], k4: other[k4]}, latency_us=500.0),            # two moves
            child(6, {k4: other[k4]}, latency_us=110.0)]                          # within 1.3x
    assert losing_moves(hist) == {(k1, other[k1]), (k2, other[k2])}
    best = {"params": base, "id": 1, "seq": 1}
    seen = list(hist)
    for _ in range(40):
        p = SearchProposer(0).propose(fam, seen, best)
        if "random restart" not in p.hypothesis:
            changed = {(k, v) for k, v in p.params.items() if base.get(k) != v}
            assert not changed & losing_moves(hist), p.hypothesis
        seen.append({"params": p.params, "source_hash": source_hash(p.source), "state": "reverted"})


def test_a_proposer_that_raises_sets_its_target_aside_and_the_run_goes_on(tmp_path):
    """A proposer bug (a point its family cannot render, say) ends that target's search with
    an event, not the run: the starter stays kept, the run ends done."""
    class Breaks(Scripted):
        def propose(self, family, history, best):
            if history:
                raise ValueError("region parameter max_tile=1024 not in [2048, 4096]")
            return super().propose(family, history, best)
    cfg = RunConfig(model="op:softmax:6x100", families=["softmax"], budget_experiments=3,
                    db=str(tmp_path / "runs.db"), worker_timeout_s=150, patience=100,
                    verify_order="bench-first", e2e_check=False)
    run_id = execute(cfg, log=lambda s: None, proposer=Breaks([]))
    s = Store(tmp_path / "runs.db", readonly=True)
    assert s.get_run(run_id)["status"] == "done"
    assert [e["state"] for e in s.experiments(run_id)] == ["kept"]
    assert any("the proposer failed (ValueError" in e["message"] and e["level"] == "warn"
               for e in s.events(run_id))


def test_the_reference_runner_releases_its_compiled_baselines():
    """After the baselines the judge asks the runner to drop the compiled references (dynamo's
    caches and CUDA graph pools with them), so the candidates' stages get that memory back."""
    import torch
    from engine import worker
    calls = []
    state = {"compiled": torch.compile(lambda x: x + 1, backend="eager"), "tainted": False}
    worker._OPS["release_reference"]({"op": "release_reference"}, state, calls.append, None)
    assert calls == [{"ok": True}] and "compiled" not in state


def test_the_compiled_projection_matches_the_recorded_gpt2_run_within_ten_percent(tmp_path):
    """The recorded GPT-2 small run (H200): compile of the optimized model measured 1.426x
    torch.compile; Amdahl over compile's forward from the compiled ops' times agrees within
    10% (the eager-share projection, 1.087x, does not), and the report prints both."""
    db = Path(__file__).resolve().parent.parent / "data" / "recorded_h200_gpt2_bert.db"
    store = Store(db, readonly=True)
    try:
        run_id = "20261205-171950-baaacc"
        targets = store.targets(run_id)
        # the latest check timed on the run's own GPU (later ones were timed on an H100)
        check = [c for c in store.e2e_checks(run_id) if c["kind"] == "check" and not c.get("device")][0]
        by = {t["variant"]: t["latency_us"] for t in store.e2e_timings(check["id"])}
        measured = by["compile"] / by["compile_optimized"]
        proj = plan.projected_compiled(targets, by["compile"])
        assert abs(proj / measured - 1) < 0.10, (proj, measured)
        assert abs(plan.projected(targets) / measured - 1) > 0.2
        assert plan.projected_compiled(targets, None) is None
    finally:
        store.close()
    # the report prints it for a check timed on the run's GPU (the file's latest are an H100's)
    import shutil
    import sqlite3
    copy = tmp_path / "h200_only.db"
    shutil.copy(db, copy)
    with sqlite3.connect(copy) as c:
        c.execute("DELETE FROM e2e_timings WHERE check_id IN "
                  "(SELECT id FROM e2e_checks WHERE device IS NOT NULL)")
        c.execute("DELETE FROM e2e_checks WHERE device IS NOT NULL")
    store = Store(copy, readonly=True)
    try:
        assert f"{proj:.3g}x" in run_markdown(store, run_id)
    finally:
        store.close()
