"""Candidates written as an attacker would, and a worker taken over completely: the judge and the
sandbox must hold against every one (each of tests/hostile/*.py says what it tries).

Layers, each tested on its own: the static allow list (engine/allowlist.py) rejects what names
anything outside it; the runtime guard (engine/verify.py) rejects what computes with PyTorch
anyway; the judge (engine/judge.py) compares outputs and checks timings in a process the
candidate never runs in; the OS sandbox (engine/sandbox.py) keeps what runs there away from
the engine's files, environment, processes and network."""
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

import kernels
from engine import sandbox, verify
from engine.worker import Worker, WorkerDied

HOSTILE = Path(__file__).parent / "hostile"
ROOT = Path(__file__).resolve().parent.parent
SHAPES = [{"shape": [6, 100], "count": 1}]


def _namespaces_available() -> str | None:
    r = subprocess.run(sandbox.command(sandbox.default_policy(9), [sys.executable, "-c",
                       "import os, json; print(os.environ.get('NIGHTSHIFT_SANDBOX_REPORT'))"]),
                       capture_output=True, text=True, timeout=60)
    try:
        mode = json.loads(r.stdout.strip().splitlines()[-1])["mode"]
    except Exception:
        return f"the sandbox launcher failed: {r.stderr[-300:]}"
    return None if mode in ("root", "user") else f"no namespaces on this machine (mode {mode})"


NO_SANDBOX = _namespaces_available()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=NO_SANDBOX or "")


# ------------------------------------------------------------------------------------------------
# the static allow list: every attack below walked past the old deny list (or crashed it)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, words", [
    # the attacks found on the old checker
    ("heuristics_torch.py", "heuristic may call only"),
    ("numpy_math.py", ".numpy is not allowed"),
    ("guard_off_attrgetter.py", "import of 'operator'"),
    ("patch_verifier.py", "torch.sys is not"),
    ("forged_timer.py", "torch.sys is not"),
    ("read_engine_env.py", "torch.serialization is not"),
    ("write_database.py", "torch.sys is not"),
    ("delete_files.py", "torch.serialization is not"),
    ("shell.py", "torch.serialization is not"),
    ("children.py", "torch.serialization is not"),
    ("exec_base64.py", "torch.fx is not"),
    ("tl_is_torch.py", "tl.exp is not"),
    ("libdevice_is_torch.py", "torch.nn.functional"),
    ("deep_expression.py", "bytes; at most"),
    # more, of our own
    ("module_as_value.py", ".exp is not allowed in host code"),
    ("rebind_alias.py", "may not be rebound"),
    ("dunder_escape.py", "underscore"),
    ("format_globals.py", ".format is not allowed"),
    ("getattr_string.py", "'getattr' is not defined"),
    ("tensor_to_python.py", ".tolist is not allowed"),
    ("other_stream.py", "torch.cuda.Stream is not"),
    ("autotune_hook.py", "pre_hook: no callbacks"),
    ("class_escape.py", "not allowed"),
    ("jit_body_host_compute.py", ".value is not allowed inside a Triton kernel"),
    ("future_import_trick.py", "triton.runtime is not"),
    ("huge_source.py", "bytes; at most"),
    ("gluon_internals.py", "gl.tensor is not"),
    ("gluon_runtime.py", "gluon._runtime is not"),
])
def test_allow_list_rejects(name, words):
    reason = verify.static_check((HOSTILE / name).read_text(), ("x",))
    assert reason and words in reason, reason


