"""Scale-out on the CPU (Triton interpreter): the local pool and the Ray backend (a local Ray cluster
started by the engine, worker actors on CPUs) keep exactly what the single worker keeps for the same
seed and candidates, record which worker measured what, and survive a worker killed mid-run."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kernels
from engine.loop import ConfigError, Engine, RunConfig, execute
from engine.store import Store

sys.path.insert(0, str(Path(__file__).parent))
from test_engine import Scripted, cli  # noqa: E402

ray = pytest.importorskip("ray")


def _candidates():
    """Candidates whose verdicts do not depend on timing noise or on the order results arrive in:
    8 rows per program is several times faster than the starter under the interpreter, the
    chunked variant with 1024-wide chunks is much slower than either, dropping the weight
    multiply is wrong, and a softmax file fails the static check for rmsnorm."""
    fam = kernels.get("rmsnorm")
    faster = fam.render({**fam.default, "rows_per_prog": 8})
    slower = fam.render({**fam.default, "variant": "chunked", "block_d": 1024})
    wrong = fam.render(fam.default).replace("y = x * rstd[:, None] * w[None, :]",
                                            "y = x * rstd[:, None]")
    assert wrong != fam.render(fam.default)
    return [slower, faster, wrong, "softmax_unmasked.py"]


def _run(tmp_path, name, **backend):
    # the plain norm alone (llama-tiny's first norm target is the residual contract's)
    cfg = RunConfig(model="op:rmsnorm:2x32x64", families=["rmsnorm"], budget_experiments=5,
                    db=str(tmp_path / f"{name}.db"), patience=100, e2e_check=False,
                    worker_timeout_s=120, **backend)
    run_id = execute(cfg, log=lambda _: None, proposer=Scripted(_candidates()))
    return Store(tmp_path / f"{name}.db", readonly=True), run_id


def _verdicts(store, run_id):
    return sorted((e["source_hash"], e["state"], e["failed_stage"] or "")
                  for e in store.experiments(run_id))


@pytest.mark.slow
def test_pool_and_ray_keep_what_the_single_worker_keeps(tmp_path):
    single, r1 = _run(tmp_path, "single")
    pool, r2 = _run(tmp_path, "pool", workers=2)
    onray, r3 = _run(tmp_path, "ray", workers=2, ray_address="local")
    assert not ray.is_initialized()          # the engine shut down the cluster it started
    want = _verdicts(single, r1)
    assert [v[1] for v in sorted(want, key=lambda v: v[1])].count("kept") == 2
    assert _verdicts(pool, r2) == want
    assert _verdicts(onray, r3) == want
    for store, run_id, backend in ((single, r1, "single"), (pool, r2, "local"), (onray, r3, "ray")):
        assert store.get_run(run_id)["status"] == "done"
        workers = store.workers(run_id)
        assert {w["backend"] for w in workers} == {backend}
        assert len(workers) == (1 if backend == "single" else 2)
        assert [w["name"] for w in workers if w["reference"]] == ["w0"]
        assert all(w["state"] == "closed" for w in workers)
        exps = store.experiments(run_id)
        names = {w["name"] for w in workers}
        for e in exps:
            if e["failed_stage"] == "static":
                assert e["worker"] is None            # rejected before any worker saw it
                continue
            assert e["worker"] in names and e["gpu"].startswith("cpu") and e["attempts"] == 1
            if e["state"] == "kept" and e["worker"] != "w0":
                # a new best measured elsewhere was re-timed on the reference, and that time decided
                assert e["retimed_on"] == "w0" and e["first_latency_us"] > 0
        if backend != "single":
            assert all(w["jobs"] > 0 for w in workers), workers   # both workers did work
        assert sum(w["jobs"] for w in workers) >= sum(1 for e in exps if e["worker"])


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _kill_a_busy_worker(db: Path, deadline: float, after_jobs: int = 1,
                        actor: bool = False) -> int:
    """Wait until a worker is evaluating a candidate (not the starter) and SIGKILL its process;
    actor=True kills the Ray actor process that owns it instead, as when a node is lost."""
    while time.time() < deadline:
        time.sleep(0.3)
        if not db.exists():
            continue
        try:
            s = Store(db, readonly=True)
            runs = s.list_runs()
            rows = s.workers(runs[0]["id"]) if runs else []
            done = runs[0]["experiments_done"] if runs else 0
            s.close()
        except Exception:
            continue
        busy = [w for w in rows if w["state"] == "busy" and w["pid"]]
        if done >= after_jobs and busy:
            pid = busy[0]["pid"]
            if actor:
                # the runner sits under its sandbox's launcher (and PID 1), under the actor; a
                # worker that finished its job (and its process) since the row was read is
                # looked for again
                owner = pid
                try:
                    for _ in range(4):
                        owner = _parent(owner)
                        if "RayWorkerActor" in Path(f"/proc/{owner}/cmdline").read_text(
                                errors="replace"):
                            break
                    else:
                        raise AssertionError("no Ray actor above the worker")
                except (FileNotFoundError, ProcessLookupError):
                    continue
                os.kill(owner, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
            return pid
    raise AssertionError("no busy worker seen")


@pytest.mark.parametrize("backend", [{"workers": 2}, {"workers": 2, "ray_address": "local"}],
                         ids=["local", "ray-actor-lost"])
@pytest.mark.slow
def test_a_worker_killed_mid_run_is_replaced_and_the_run_finishes(tmp_path, backend):
    db = tmp_path / "runs.db"
    cfg = RunConfig(model="llama-tiny", families=["rmsnorm"], budget_experiments=6,
                    db=str(db), patience=100, e2e_check=False, worker_timeout_s=120, **backend)
    eng = Engine()
    eng.start(cfg)
    try:
        killed = _kill_a_busy_worker(db, time.time() + 300, actor="ray_address" in backend)
        eng.join(timeout=600)
    finally:
        eng.stop()
        eng.join(timeout=60)
    s = Store(db, readonly=True)
    run = s.list_runs()[0]
    assert run["status"] == "done", (run["status"], run["error"])
    exps = s.experiments(run["id"])
    assert len(exps) == 6 and [e["seq"] for e in exps] == list(range(1, 7))
    workers = s.workers(run["id"])
    assert sum(w["restarts"] for w in workers) >= 1 and sum(w["died"] for w in workers) >= 1
    assert killed not in {w["pid"] for w in workers}       # the dead process was replaced
    events = " ".join(e["message"] for e in s.events(run["id"]))
    # the job in flight on the killed worker (or the next one sent to it, had it been idle) was
    # run once more: a candidate's verification on the other worker, or, where the kill landed
    # on the reference worker re-timing a candidate against the best, that re-timing
    retried = [e for e in exps if e["attempts"] == 2]
    assert (retried and "retrying it once on another worker" in events) or (
        "died re-timing" in events and "re-timing it once more" in events), events
    assert all(e["state"] in ("kept", "reverted") for e in exps), [
        (e["state"], e["error"]) for e in exps]


def test_bad_scale_out_settings_are_one_clear_message(tmp_path):
    with pytest.raises(ConfigError, match="--workers must be between"):
        RunConfig(workers=0).validate()
    with pytest.raises(ConfigError, match="cluster address"):
        RunConfig(ray_address=" ").validate()
    r = cli("run", "--workers", "0", "--db", str(tmp_path / "x.db"))
    assert r.returncode != 0 and "--workers must be between" in r.stderr
    assert r.stderr.count("\n") <= 2 and "Traceback" not in r.stderr
    assert not (tmp_path / "x.db").exists() or not Store(tmp_path / "x.db").list_runs()


def test_pool_routing_dedicated_reference_and_avoid():
    """The pool's routing with real worker processes and cheap requests: from five workers on the
    reference takes only jobs pinned to it (re-times); a retry avoids the worker it died on."""
    from engine import backends
    pool = backends.Pool([backends.LocalSlot(f"w{i}", True, None) for i in range(5)], "local")
    try:
        pool.start()
        assert pool.free() == 4                      # the reference is held back for re-times
        for k in range(8):
            pool.submit(backends.Job(key=k, req={"op": "hello"}, timeout_s=120))
        pool.submit(backends.Job(key=100, req={"op": "hello"}, timeout_s=120, only="w0"))
        pool.submit(backends.Job(key=101, req={"op": "hello"}, timeout_s=120,
                                 avoid=frozenset({"w1", "w2", "w3"})))
        got = {}
        deadline = time.time() + 300
        while len(got) < 10 and time.time() < deadline:
            for d in pool.results(timeout=0.5):
                assert d.died is None and d.reply["pid"]
                got[d.job.key] = d.slot
        assert len(got) == 10
        assert got[100] == "w0"
        assert got[101] == "w4"
        assert all(got[k] != "w0" for k in range(8))
        assert {w["name"]: w["jobs"] for w in pool.snapshot()}["w0"] == 1
    finally:
        pool.close()
    assert all(w["state"] == "closed" for w in pool.snapshot())


@pytest.mark.slow
def test_scaling_command_measures_each_worker_count(tmp_path):
    out = tmp_path / "scaling.md"
    r = cli("scaling", "--budget", "2", "--workers", "1,2",
            "--db", str(tmp_path / "s.db"), "--out", str(out), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    text = out.read_text()
    assert "interpreter" in text                      # never presented as GPU figures
    rows = [l for l in text.splitlines() if l.startswith("| local x")]
    assert [l.split("|")[1].strip() for l in rows] == ["local x1", "local x2"]
    for l in rows:
        cells = [c.strip() for c in l.split("|")]
        assert cells[2] == "2" and float(cells[4]) > 0   # 2 experiments, a positive rate
    assert "1.00x" in rows[0]
    assert "The loop's serial costs" in text and "**total**" in text
    s = Store(tmp_path / "s.db", readonly=True)
    assert [len(s.workers(run["id"])) for run in reversed(s.list_runs())] == [1, 2]
    bad = cli("scaling", "--workers", "two")
    assert bad.returncode == 2 and "comma-separated counts" in bad.stderr


@pytest.mark.slow
def test_llm_proposer_keeps_a_pool_busy_with_parallel_requests(tmp_path, monkeypatch):
    """The LLM proposer on a local pool of two: with two requests in flight against a real
    OpenAI-compatible server on 127.0.0.1 (through litellm), both workers evaluate model-written
    candidates and the server sees the requests overlap."""
    from engine.llmbench import ScriptedServer, Step
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-local")
    fam = kernels.get("softmax")
    variants = [fam.render(dict(fam.default, rows_per_prog=8, num_warps=w)) for w in (1, 2, 4, 8, 16)]

    def script(n, attempt):
        src = variants[(n - 1) % len(variants)]
        return Step(text=f"```python\n{src}```\nHypothesis: eight rows per program, variant {n}",
                    delay_s=1.0)

    db = tmp_path / "runs.db"
    with ScriptedServer(script) as server:
        cfg = RunConfig(model="llama-tiny", families=["softmax"], proposer="llm",
                        llm_model="openai/scripted-coder", api_base=server.api_base,
                        max_in_flight=2, budget_experiments=5, db=str(db), patience=100,
                        worker_timeout_s=120, e2e_check=False, workers=2)
        cfg.validate()
        run_id = execute(cfg, log=lambda _: None)
    s = Store(db, readonly=True)
    exps = s.experiments(run_id)
    assert s.get_run(run_id)["status"] == "done"
    assert len(exps) == 5 and all(e["proposer"] == "llm" for e in exps)
    assert all(e["state"] in ("kept", "reverted") for e in exps), [(e["state"], e["error"])
                                                                    for e in exps]
    assert len({e["source_hash"] for e in exps}) == 5          # a batch never repeats a candidate
    assert {e["worker"] for e in exps} == {"w0", "w1"}          # both workers evaluated
    assert server.max_concurrent >= 2                           # the requests overlapped


@pytest.mark.slow
def test_a_ray_node_lost_mid_run_is_replaced_and_the_run_finishes(tmp_path):
    """A Ray cluster of several nodes on this machine (ray.cluster_utils: a head with no CPUs and
    three one-CPU nodes, so two actors and one spare place): the node of a busy worker is removed
    mid-run; its actor is re-created on the spare node, its candidate retried on the other."""
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(3)]
    cluster.wait_for_nodes()
    db = tmp_path / "runs.db"
    cfg = RunConfig(model="llama-tiny", families=["rmsnorm"], budget_experiments=6, db=str(db),
                    patience=100, e2e_check=False, worker_timeout_s=120, workers=2,
                    ray_address=cluster.address)
    eng = Engine()
    removed = None
    try:
        eng.start(cfg)
        deadline = time.time() + 300
        while removed is None and time.time() < deadline:
            time.sleep(0.3)
            try:
                s = Store(db, readonly=True)
                run = s.list_runs()[0]
                busy = [w for w in s.workers(run["id"]) if w["state"] == "busy" and w["pid"]]
                s.close()
            except Exception:
                continue
            if run["experiments_done"] >= 1 and busy:
                # worker -> its sandbox's launcher (and PID 1) -> its actor -> the node's raylet
                raylets = {p.process.pid: n for n in nodes for p in n.all_processes["raylet"]}
                pid = busy[0]["pid"]
                try:
                    for _ in range(6):
                        pid = _parent(pid)
                        if pid in raylets:
                            cluster.remove_node(raylets[pid], allow_graceful=False)
                            removed = busy[0]["name"]
                            break
                except FileNotFoundError:   # the worker's process ended since the row was read
                    continue
        assert removed, "no busy worker's node found"
        eng.join(timeout=600)
    finally:
        eng.stop()
        eng.join(timeout=60)
        ray.shutdown()          # the engine joined a cluster it did not start: it left it up
        cluster.shutdown()
    s = Store(db, readonly=True)
    run = s.list_runs()[0]
    assert run["status"] == "done", (run["status"], run["error"])
    exps = s.experiments(run["id"])
    assert [e["seq"] for e in exps] == list(range(1, 7))
    assert all(e["state"] in ("kept", "reverted") for e in exps)
    w = {w["name"]: w for w in s.workers(run["id"])}[removed]
    assert w["died"] >= 1 and w["restarts"] >= 1           # re-created on the spare node
    assert any(e["attempts"] == 2 for e in exps)
    assert any("retrying it once on another worker" in e["message"] for e in s.events(run["id"]))