@pytest.mark.parametrize("source, words", [
    ("import triton\ndef kernel_fn(x):\n    return " + "-" * 200_000 + "x\n", "within limits"),
    ("import triton\ndef kernel_fn(x):\n    return " + "(" * 100 + "x" + ")" * 100 + "\n",
     "brackets nest"),
    ("import triton\ndef kernel_fn(x):\n    return " + "+".join(["x"] * 20_000) + "\n",
     "within limits"),
    # the parser's own limit is the interpreter's recursion limit, which torch.compile raises
    # (1000 -> 2000): rejected by the parser or by the depth walk after it, never a crash
    ("import triton\nx = 1" + " if 1 else 1" * 3000 + "\n", ("within limits", "nest deeper")),
    (b"\xff\xfe".decode("latin-1") + "\x00", "NUL"),
], ids=["unary-200k", "brackets-100", "sum-20k", "ifexp-3k", "nul"])
def test_parsing_is_bounded(source, words):
    t0 = time.perf_counter()
    reason = verify.static_check(source, ("x",))
    words = (words,) if isinstance(words, str) else words
    assert reason and any(w in reason for w in words), reason
    assert time.perf_counter() - t0 < 5


def test_allow_list_accepts_every_starter_and_recorded_kernel():
    """No false rejects: each family's starter, points across its space, and every candidate the
    loop evaluated on a GPU (data/recorded_*.db) pass the allow list."""
    import random
    import sqlite3
    sources = []
    # the plain contracts, and the widened ones whose kernels are other code (a fused projection
    # or LM head, a residual add)
    widened = [kernels.get(n, s) for n, s in (("rotary", {"linear": True}),
                                              ("rotary", {"linear": True, "bias": True}),
                                              ("rotary", {"linear": True, "style": "interleaved"}),
                                              ("cross_entropy", {"linear": True}),
                                              ("rmsnorm", {"residual": True}))]
    for fam in list(kernels.all_families()) + widened:
        sources.append((fam, fam.starter()))
        rnd = random.Random(fam.name)
        for _ in range(8):
            p = dict(fam.default)
            k = rnd.choice(list(fam.space))
            p[k] = rnd.choice(fam.space[k])
            sources.append((fam, fam.render(p)))
        # every opener, at the shapes that pick them (Hopper's warp-specialized attention's
        # launcher is one of them: a sweep loads it directly, only the loop checks it)
        openers = list(fam.openers)
        if fam.openers_for is not None:
            for shape, dtype in ((fam.bench_shapes[0], "bfloat16"), (fam.bench_shapes[0], "float32"),
                                 (fam.bench_shapes[-1], "float16")):
                openers += list(fam.openers_for(shape, dtype))
        for o in openers:
            sources.append((fam, fam.render(dict(fam.default, **o))))
    n_recorded = 0
    for db in sorted((ROOT / "data").glob("recorded_*.db")):
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        # each candidate against its own target's contract (a region's inputs are its spec's;
        # runs recorded before targets had a spec hold family kernels only)
        has_spec = "spec" in [r[1] for r in con.execute("PRAGMA table_info(targets)")]
        for family, src, spec in con.execute(
                "SELECT e.family, e.source, " + ("t.spec" if has_spec else "'{}'")
                + " FROM experiments e JOIN targets t ON t.id = e.target_id"):
            sources.append((kernels.get(family, json.loads(spec or "{}") or None), src))
            n_recorded += 1
        con.close()
    assert n_recorded > 100
    bad = [(f.name, verify.static_check(s, f.arg_names)) for f, s in sources]
    bad = [b for b in bad if b[1]]
    assert not bad, bad[:3]


def test_llm_prompt_states_the_allow_list():
    from engine import allowlist, llm
    contract = "\n".join(llm._contract(kernels.get("softmax")))
    assert allowlist.rules_text() in contract
    assert "underscore" in contract and "triton.heuristics" in contract


# ------------------------------------------------------------------------------------------------
# the runtime guard and the judge, through a real sandboxed worker
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def worker():
    w = Worker(interpret=True, name="w3")
    w.start()
    yield w
    w.close()


def evaluate(worker, source, timeout=120.0, time_it=False, **extra):
    req = dict({"op": "evaluate", "family": "softmax", "source": source, "dtype": "float32",
                "shapes": SHAPES, "seed": 1, "time": time_it}, **extra)
    try:
        r = worker.request(req, timeout_s=timeout)
    except WorkerDied as e:
        worker.restart()
        return {"failed_stage": e.stage, "error": str(e), "died": True, "stages": []}
    if r.get("restart"):
        worker.restart()
    return r


@pytest.mark.parametrize("name, words", [
    ("rt_host_division.py", "aten.div"),
    ("rt_grid_function.py", "inside a triton launch"),
    ("rt_host_scalar.py", "aten._local_scalar_dense"),
    ("rt_unwritten_output.py", "nan where the reference is finite"),
    ("rt_heapq_tensors.py", "aten.lt"),
])
def test_runtime_guard_rejects_what_the_allow_list_cannot_see(worker, name, words):
    src = (HOSTILE / name).read_text()
    assert verify.static_check(src, ("x",)) is None      # these are runtime-guard territory
    r = evaluate(worker, src)
    assert r["failed_stage"] == "smoke", r
    assert words in r["error"].lower(), r["error"]


def test_the_runner_checks_the_source_again(worker):
    """A request that reaches a worker without the engine's static check is refused there."""
    r = evaluate(worker, (HOSTILE / "patch_verifier.py").read_text())
    assert r["failed_stage"] == "smoke" and "static check failed" in r["error"], r


def test_a_crashing_candidate_costs_one_experiment(worker):
    r = evaluate(worker, (Path(__file__).parent / "candidates" / "softmax_segfault.py").read_text())
    assert r.get("died") and "signal 11" in r["error"], r
    ok = evaluate(worker, kernels.get("softmax").starter(), verify=False)
    assert ok["failed_stage"] is None, ok["error"]


def test_memory_is_limited():
    """A candidate that allocates without end fails; the machine does not run out."""
    w = Worker(interpret=True, name="w4")
    w.memory_cap = 3 << 30
    try:
        w.start()
        r = evaluate(w, (HOSTILE / "memory_hog.py").read_text(), timeout=120)
        assert r["failed_stage"] == "smoke", r
        assert any(s in r["error"].lower() for s in ("memory", "can't allocate")), r["error"]
    finally:
        w.close()


# ------------------------------------------------------------------------------------------------
# a worker taken over completely: the judge still decides
# ------------------------------------------------------------------------------------------------
class _Compromised(Worker):
    def __init__(self, mode):
        super().__init__(interpret=True, name="w5", fresh_retime=False)
        self.mode = mode

    def _command(self):
        env = dict(os.environ, FAKE_MODE=self.mode, PYTHONPATH=str(ROOT))
        return [sys.executable, "-u", str(Path(__file__).parent / "fake_runner.py")], env


def test_a_taken_over_worker_cannot_pass_wrong_outputs():
    """The worker claims success for zeros (as a candidate that replaced the verifier in its
    process would): the judge computes the reference itself and rejects."""
    w = _Compromised("zeros")
    try:
        w.start()
        r = w.request({"op": "evaluate", "family": "softmax", "source": "unused", "dtype":
                       "float32", "shapes": SHAPES, "seed": 1}, timeout_s=60)
    finally:
        w.close()
    assert r["failed_stage"] == "smoke" and "wrong result" in r["error"], r


def test_a_taken_over_worker_cannot_forge_its_timing():
    """Right outputs (computed with PyTorch), timings claimed at 1 us for calls that take 4 ms:
    the judge's own clock rejects the claim."""
    w = _Compromised("forged_clock")
    try:
        w.start()
        t0 = time.monotonic()
        r = w.request({"op": "evaluate", "family": "softmax", "source": "unused", "dtype":
                       "float32", "shapes": SHAPES, "seed": 1}, timeout_s=120)
        took = time.monotonic() - t0
    finally:
        w.close()
    assert [s["status"] for s in r["stages"]] == ["passed"] * 5, r["stages"]
    assert r["failed_stage"] == "benchmark", r
    assert "wall clock" in r["error"] or "timing audit" in r["error"], r["error"]
    assert took < 60


def test_an_honest_candidate_passes_the_timing_checks(worker):
    r = evaluate(worker, kernels.get("softmax").starter(), time_it=True, verify=False)
    assert r["failed_stage"] is None, r["error"]
    assert r["timing"]["latency_us"] > 0


def test_a_would_be_best_is_timed_again_in_a_fresh_process():
    w = Worker(interpret=True, name="w6", fresh_retime=True)
    try:
        w.start()
        r = evaluate(w, kernels.get("softmax").starter(), time_it=True, verify=False,
                     fresh_retime=True)
        assert r["failed_stage"] is None, r["error"]
        assert r["timing"]["first_latency_us"] > 0 and r["timing"]["latency_us"] > 0
    finally:
        w.close()


# ------------------------------------------------------------------------------------------------
# the OS sandbox, probed directly (code that passed every check could still try these)
# ------------------------------------------------------------------------------------------------
def _probe(code: str, policy=None, timeout=60, **kw):
    policy = policy or sandbox.default_policy(8)
    return subprocess.run(sandbox.command(policy, [sys.executable, "-c", code]),
                          capture_output=True, text=True, timeout=timeout, **kw)


@needs_sandbox
def test_sandbox_hides_the_engines_environment_and_processes(monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_TEST_SECRET", "s3cret-value")
    code = f"""
import os
found = []
for pid in os.listdir('/proc'):
    if pid.isdigit() and int(pid) not in (os.getpid(), 1):   # itself and its own init
        try:
            if b's3cret-value' in open(f'/proc/{{pid}}/environ', 'rb').read():
                found.append(pid)
        except OSError:
            pass
try:
    open('/proc/{os.getpid()}/environ', 'rb').read()
    print('read engine')
except OSError as e:
    print('refused', type(e).__name__)
print('found', found, 'uid', os.getuid(), 'pids', sorted(p for p in os.listdir('/proc') if p.isdigit()))
"""
    r = _probe(code)
    assert r.returncode == 0, r.stderr
    assert "s3cret-value" not in r.stdout and "found []" in r.stdout, r.stdout
    assert "read engine" not in r.stdout
    assert "uid 0 " not in r.stdout
    assert "pids ['1', '2']" in r.stdout       # a PID namespace of its own: nothing else visible


@needs_sandbox
def test_sandbox_cannot_touch_the_database_or_the_project(tmp_path):
    db = tmp_path / "runs.db"
    db.write_bytes(b"SQLite format 3\x00" + b"x" * 100)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    readme = ROOT / "README.md"
    code = f"""
import os
for what, f in [('db', lambda: open({str(db)!r}, 'r+b').write(b'999')),
                ('db-list', lambda: os.listdir({str(tmp_path)!r}) and None),
                ('readme', lambda: os.remove({str(readme)!r})),
                ('newdb', lambda: open({str(ROOT / 'data' / 'runs.db')!r}, 'w')),
                ('etc', lambda: open('/etc/nightshift-pwned', 'w')),
                ('usr', lambda: open('/usr/nightshift-pwned', 'w'))]:
    try:
        r = f()
        print(what, 'DONE', r)
    except OSError as e:
        print(what, 'refused', e.errno)
"""
    r = _probe(code, sandbox.default_policy(8, db_path=str(db)))
    assert r.returncode == 0, r.stderr
    assert "DONE" not in r.stdout, r.stdout
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert readme.exists() and not Path("/etc/nightshift-pwned").exists()


@needs_sandbox
def test_sandbox_has_no_network_and_shells_are_contained():
    class Hit(BaseHTTPRequestHandler):
        hits = 0

        def do_GET(self):
            Hit.hits += 1
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Hit)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = ROOT / "pwned-by-a-candidate"    # the project folder: hidden and read-only to it
    try:
        code = f"""
import socket, subprocess
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=3)
    print('CONNECTED')
except OSError as e:
    print('no network', e.errno)
out = subprocess.run(['sh', '-c', 'id -u; echo x > {target} || true'], capture_output=True, text=True)
print('shell', out.stdout.split()[0])
"""
        r = _probe(code)
    finally:
        server.shutdown()
    assert r.returncode == 0, r.stderr
    assert "CONNECTED" not in r.stdout and Hit.hits == 0, r.stdout
    assert "shell 0" not in r.stdout
    assert not target.exists()


def _processes_with(marker: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                    out.append(int(pid))
            except OSError:
                pass
    return out


@needs_sandbox
def test_no_child_outlives_the_sandbox():
    code = """
import subprocess, os
subprocess.Popen(['sleep', '777.25'], start_new_session=True, stdout=subprocess.DEVNULL)
if os.fork() == 0:
    os.setsid()
    os.execvp('sleep', ['sleep', '777.5'])
print('spawned', flush=True)
"""
    r = _probe(code)
    assert "spawned" in r.stdout, r.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_processes_with("sleep 777.25")
                                           or _processes_with("sleep 777.5")):
        time.sleep(0.2)
    assert not _processes_with("sleep 777.25") and not _processes_with("sleep 777.5")


@needs_sandbox
def test_a_child_holding_the_pipes_does_not_hang_the_reader():
    """The child inherits stdout and sleeps; the worker exits: the pipe closes at once."""
    code = "import subprocess; subprocess.Popen(['sleep', '778.5']); print('bye', flush=True)"
    policy = sandbox.default_policy(8)
    t0 = time.monotonic()
    p = subprocess.Popen(sandbox.command(policy, [sys.executable, "-c", code]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = p.stdout.read()          # returns only at EOF: when every holder of the pipe is gone
    p.wait(timeout=30)
    assert b"bye" in out and time.monotonic() - t0 < 30
    assert not _processes_with("sleep 778.5")


@needs_sandbox
def test_a_database_in_tmp_itself_is_hidden_and_the_worker_starts(tmp_path):
    """A database folder under /tmp, or /tmp itself, is hidden by the worker's private /tmp (a
    tmpfs over /tmp made read-only with the hidden folders took the scratch with it)."""
    marker = Path("/tmp") / f"nightshift-probe-{os.getpid()}.db"
    marker.write_text("results")
    try:
        policy = sandbox.default_policy(8, db_path=str(marker))
        r = _probe(f"import os\nopen('work-file', 'w').write('x')\n"
                   f"print(os.path.exists({str(marker)!r}), os.getcwd())", policy)
        assert r.returncode == 0, r.stderr[-800:]
        assert r.stdout.split()[0] == "False" and r.stdout.split()[1].startswith("/tmp/")
    finally:
        marker.unlink()


@needs_sandbox
def test_sandbox_limits_address_space():
    policy = sandbox.default_policy(8, address_space_bytes=1 << 30)
    r = _probe("b = bytearray(4 << 30)\nprint('allocated')", policy)
    assert "allocated" not in r.stdout and "MemoryError" in r.stderr, (r.stdout, r.stderr[-500:])


def test_worker_reports_its_sandbox(worker):
    box = worker.hello["sandbox"]
    if NO_SANDBOX:
        assert box["mode"] == "none"
    else:
        assert box["mode"] in ("root", "user") and str(ROOT) in box["hidden"]
        assert worker.hello["uid"] != os.getuid() or box["mode"] == "user"


def test_the_worker_dies_with_the_engine():
    """The engine is killed outright (no cleanup runs): its worker and everything under it go."""
    engine = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, %r)\n"
        "from engine.worker import Worker\n"
        "w = Worker(interpret=True, name='w7'); w.start()\n"
        "print(w.proc.pid, flush=True); time.sleep(600)\n") % str(ROOT)],
        stdout=subprocess.PIPE, text=True)
    try:
        launcher = int(engine.stdout.readline())
        assert Path(f"/proc/{launcher}").exists()
        engine.kill()
        engine.wait(timeout=30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and Path(f"/proc/{launcher}").exists():
            time.sleep(0.2)
        status = Path(f"/proc/{launcher}/status")
        alive = status.exists() and "State:\tZ" not in status.read_text()
        assert not alive, "the worker outlived the engine"
    finally:
        if engine.poll() is None:
            engine.kill()
