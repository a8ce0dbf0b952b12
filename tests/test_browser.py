"""End to end, as a person would: the dashboard in a real headless Chromium.

Starts the app with the README command (`streamlit run streamlit_app.py --server.headless true
--server.port PORT`, the repository's .streamlit/config.toml applying) against a fresh, empty
database ($NIGHTSHIFT_DB). Most tests open the runs recorded on an H200 that ship in data/, or a
database the test writes through engine.store.Store as the engine would (the test process
standing in for a live engine: it holds the run and writes its experiments while the page
watches); one starts a real CPU run from the New run page, watches it, stops it and continues it.

What is checked, by page: the server listens on loopback only and no request leaves the machine
(favicon included), with no Deploy button or menu; bad numbers on New run are errors and start
nothing, a slow Ray check disables Start, an unreachable LLM is one plain line; Live run follows
its run through stop, continue, pause and resume, shows a recorded "running" run as stopped with
its clock still, keeps the zoom on both axes, and cuts nothing (titles, stage labels, event log,
run selector); the view is in the URL (reload, a link in another browser); speedups are bars
from 1x; Report says "not measured" when no kernel was in the model and marks slower kernels;
CSV times and ids, 2x PNGs; the Runs table (filter, select, compare, notes); parallel
coordinates and kernel sources on Kernels; Compare's exports; presentation mode; dark mode.
Screenshots of every page, light and dark, go to docs/screenshots/ (shown in the README).

Needs Playwright for Python (requirements-dev.txt) and Debian's /usr/bin/chromium.
"""
from __future__ import annotations

import io
import os
import re
import socket
import sqlite3
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "docs" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
RECORDED_BADGE = "Recorded on NVIDIA H200, torch 2.11, Triton 3.6, 2026-11-30"
BUDGET = 3
FAMILY = "rmsnorm"
RUN_WAIT_S = 150   # for the run to finish; past that the page's Stop button ends it
STOP_WAIT_S = 90   # the engine stops after the experiment in flight (~15-30 s interpreted)
SHOW_WITHIN_S = 3.0  # a new experiment must be on the page this soon after its row landed
# A change of state must be on the page this soon: the watcher looks every 3 s, then the page
# reruns (2-4 s here); 20 s leaves room for a machine whose two cores other work shares.
FOLLOW_WITHIN_S = 20.0
# Recorded runs the tests open (data/*.db, read-only)
GPT2 = ("data/recorded_h200.db", "20261130-030352-e079e8")          # 16 exps, 3 targets
LLAMA = ("data/recorded_h200.db", "20261130-030304-a8b2d6")         # older, 2 exps
MATMUL = ("data/recorded_h200_hopper.db", "20261201-122744-cd5dc2")  # 128 exps, kept 0.940x,
#                                                                    # left out as slower
ATTN_735 = ("data/recorded_h200_hopper.db", "20261201-125326-7b0be1")  # best 0.735x
ATTN_638 = ("data/recorded_h200_hopper.db", "20261201-124901-15dfe4")  # 0.638x, says running
LLAMA_E2E = ("data/recorded_h200_e2e.db", "20261201-055442-011cd6")  # measured end to end
GPT2_E2E = ("data/recorded_h200_e2e.db", "20261201-055031-5fea85")

try:
    import engine.loop  # noqa: F401
    ENGINE_MISSING = None
except ImportError as e:
    ENGINE_MISSING = f"engine.loop cannot be imported yet ({e})"

sync_api = pytest.importorskip("playwright.sync_api",
                               reason="Playwright for Python is not installed "
                                      "(pip install -r requirements-dev.txt)")
pytestmark = [
    pytest.mark.skipif(ENGINE_MISSING is not None, reason=ENGINE_MISSING or ""),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The dashboard as a subprocess on a free port, with its own empty database."""
    tmp = tmp_path_factory.mktemp("dashboard")
    db = tmp / "runs.db"
    port = _free_port()
    env = dict(os.environ, NIGHTSHIFT_DB=str(db))
    env.pop("STREAMLIT_SERVER_ADDRESS", None)   # the repository's config.toml decides
    if not _has_gpu():
        env["TRITON_INTERPRET"] = "1"
    log_path = tmp / "streamlit.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "streamlit_app.py", "--server.headless", "true",
         "--server.port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail("streamlit exited early:\n" + log_path.read_text())
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("streamlit did not come up in 60 s")
            time.sleep(0.3)
        yield dict(url=url, db=db, tmp=tmp, port=port, pid=proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        # keep the server log with the test's output when something went wrong
        print(log_path.read_text()[-4000:])


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


# ---- helpers ----------------------------------------------------------------------------------
def _url(app, page: str = "", **params) -> str:
    flat = [(k, v) for k, vals in params.items()
            for v in (vals if isinstance(vals, (list, tuple)) else [vals])]
    return f"{app['url']}/{page}" + (f"?{urllib.parse.urlencode(flat)}" if flat else "")


def _view(db_run: tuple[str, str]) -> dict:
    return dict(db=db_run[0], run=db_run[1])


_OPEN: list = []   # the browser contexts a test opened; closed after it, failed or not


@pytest.fixture(autouse=True)
def _close_contexts():
    """A context left open by a failed test keeps its page polling the server every second,
    and the next tests slow down under it: close every context a test opened."""
    yield
    while _OPEN:
        ctx = _OPEN.pop()
        try:
            ctx.close()
        except Exception:   # already closed by the test
            pass


def _page(browser, scheme: str = "light", height: int = 1000):
    """A new browser context (a new session, as another browser would be) and its page, with
    every request it makes recorded in page.requests."""
    ctx = browser.new_context(viewport={"width": 1440, "height": height}, color_scheme=scheme,
                              accept_downloads=True)
    _OPEN.append(ctx)
    page = ctx.new_page()
    page.requests = []
    page.on("request", lambda r: page.requests.append(r.url))
    return page


def _metric(page, key: str) -> str:
    """A metric's text, or "" while it is not on the page (a rerun may replace it at any time)."""
    loc = page.locator(f".st-key-{key} [data-testid='stMetricValue']")
    try:
        return loc.inner_text(timeout=3000).strip() if loc.count() else ""
    except sync_api.TimeoutError:
        return ""


def _wait_metric(page, key: str, want, timeout_s: float = 20.0) -> str:
    """Wait (polling every 50 ms) until the metric's text is ``want`` (or passes want(text))."""
    ok = want if callable(want) else (lambda t: t == want)
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = _metric(page, key)
        if ok(text):
            return text
        page.wait_for_timeout(50)
    shot = Path(os.environ.get("TMPDIR", "/tmp")) / f"nightshift-metric-{key}.png"
    page.screenshot(path=str(shot), full_page=True)
    pytest.fail(f"metric {key} is {text!r} after {timeout_s} s, expected {want!r} "
                f"(the page: {shot})")


DRAWN_JS = "document.querySelectorAll('.js-plotly-plot .main-svg').length"


def _charts(page, n: int, timeout_ms: int = 30_000) -> None:
    """Wait until plotly.js has drawn at least n charts: in the page itself (st.plotly_chart)
    and in the Live run page's chart frames (app/livechart.py), counted together."""
    deadline = time.monotonic() + timeout_ms / 1000
    drawn = 0
    while time.monotonic() < deadline:
        drawn = 0
        for frame in page.frames:
            try:
                drawn += frame.evaluate(DRAWN_JS)
            except Exception:  # a frame that is being replaced or not loaded yet
                pass
        if drawn >= n:
            return
        page.wait_for_timeout(250)
    pytest.fail(f"{drawn} charts drawn, expected {n}")


def _chart_frame(page, key: str):
    """The frame of a Live run chart (app/livechart.py) by its key."""
    return page.locator(f".st-key-{key} iframe").element_handle(timeout=30_000).content_frame()


def _no_error(page) -> None:
    errors = page.locator("[data-testid='stAlertContentError']")
    if errors.count():
        pytest.fail("the page shows an error: " + errors.first.inner_text())
    exc = page.locator("[data-testid='stException']")
    if exc.count():
        pytest.fail("the page raised: " + exc.first.inner_text()[:2000])


def _goto(page, title: str) -> None:
    """Open a page from the sidebar's navigation, as a person would (the session is kept)."""
    page.locator("[data-testid='stSidebarNav']").get_by_role("link", name=title, exact=True).click()
    page.get_by_role("heading", name=title, level=1).wait_for(timeout=30_000)


def _open(page, url: str, title: str) -> None:
    page.goto(url)
    page.get_by_role("heading", name=title, level=1).wait_for(timeout=60_000)


def _settled(page, timeout_ms: int = 15_000) -> None:
    """Between two refreshes of a page: no element greyed out as stale, no spinner."""
    try:
        page.wait_for_function(
            "!document.querySelector('[data-stale=\"true\"]') && "
            "!document.querySelector('[data-testid=\"stStatusWidget\"]')",
            polling=100, timeout=timeout_ms)
    except sync_api.TimeoutError:
        pass


def _shot(page, name: str, height: int = 2000) -> None:
    """A whole-page screenshot: Streamlit scrolls inside its own container, so the window is
    made tall enough for the page first."""
    page.set_viewport_size({"width": 1440, "height": height})
    page.wait_for_timeout(1500)  # let the charts re-layout at the new size
    _settled(page)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name), full_page=True)
    assert (SHOTS / name).stat().st_size > 10_000
    page.set_viewport_size({"width": 1440, "height": 1000})


def _download(page, button: str, tmp: Path) -> Path:
    with page.expect_download(timeout=90_000) as d:
        page.get_by_role("button", name=button).click()
    out = tmp / d.value.suggested_filename
    d.value.save_as(out)
    return out


def _check_self_contained(browser, path: Path, n_charts: int) -> None:
    """The HTML file has plotly.js inside and no remote script, and it renders its charts with
    every network request refused (as on a machine offline)."""
    text = path.read_text()
    assert "plotly.js v" in text[:200_000] or "Plotly" in text[:200_000]
    assert len(text) > 3_000_000, "plotly.js is not inline"
    assert not re.search(r"<script[^>]+src=[\"']?https?:", text, re.I), "remote script"
    assert not re.search(r"<link[^>]+href=[\"']?https?:", text, re.I), "remote stylesheet"
    ctx = browser.new_context()
    _OPEN.append(ctx)
    requests: list[str] = []

    def refuse(route):  # offline: anything not from the file itself fails
        requests.append(route.request.url)
        route.abort()

    ctx.route(re.compile(r"^https?://"), refuse)
    page = ctx.new_page()
    page.goto(path.as_uri())
    _charts(page, n_charts, timeout_ms=20_000)
    assert not requests, f"the file asked the network for {requests}"
    ctx.close()


def _select(page, label: str, option: str, root=None) -> None:
    """Pick an option of a Streamlit selectbox by its label, as a person would."""
    box = (root or page).get_by_role("combobox", name=label, exact=True)
    box.click()
    page.get_by_role("option", name=option, exact=True).click()


def _plot_js(page, key: str, js: str, arg=None):
    """Evaluate js(gd, arg) on the st.plotly_chart wrapped as plot_<key> (app/shared.plot)."""
    loc = page.locator(f".st-key-plot_{key} .js-plotly-plot")
    loc.first.wait_for(timeout=30_000)
    page.wait_for_function(
        f"(() => {{ const g = document.querySelector('.st-key-plot_{key} .js-plotly-plot');"
        " return g && g._fullLayout && g.querySelector('.main-svg'); })()", timeout=30_000)
    return loc.first.evaluate(f"(gd, arg) => {{ {js} }}", arg)


def _live_db(path: Path, status: str = "running", plan=None) -> str:
    """A run written as the engine writes one (tests/test_app._fill): a running or paused one is
    held by this test process, alive, with a fresh heartbeat."""
    from test_app import PLAN, _fill
    return _fill(path, "interpreter", plan=plan or PLAN, status=status)


def _add_experiment(path: Path, run_id: str, family: str, speedup: float,
                    state: str = "kept") -> int:
    """One more experiment, committed as the engine commits one (with its verifier rows)."""
    from engine.store import Store
    from test_app import _verifications
    s = Store(path)
    try:
        tid = next(t["id"] for t in s.targets(run_id) if t["family"] == family)
        s.heartbeat(run_id)
        return s.record_experiment(dict(
            run_id=run_id, target_id=tid, family=family, proposer="search",
            hypothesis=f"a new try at {speedup}x", source="def kernel_fn(): pass",
            source_hash=f"t{time.time()}", state=state, latency_us=100.0 / speedup,
            speedup=speedup, pct_sol=10.0 * speedup, timing_mode="interpreter"),
            _verifications(None), dict(best_is_this=True, best_latency_us=100.0 / speedup,
                                       speedup=speedup) if state == "kept" else None)
    finally:
        s.close()


def _update_run(path: Path, run_id: str, claim: bool = False, release: bool = False,
                **fields) -> None:
    from engine.store import Store
    s = Store(path)
    try:
        if claim:
            s.claim_run(run_id)
        if fields:
            s.update_run(run_id, **fields)
        if release:
            s.release_run(run_id)
        else:
            s.heartbeat(run_id)
    finally:
        s.close()


# ---- the server: loopback only, nothing leaves the machine ------------------------------------
def _listening(port: int) -> list[str]:
    """The local addresses of the sockets listening on ``port`` (from /proc/net/tcp and tcp6),
    e.g. ["127.0.0.1"], ["0.0.0.0", "::"]."""
    out = []
    for name in ("tcp", "tcp6"):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            cols = line.split()
            local, state = cols[1], cols[3]
            addr, p = local.split(":")
            if state != "0A" or int(p, 16) != port:   # 0A: LISTEN
                continue
            raw = bytes.fromhex(addr)
            if name == "tcp":
                out.append(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:   # four little-endian 32-bit words
                words = struct.unpack("<4I", raw)
                out.append(socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words)))
    return out


def _other_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses (where another machine would connect)."""
    found = set()
    try:
        found |= {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except OSError:
        pass
    try:   # the address a packet to the outside would leave from (no packet is sent)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            found.add(s.getsockname()[0])
    except OSError:
        pass
    return sorted(a for a in found if not a.startswith("127."))


def test_the_server_listens_on_loopback_only(app):
    """.streamlit/config.toml binds 127.0.0.1: nothing but this machine can reach the
    dashboard, which starts runs that execute code and has no login."""
    addrs = _listening(app["port"])
    assert addrs == ["127.0.0.1"], f"listening on {addrs}"
    for addr in _other_addresses():
        with pytest.raises(OSError):
            socket.create_connection((addr, app["port"]), timeout=2).close()
    with urllib.request.urlopen(app["url"] + "/_stcore/health", timeout=5) as r:
        assert r.status == 200


@pytest.mark.slow
def test_no_request_leaves_the_machine_and_no_deploy_or_menu(app, browser):
    """Every page, opened in turn: each request goes to this server (or is data:/blob:), the
    favicon is served from here, and Streamlit's Deploy button and main menu are not there."""
    page = _page(browser)
    _open(page, _url(app, "", **_view(GPT2)), "Live run")
    _charts(page, 3)
    for title in ("Runs", "New run", "Kernels", "Compare runs", "Report"):
        _goto(page, title)
        page.wait_for_timeout(1500)
    _settled(page)
    icons = page.evaluate("Array.from(document.querySelectorAll('link[rel*=icon]'))"
                          ".map(l => l.href)")
    assert icons and all(i.startswith(app["url"]) for i in icons), icons
    outside = [u for u in page.requests
               if not u.startswith((app["url"], "data:", "blob:", "about:"))]
    assert not outside, f"requests that left the machine: {outside[:10]}"
    assert page.locator("[data-testid='stAppDeployButton']").count() == 0
    assert page.locator("[data-testid='stMainMenu']").count() == 0
    page.context.close()


# ---- New run: numbers, slow checks, plain errors ----------------------------------------------
def _new_run_page(app, browser):
    page = _page(browser)
    _open(page, _url(app, "new"), "New run")
    return page


def _runs_in(db: Path) -> int:
    from engine.store import Store
    if not db.exists():
        return 0
    s = Store(db, readonly=True)
    try:
        return len(s.list_runs())
    finally:
        s.close()


def test_a_negative_budget_is_an_error_and_starts_nothing(app, browser):
    """-3 experiments or -5 minutes: one error each, nothing started, nothing written; the box
    keeps what was typed (a number box kept the last valid value and Start went ahead)."""
    page = _new_run_page(app, browser)
    before = _runs_in(app["db"])
    for label, typed, expect in (("Experiments", "-3", "Experiments: -3 is out of range"),
                                 ("Minutes", "-5", "Minutes: -5 is out of range")):
        box = page.get_by_role("textbox", name=label, exact=True)
        box.fill(typed)
        box.press("Tab")
        page.wait_for_timeout(400)
        page.get_by_role("button", name="Start").click()
        # the previous click's alert may still be on the page until the rerun ends: wait for
        # this box's own error rather than for any alert
        err = page.locator("[data-testid='stAlertContentError']").filter(has_text=expect)
        err.first.wait_for(timeout=60_000)
        texts = [e.inner_text() for e in
                 page.locator("[data-testid='stAlertContentError']").all()]
        assert any(t.startswith(expect) for t in texts), texts
        assert box.input_value() == typed
        assert page.get_by_role("heading", name="New run", level=1).count() == 1
        assert _runs_in(app["db"]) == before
        box.fill("40" if label == "Experiments" else "0")
        box.press("Tab")
        page.wait_for_timeout(400)
    # a word where a number goes
    box = page.get_by_role("textbox", name="Seed", exact=True)
    box.fill("seven")
    box.press("Tab")
    page.wait_for_timeout(400)
    page.get_by_role("button", name="Start").click()
    page.get_by_text("Seed: 'seven' is not a number.").wait_for(timeout=60_000)
    assert _runs_in(app["db"]) == before
    page.context.close()


@pytest.mark.slow
def test_a_slow_ray_check_disables_start_and_says_so(app, browser):
    """A Ray address with no cluster behind it (TEST-NET-3, never routed; where a proxy accepts
    every TCP connection, Ray's own connect is what fails, after tens of seconds): while the
    page checks, Start is disabled and a status says what is being checked; then one error,
    and Start is back. (The page used to grey out with Start still clickable.)"""
    pytest.importorskip("ray")
    before = _runs_in(app["db"])
    page = _new_run_page(app, browser)
    page.get_by_text("Ray cluster", exact=True).click()
    addr = page.get_by_role("textbox", name="Ray address")
    addr.wait_for()
    addr.fill("203.0.113.9:6379")     # TEST-NET-3: never routed, the probe times out
    addr.press("Tab")
    page.wait_for_timeout(400)
    start = page.get_by_role("button", name="Start")
    start.click()
    page.get_by_text("Checking the inputs and the Ray cluster").wait_for(timeout=10_000)
    assert start.is_disabled(), "Start can be pressed again while the check runs"
    page.locator("[data-testid='stAlertContentError']").get_by_text(re.compile(
        r"^(Ray address: nothing answers at 203\.0\.113\.9:6379|Not started: cannot connect to "
        r"the Ray cluster at 203\.0\.113\.9:6379)")).wait_for(timeout=150_000)
    assert page.locator("[data-testid='stAlertContentError']").count() == 1
    page.wait_for_function("() => { const b = Array.from(document.querySelectorAll('button'))"
                           ".find(b => b.innerText.trim() === 'Start'); return b && !b.disabled; }",
                           timeout=20_000)
    assert _runs_in(app["db"]) == before           # nothing was started
    page.context.close()


@pytest.mark.slow
def test_an_unreachable_llm_is_one_plain_line(app, browser):
    """An LLM server that refuses the connection: one error, in words, without the client
    library's exception chain."""
    pytest.importorskip("litellm")
    page = _new_run_page(app, browser)
    page.get_by_text("llm", exact=True).click()
    model = page.get_by_role("textbox", name="LLM model")
    model.wait_for()
    model.fill("ollama_chat/qwen2.5-coder")
    page.get_by_role("textbox", name="API base").fill("http://127.0.0.1:9")
    page.get_by_role("textbox", name="API base").press("Tab")
    page.wait_for_timeout(400)
    page.get_by_role("button", name="Start").click()
    err = page.locator("[data-testid='stAlertContentError']")
    err.first.wait_for(timeout=90_000)
    # the alert can be attached a moment before its text is rendered
    page.wait_for_function("() => { const e = document.querySelector(\"[data-testid='stAlertContentError']\");"
                           " return e && e.innerText.trim().length > 0; }", timeout=30_000)
    text = err.first.inner_text()
    assert text.startswith("LLM 'ollama_chat/qwen2.5-coder' is not reachable:"), text
    assert "\n" not in text.strip()
    assert not re.search(r"\b\w+(Error|Exception):", text), f"an exception chain: {text}"
    assert "litellm." not in text
    page.context.close()


# ---- Live run: it follows its run, never shows a dead one live ----------------------------------
@pytest.mark.slow
def test_the_page_follows_its_run_through_stop_continue_pause_resume(app, browser):
    """Opened on a stopped run, the page keeps reading it: when an engine (here the test
    process) continues it, pauses, resumes and stops it, the page says so within seconds and
    shows each new experiment (a page opened on a stopped run used to stop polling)."""
    db = app["tmp"] / "follow.db"
    run_id = _live_db(db, status="stopped")
    page = _page(browser)
    _open(page, _url(app, "", db=str(db), run=run_id), "Live run")
    assert _wait_metric(page, "run_status", "stopped")
    assert _metric(page, "exp_count") == "6"
    _update_run(db, run_id, claim=True, status="running")         # continued elsewhere
    _wait_metric(page, "run_status", "running", FOLLOW_WITHIN_S)
    _add_experiment(db, run_id, "rmsnorm", 2.5)
    _wait_metric(page, "exp_count", "7", FOLLOW_WITHIN_S)
    _update_run(db, run_id, status="paused")
    _wait_metric(page, "run_status", "paused", FOLLOW_WITHIN_S)
    _update_run(db, run_id, status="running")
    _wait_metric(page, "run_status", "running", FOLLOW_WITHIN_S)
    _add_experiment(db, run_id, "softmax", 1.4)
    _wait_metric(page, "exp_count", "8", FOLLOW_WITHIN_S)
    _update_run(db, run_id, release=True, status="stopped")
    _wait_metric(page, "run_status", "stopped", FOLLOW_WITHIN_S)
    _no_error(page)
    page.context.close()


@pytest.mark.slow
def test_a_recorded_run_that_says_running_is_stopped_and_its_clock_still(app, browser):
    """A run recorded elsewhere whose row says running is not live here: shown as stopped, its
    elapsed time fixed, with a note saying why."""
    page = _page(browser)
    _open(page, _url(app, "", **_view(ATTN_638)), "Live run")
    assert _wait_metric(page, "run_status", "stopped")
    assert _wait_metric(page, "elapsed", "1m 40s")      # its last update, not now
    page.wait_for_timeout(2500)
    assert _wait_metric(page, "elapsed", lambda t: t != "") == "1m 40s"
    page.get_by_text("Recorded elsewhere while it was running").wait_for(timeout=10_000)
    assert page.get_by_role("button", name="Continue run").count() == 0
    page.context.close()


RANGES_JS = """() => {
  const gd = document.querySelector('.js-plotly-plot');
  if (!gd || !gd._fullLayout) return null;
  const pts = gd._fullData.filter(t => t.mode === 'markers').reduce((n, t) => n + (t._length || 0), 0);
  return {x: gd._fullLayout.xaxis.range.slice(), y: gd._fullLayout.yaxis.range.slice(), points: pts};
}"""


@pytest.mark.slow
def test_a_zoom_keeps_both_axes_across_refreshes(app, browser):
    """Drag a zoom box over the speedup chart, then a new experiment lands whose speedup moves
    the y range the figure asks for: the x and the y zoom both stay (y used to reset)."""
    db = app["tmp"] / "zoom.db"
    run_id = _live_db(db)
    page = _page(browser)
    _open(page, _url(app, "", db=str(db), run=run_id), "Live run")
    _charts(page, 3)
    frame = _chart_frame(page, "chart_speedup")
    plot = frame.locator(".nsewdrag").first
    box = plot.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] * 0.2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5, steps=8)
    page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + box["height"] * 0.7, steps=8)
    page.mouse.up()
    page.wait_for_timeout(400)
    before = frame.evaluate(RANGES_JS)
    _add_experiment(db, run_id, "rmsnorm", 6.0)       # the best so far: the y range grows
    _wait_metric(page, "exp_count", "7", FOLLOW_WITHIN_S)
    deadline = time.monotonic() + 15
    after = before
    while time.monotonic() < deadline:
        try:
            after = _chart_frame(page, "chart_speedup").evaluate(RANGES_JS)
        except sync_api.Error:     # the frame is replaced while it redraws
            after = None
        if after and after["points"] > before["points"]:
            break
        page.wait_for_timeout(100)
    assert after and after["points"] > before["points"], "the chart did not get the new point"
    assert after["x"] == pytest.approx(before["x"], rel=1e-6), (before, after)
    assert after["y"] == pytest.approx(before["y"], rel=1e-6), (before, after)
    page.context.close()


FITS_JS = """() => {
  // every chart title and tick label inside its own chart, and no two tick labels of an axis
  // on top of each other
  const out = [];
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const svg = gd.querySelector('.main-svg').getBoundingClientRect();
    for (const el of gd.querySelectorAll('.gtitle, .g-gtitle text, .xtick text, .ytick text')) {
      const r = el.getBoundingClientRect();
      if (!r.width) continue;
      if (r.left < svg.left - 1 || r.right > svg.right + 1 || r.top < svg.top - 1 ||
          r.bottom > svg.bottom + 1) out.push('outside: ' + el.textContent);
    }
    for (const sel of ['.xtick text', '.ytick text']) {
      const boxes = Array.from(gd.querySelectorAll('.subplot.xy ' + sel + ', ' + sel))
        .map(e => e.getBoundingClientRect()).filter(r => r.width);
      for (let i = 1; i < boxes.length; i++) {
        const a = boxes[i - 1], b = boxes[i];
        if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 &&
            b.top < a.bottom - 1) out.push('overlap in ' + sel);
      }
      for (const e of gd.querySelectorAll(sel)) {
        if (/rotate\\((?!0)/.test(e.getAttribute('transform') || '')) out.push('turned: ' + e.textContent);
      }
    }
  }
  return out;
}"""
OVERFLOW_JS = """(sel) => Array.from(document.querySelectorAll(sel))
  .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.className || e.tagName)"""


def _fits(page) -> list[str]:
    out = []
    for frame in page.frames:
        try:
            out += frame.evaluate(FITS_JS)
        except sync_api.Error:
            pass
    return out


@pytest.mark.slow
def test_nothing_is_cut(app, browser):
    """At 1440x900: chart titles and stage labels inside their charts (labels never turned),
    every event message whole, the run selector's label whole, Compare's tables and the
    side-by-side diff inside the page."""
    page = _page(browser, height=900)
    # a run whose model is a long op: spec, and whose events are long lines
    _open(page, _url(app, "", **_view(ATTN_638)), "Live run")
    _charts(page, 3)
    _settled(page)
    page.wait_for_timeout(800)
    assert not _fits(page), _fits(page)
    log = page.locator(".nslog")
    log.wait_for(timeout=10_000)
    assert not page.evaluate(OVERFLOW_JS, ".nslog div"), "an event message is cut"
    assert "target -> attention: 100.0% of model time; 76% of speed of light, up to 24.5% of " \
           "end-to-end time left; not tried yet" in log.inner_text()
    run = page.locator("[data-testid='stSidebar']").get_by_role("combobox", name="Run",
                                                               exact=True)
    assert run.input_value().startswith("op:attention:… · stopped · ")
    assert run.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), run.input_value()

    _goto(page, "Compare runs")
    page.locator("[data-testid='stTable']").first.wait_for(timeout=30_000)
    _charts(page, 3)
    assert not page.evaluate(OVERFLOW_JS, "[data-testid='stTable'], [data-testid='stTable'] table")
    assert not _fits(page), _fits(page)

    _open(page, _url(app, "kernels", **_view(GPT2)), "Kernels")
    _charts(page, 5, timeout_ms=60_000)
    _settled(page)
    page.get_by_text("side by side", exact=True).click(timeout=60_000)
    page.locator(".nsdiff").wait_for(timeout=30_000)
    assert not page.evaluate(OVERFLOW_JS, ".nsdiff"), "the side-by-side diff is cut"
    page.context.close()


# ---- the view in the URL ------------------------------------------------------------------------
def _wait_value(page, box, prefix: str, timeout_s: float = 20.0) -> str:
    """Wait (polling every 50 ms) until a selectbox shows an option starting with ``prefix``:
    a page opened from an address renders its widgets before the run that applies the address
    to them has ended, on a busy machine for a second or two."""
    deadline = time.monotonic() + timeout_s
    value = ""
    while time.monotonic() < deadline:
        value = box.input_value()
        if value.startswith(prefix):
            return value
        page.wait_for_timeout(50)
    pytest.fail(f"the selectbox shows {value!r} after {timeout_s} s, expected {prefix!r}...")


def _caption_run(page) -> str:
    text = page.locator("[data-testid='stCaptionContainer']").filter(
        has_text=re.compile(r"^Run \d{8}-")).first.inner_text(timeout=30_000)
    return text.split(" · ")[0].removeprefix("Run ")


@pytest.mark.slow
def test_the_view_survives_a_reload_and_travels_in_a_link(app, browser):
    """Pick an older run and a target as a person would: a reload keeps them (it used to fall
    back to the newest run), and the address opens the same view in another browser; so do a
    Kernels view's A and B and a Compare page's runs."""
    page = _page(browser)
    _open(page, _url(app, "", db=GPT2[0]), "Live run")
    assert _caption_run(page) == GPT2[1]
    _select(page, "Run", "llama · done · 11-30 03:03", root=page.locator("[data-testid='stSidebar']"))
    page.wait_for_function(f"() => location.search.includes('{LLAMA[1]}')", timeout=40_000)
    assert _caption_run(page) == LLAMA[1]
    page.reload()
    page.get_by_role("heading", name="Live run", level=1).wait_for(timeout=30_000)
    assert _caption_run(page) == LLAMA[1]
    _goto(page, "Kernels")
    db = sqlite3.connect(f"file:{ROOT / LLAMA[0]}?mode=ro", uri=True)  # the id the address names
    try:
        target = str(db.execute("SELECT id FROM targets WHERE run_id = ? AND family = 'rmsnorm'",
                                (LLAMA[1],)).fetchone()[0])
    finally:
        db.close()
    page.get_by_role("combobox", name="Target", exact=True).click()
    page.get_by_role("option", name=re.compile(r"^rmsnorm · ")).click()
    # the page may write the first target's id into the address before the pick is applied (on
    # a busy machine, after the click): wait for the picked one's
    page.wait_for_function("(t) => new URLSearchParams(location.search).get('target') === t",
                           arg=target, timeout=40_000)
    page.reload()
    page.get_by_role("heading", name="Kernels", level=1).wait_for(timeout=30_000)
    _wait_value(page, page.get_by_role("combobox", name="Target", exact=True), "rmsnorm · ")
    link = page.url
    other = _page(browser)                       # another browser: a new session
    _open(other, link, "Kernels")
    assert _caption_run(other) == LLAMA[1]
    _wait_value(other, other.get_by_role("combobox", name="Target", exact=True), "rmsnorm · ")
    assert f"target={target}" in other.url
    other.context.close()

    # A and B by seq, from a link
    layernorm = "3"
    page.goto(_url(app, "kernels", **_view(GPT2), target=layernorm, a=4, b=13))
    page.get_by_role("heading", name="Kernels", level=1).wait_for(timeout=30_000)
    a = page.get_by_role("combobox", name="A (default: baseline, the first experiment)")
    b = page.get_by_role("combobox", name="B (default: the best kept)")
    a.wait_for(timeout=30_000)
    assert a.input_value().startswith("#4 ") and b.input_value().startswith("#13 ")
    page.get_by_role("heading", name="Code: #4 → #13").wait_for(timeout=10_000)

    # Compare's runs
    cmp = [f"{ATTN_735[0]}|{ATTN_735[1]}", f"{ATTN_638[0]}|{ATTN_638[1]}"]
    page.goto(_url(app, "compare", cmp=cmp))
    page.get_by_role("heading", name="Compare runs", level=1).wait_for(timeout=30_000)
    page.locator("[data-testid='stTable']").first.wait_for(timeout=30_000)
    page.reload()
    page.locator("[data-testid='stTable']").first.wait_for(timeout=60_000)
    table = page.locator("[data-testid='stTable']").first.inner_text()
    assert ATTN_735[1] in table and ATTN_638[1] in table
    assert urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)["cmp"] == cmp
    page.context.close()


# ---- charts that say the truth -----------------------------------------------------------------
BARS_JS = """
  const ya = gd._fullLayout.yaxis, top = gd.getBoundingClientRect().top + gd._fullLayout._size.t;
  const px = v => top + ya.l2p(ya.type === 'log' ? Math.log10(v) : v);
  const out = [];
  gd.querySelectorAll('.trace.bars .point path').forEach(p => {
    const r = p.getBoundingClientRect();
    if (r.height > 0) out.push({top: r.top, bottom: r.bottom});
  });
  return {one: px(1), bars: out, values: arg.map(px), type: ya.type};
"""


def test_speedups_below_1x_are_bars_hanging_from_1x(app, browser):
    """Compare the 0.735x and the 0.638x attention runs: both bars start at the 1x line and go
    down to their value, the slower one longer (0.638x used to be a sliver from the bottom of a
    log axis, and 0.735x tall). The Report's bar for the 0.735x kernel does the same."""
    page = _page(browser)
    cmp = [f"{ATTN_735[0]}|{ATTN_735[1]}", f"{ATTN_638[0]}|{ATTN_638[1]}"]
    _open(page, _url(app, "compare", cmp=cmp), "Compare runs")
    got = _plot_js(page, "cmp_speedup", BARS_JS, [0.735, 0.638])
    assert got["type"] == "log" and len(got["bars"]) == 2, got
    one = got["one"]
    lengths = []
    for bar, want in zip(sorted(got["bars"], key=lambda b: b["bottom"]), sorted(got["values"])):
        assert bar["top"] == pytest.approx(one, abs=2), got      # starts at 1x
        assert bar["bottom"] == pytest.approx(want, abs=2), got  # ends at its value, below
        lengths.append(bar["bottom"] - bar["top"])
    assert lengths[1] > lengths[0] > 0                            # 0.638x longer than 0.735x
    _open(page, _url(app, "report", **_view(ATTN_735)), "Report")
    got = _plot_js(page, "rep_family", BARS_JS, [0.735])
    assert len(got["bars"]) == 1
    assert got["bars"][0]["top"] == pytest.approx(got["one"], abs=2)
    assert got["bars"][0]["bottom"] == pytest.approx(got["values"][0], abs=2)
    page.context.close()


@pytest.mark.slow
def test_the_report_says_not_measured_and_marks_slower_kernels(app, browser):
    """The matmul run: its only kept kernel (0.940x cuBLAS) was left out of the model, so the
    end-to-end check timed the original twice. The headline says "not measured" and why (it
    said "Measured end-to-end speedup 1.000x"), and the kernel is marked slower than eager."""
    page = _page(browser)
    _open(page, _url(app, "report", **_view(MATMUL)), "Report")
    head = page.locator(".st-key-headline")
    head.wait_for(timeout=30_000)
    assert head.locator("[data-testid='stMetricValue']").inner_text() == "not measured"
    assert "matmul: the model ran slower with it" in head.inner_text()
    assert "Measured" not in head.inner_text()
    note = page.locator(".st-key-slower_note")
    assert "matmul slower than eager (0.940×)" in note.inner_text()
    page.locator(".st-key-rep_summary").get_by_text("slower than eager (0.940×)") \
        .wait_for(timeout=30_000)
    # a run measured with its kernels in the model: measured, with what was in it
    _open(page, _url(app, "report", **_view(LLAMA_E2E)), "Report")
    head = page.locator(".st-key-headline")
    assert head.locator("[data-testid='stMetricLabel']").inner_text().startswith(
        "Measured end-to-end speedup over eager")
    assert "with softmax, rotary, rmsnorm swapped in" in head.inner_text()
    page.context.close()


RATIO = re.compile(r"^(?:\d\.\d{3}|\d{2}\.\d|[\d,]{3,}|0\.0\d*[1-9]\d{0,2})×$")


@pytest.mark.slow
def test_number_formats_and_dtype_are_consistent(app, browser):
    """Every ratio on the Report, Compare and Kernels pages is written one way (1.580×,
    0.735×, 12.3×; never 0.00×, never an exponent), and a run started with dtype auto says the
    dtype it ran in."""
    page = _page(browser)
    seen = []
    for url, title in ((_url(app, "report", **_view(GPT2)), "Report"),
                       (_url(app, "compare", cmp=[f"{GPT2[0]}|{GPT2[1]}",
                                                  f"{ATTN_735[0]}|{ATTN_735[1]}"]), "Compare runs"),
                       (_url(app, "kernels", **_view(ATTN_735)), "Kernels")):
        _open(page, url, title)
        page.wait_for_timeout(2500)
        _settled(page)
        text = page.locator("[data-testid='stMain']").inner_text()
        ratios = re.findall(r"[\d.,]*\d×", text)
        seen += ratios
        bad = [r for r in ratios if not RATIO.match(r)]
        assert not bad, f"{title}: {bad}"
        assert "auto" not in re.findall(r"dtype\W+(\w+)", text)
        assert "bfloat16" in text
    assert "0.735×" in seen and "1.580×" in seen
    page.context.close()


@pytest.mark.slow
def test_dark_mode_charts_take_the_theme(app, browser):
    """With the browser in dark mode: the live charts' text is light on a transparent plot
    (they were dark text on white), the other pages' charts too, and the side-by-side diff's
    text follows the page."""
    page = _page(browser, scheme="dark")
    _open(page, _url(app, "", **_view(GPT2)), "Live run")
    _charts(page, 3)
    page.wait_for_timeout(800)
    lum = """(c) => { const m = c.match(/[\\d.]+/g).map(Number);
      return (0.2126 * m[0] + 0.7152 * m[1] + 0.0722 * m[2]) / 255; }"""
    for key in ("chart_speedup", "chart_amdahl", "chart_stages"):
        frame = _chart_frame(page, key)
        frame.wait_for_function("() => document.querySelector('.js-plotly-plot')?._fullLayout")
        look = frame.evaluate("""() => { const l = document.querySelector('.js-plotly-plot')._fullLayout;
            const t = document.querySelector('.gtitle');
            return {plot: l.plot_bgcolor, paper: l.paper_bgcolor,
                    title: t ? getComputedStyle(t).fill : l.font.color}; }""")
        assert look["plot"] in ("rgba(0, 0, 0, 0)", "rgba(0,0,0,0)", "transparent"), look
        assert page.evaluate(lum, look["title"]) > 0.6, look
    _open(page, _url(app, "report", **_view(GPT2)), "Report")
    _charts(page, 4)
    fills = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot'))
        .map(gd => getComputedStyle(gd.querySelector('.gtitle')).fill)""")
    assert fills and all(page.evaluate(lum, f) > 0.6 for f in fills), fills
    _open(page, _url(app, "kernels", **_view(GPT2)), "Kernels")
    _charts(page, 5, timeout_ms=60_000)
    _settled(page)
    page.get_by_text("side by side", exact=True).click(timeout=60_000)
    cell = page.locator(".nsdiff td.diff_add, .nsdiff span.diff_add, .nsdiff span.diff_chg").first
    cell.wait_for(timeout=30_000)
    assert page.evaluate(lum, cell.evaluate("e => getComputedStyle(e).color")) > 0.6
    page.context.close()


# ---- exports -----------------------------------------------------------------------------------
def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_report_csv_and_png_are_made_to_be_read(app, browser):
    """The experiments CSV has ISO times and whole-number ids (it had epoch seconds and
    "3.0"); the charts' PNGs are 2x."""
    import pandas as pd
    page = _page(browser)
    _open(page, _url(app, "report", **_view(GPT2)), "Report")
    _charts(page, 4)
    csv = pd.read_csv(_download(page, "Experiments (CSV)", app["tmp"]), dtype=str)
    assert len(csv) == 16 and list(csv.columns[:2]) == ["run_id", "model"]
    assert csv["created_at"].str.match(r"^2026-11-30T\d\d:\d\d:\d\d\.\d{3}Z$").all()
    assert csv["id"].str.fullmatch(r"\d+").all() and csv["seq"].str.fullmatch(r"\d+").all()
    assert not csv["parent_id"].dropna().str.contains(r"\.").any()
    png = page.get_by_role("button", name="Charts (PNG, zip)")
    if png.is_enabled():  # kaleido found a Chrome or Chromium
        z = zipfile.ZipFile(io.BytesIO(_download(page, "Charts (PNG, zip)", app["tmp"])
                                       .read_bytes()))
        assert len(z.namelist()) == 4
        assert all(_png_size(z.read(n))[0] == 2400 for n in z.namelist())   # 1200 px at 2x
    page.context.close()


@pytest.mark.slow
def test_kernels_page_has_the_parameters_and_the_sources(app, browser):
    """The matmul run's 128 experiments: parallel coordinates from each search parameter that
    varied to the speedup, failed ones on their own tick; speedup against each parameter, an
    importance ranking, the history over wall-clock time; and the kernels as files."""
    from engine.store import Store
    page = _page(browser)
    _open(page, _url(app, "kernels", **_view(MATMUL)), "Kernels")
    dims = _plot_js(page, "k_parcoords_chart", """
        const t = gd._fullData[0];
        return t.dimensions.map(d => ({label: d.label, n: d.values.length,
                                       ticks: (d.ticktext || []).slice()}));""")
    labels = [d["label"] for d in dims]
    assert labels[-1] == "speedup × eager"
    assert {"block_k", "split_k", "loads", "num_stages"} <= set(labels)
    assert all(d["n"] == 128 for d in dims)
    assert "failed" in dims[-1]["ticks"]
    assert _plot_js(page, "k_importance", "return gd._fullData[0].y.length;") >= 4
    assert _plot_js(page, "k_param_scatter",
                    "return Object.keys(gd._fullLayout).filter(k => /^xaxis\\d*$/.test(k)).length;") \
        == len(labels) - 1
    assert _plot_js(page, "k_time", "return gd._fullData.some(t => t.type === 'bar');")
    src = _download(page, "Best kernel (.py)", app["tmp"])
    s = Store(ROOT / MATMUL[0], readonly=True)
    try:
        best = s.experiment(s.targets(MATMUL[1])[0]["best_experiment_id"])["source"]
    finally:
        s.close()
    assert src.read_text() == best and "def kernel_fn" in best
    z = zipfile.ZipFile(_download(page, "Every target's best (zip)", app["tmp"]))
    assert len(z.namelist()) == 1 and z.read(z.namelist()[0]).decode() == best
    page.context.close()


@pytest.mark.slow
def test_compare_downloads_like_a_report(app, browser):
    page = _page(browser)
    cmp = [f"{LLAMA_E2E[0]}|{LLAMA_E2E[1]}", f"{GPT2_E2E[0]}|{GPT2_E2E[1]}"]
    _open(page, _url(app, "compare", cmp=cmp), "Compare runs")
    _charts(page, 3)
    html = _download(page, "Comparison (HTML)", app["tmp"])
    assert html.name.startswith("nightshift-compare-")
    _check_self_contained(browser, html, 3)
    csv = _download(page, "Per family (CSV)", app["tmp"]).read_text().splitlines()
    assert csv[0].startswith("run_label,run_id,family,vs_eager") and len(csv) == 1 + 3 + 2
    png = page.get_by_role("button", name="Charts (PNG, zip)")
    if png.is_enabled():
        z = zipfile.ZipFile(io.BytesIO(_download(page, "Charts (PNG, zip)", app["tmp"])
                                       .read_bytes()))
        assert sorted(z.namelist()) == ["family_speedup.png", "kernel_curves.png",
                                        "projection.png"]
        assert all(_png_size(z.read(n))[0] == 2400 for n in z.namelist())
    page.context.close()


# ---- Runs --------------------------------------------------------------------------------------
def _runs_caption(page) -> tuple[int, int]:
    cap = page.get_by_text(re.compile(r"^\d+ of \d+ runs in \d+ database")).first
    cap.wait_for(timeout=30_000)
    n, total = re.match(r"^(\d+) of (\d+)", cap.inner_text()).groups()
    return int(n), int(total)


def _grid_click_row(page, row: int) -> None:
    """Tick a row's box in the Runs table (a canvas grid: 35 px header, 35 px rows)."""
    grid = page.locator(".st-key-runs_table [data-testid='stDataFrame'], "
                        "[data-testid='stDataFrame']").first
    grid.wait_for(timeout=30_000)
    box = grid.bounding_box()
    page.mouse.click(box["x"] + 14, box["y"] + 35 + 35 * row + 17)
    page.wait_for_timeout(700)


@pytest.mark.slow
def test_the_runs_table_filters_selects_compares_and_keeps_notes(app, browser):
    """Every run of your database and of the recorded ones in one table: the search narrows
    it, ticked rows open in Compare, and notes and tags saved on a run of yours are stored (the
    dashboard's one write) and found by the search."""
    from app import data
    from engine.store import Store
    db = app["tmp"] / "mine.db"
    mine = _live_db(db, status="done")
    page = _page(browser)
    _open(page, _url(app, "runs", db=str(db), run=mine), "Runs")
    runs, _ = data.runs_table([str(db)] + data.recorded_db_paths())
    n, total = _runs_caption(page)
    assert n == total == len(runs) >= 19
    search = page.get_by_role("textbox", name="Search", exact=True)
    search.fill("attention")
    search.press("Enter")
    want = len(data.filter_runs(runs, "attention"))
    page.get_by_text(re.compile(rf"^{want} of {total} runs")).wait_for(timeout=20_000)
    search.fill("")
    search.press("Enter")
    page.get_by_text(re.compile(rf"^{total} of {total} runs")).wait_for(timeout=20_000)

    # the newest two rows (yours, then the newest recorded one) side by side
    _grid_click_row(page, 0)
    _grid_click_row(page, 1)
    compare = page.get_by_role("button", name="Compare")
    page.wait_for_function("() => { const b = Array.from(document.querySelectorAll('button'))"
                           ".find(b => b.innerText.includes('Compare')); return b && !b.disabled; }",
                           timeout=20_000)
    compare.click()
    page.get_by_role("heading", name="Compare runs", level=1).wait_for(timeout=30_000)
    table = page.locator("[data-testid='stTable']").first
    table.wait_for(timeout=60_000)
    assert mine in table.inner_text() and runs.iloc[1]["id"] in table.inner_text()

    # notes on your run
    _open(page, _url(app, "runs", db=str(db), run=mine), "Runs")
    _grid_click_row(page, 0)
    notes = page.get_by_role("textbox", name="Notes")
    notes.wait_for(timeout=20_000)
    notes.fill("rmsnorm looks promising; rerun on the H200")
    page.get_by_role("textbox", name="Tags").fill("cpu, smoke")
    page.get_by_role("textbox", name="Tags").press("Tab")
    page.wait_for_timeout(500)
    page.get_by_role("button", name="Save notes").click()
    page.get_by_text(f"Saved the notes of {mine}.").wait_for(timeout=20_000)
    s = Store(db, readonly=True)
    try:
        row = s.get_run(mine)
    finally:
        s.close()
    assert row["notes"] == "rmsnorm looks promising; rerun on the H200"
    assert row["tags"] == ["cpu", "smoke"]
    search = page.get_by_role("textbox", name="Search", exact=True)
    search.fill("smoke")
    search.press("Enter")
    page.get_by_text(re.compile(rf"^1 of {total} runs")).wait_for(timeout=20_000)
    page.context.close()


# ---- a run on three workers ---------------------------------------------------------------------
WORKER_BARS_JS = """() => {
  const gd = document.querySelector('.js-plotly-plot');
  return gd && gd.data ? gd.data.map(t => [t.name, Array.from(t.x), Array.from(t.y)]) : null;
}"""


@pytest.mark.slow
def test_workers_section_of_a_pool_run(app, browser):
    from test_app_workers import fill_pool_run
    db = app["tmp"] / "pool.db"
    fill_pool_run(db, status="done")
    page = _page(browser)
    page.goto(app["url"])
    page.get_by_text(RECORDED_BADGE).first.wait_for(timeout=30_000)
    path = page.locator("[data-testid='stSidebar']").get_by_role("textbox", name="Database")
    path.fill(str(db))
    path.press("Enter")
    page.get_by_role("heading", name="Workers").wait_for(timeout=30_000)
    page.get_by_text(re.compile(r"^3 workers \(local pool on node-a\) · 0 busy · 1 dead · "
                                "reference w0")).wait_for(timeout=10_000)
    _charts(page, 4)
    bars = None
    deadline = time.monotonic() + 10
    while not bars and time.monotonic() < deadline:  # the frame draws after it is on the page
        bars = _chart_frame(page, "chart_workers").evaluate(WORKER_BARS_JS)
        page.wait_for_timeout(100)
    assert {name: dict(zip(x, y)) for name, x, y in bars} == {
        "kept": {"w0 (ref)": 1, "w1": 2, "w2": 0},
        "reverted": {"w0 (ref)": 1, "w1": 1, "w2": 0},
        "failed": {"w0 (ref)": 0, "w1": 0, "w2": 1}}
    _no_error(page)
    page.context.close()



# ---- presentation mode ---------------------------------------------------------------------------
@pytest.mark.slow
def test_presentation_mode(app, browser):
    """present=1: no sidebar, no toolbar, larger type in the page and in the charts; a button
    leaves it, and the link without it is back."""
    page = _page(browser)
    _open(page, _url(app, "", **_view(GPT2), present=1), "Live run")
    _charts(page, 3)
    assert not page.locator("[data-testid='stSidebar']").is_visible()
    assert page.locator("[data-testid='stHeader']").count() == 0 or \
        not page.locator("[data-testid='stHeader']").is_visible()
    assert page.evaluate("parseFloat(getComputedStyle(document.documentElement).fontSize)") >= 20
    frame = _chart_frame(page, "chart_speedup")
    frame.wait_for_function("() => document.querySelector('.js-plotly-plot')?._fullLayout")
    assert frame.evaluate("document.querySelector('.js-plotly-plot')._fullLayout.font.size") >= 17
    _goto_hidden = page.get_by_role("button", name="Exit presentation")
    _goto_hidden.click()
    page.locator("[data-testid='stSidebar']").wait_for(state="visible", timeout=20_000)
    page.wait_for_function("() => !location.search.includes('present=1')", timeout=20_000)
    assert page.evaluate("parseFloat(getComputedStyle(document.documentElement).fontSize)") < 20
    page.context.close()


# ---- screenshots of every page, light and dark ---------------------------------------------------
PAGES = [  # (file stem, url path, title, view, charts drawn, height)
    ("runs", "runs", "Runs", {}, 0, 1300),
    ("live", "", "Live run", _view(LLAMA_E2E), 3, 2300),
    ("new_run", "new", "New run", {}, 0, 1400),
    ("kernels", "kernels", "Kernels", _view(MATMUL), 6, 4000),
    ("compare", "compare", "Compare runs",
     {"cmp": [f"{LLAMA_E2E[0]}|{LLAMA_E2E[1]}", f"{GPT2_E2E[0]}|{GPT2_E2E[1]}"]}, 3, 3000),
    ("report", "report", "Report", _view(LLAMA_E2E), 4, 2200),
]
SHOTS_ON = os.environ.get("NIGHTSHIFT_SCREENSHOTS") == "1"


@pytest.mark.skipif(not SHOTS_ON, reason="set NIGHTSHIFT_SCREENSHOTS=1 to retake docs/screenshots "
                                         "(3-4 min here)")
@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_screenshots_of_every_page(app, browser, scheme):
    """Every page in one theme, each drawn whole (its charts too) and without an error, as a
    full-page PNG in docs/screenshots/ (the README shows them)."""
    page = _page(browser, scheme=scheme)
    for stem, path, title, params, n_charts, height in PAGES:
        _open(page, _url(app, path, **params), title)
        if n_charts:
            _charts(page, n_charts, timeout_ms=60_000)
        page.wait_for_timeout(1500)
        _no_error(page)
        _shot(page, f"{stem}-{scheme}.png", height)
    page.context.close()


# ---- a CPU run from the New run page -------------------------------------------------------------
@pytest.mark.slow
def test_start_a_run_watch_it_stop_it_and_continue_it(app, browser):
    """The real engine, from the New run page: the count rises, each experiment on the page
    within 3 s of its row landing, a zoom survives the refreshes; Stop ends it, Continue run
    resumes it and the page follows (it used to freeze at "starting"); then the Kernels page
    and the Report, whose HTML download is self-contained and renders offline."""
    from engine.store import Store
    page = _page(browser)
    _open(page, _url(app, "new"), "New run")
    _select(page, "Model", "llama-tiny")
    # one family keeps the run's length predictable: which family the planner picks first
    # depends on the profile, and families differ ~2x in interpreter time
    page.get_by_role("combobox", name="Families").click()
    page.get_by_role("option", name=FAMILY, exact=True).click()
    page.keyboard.press("Escape")
    budget = page.get_by_role("textbox", name="Experiments", exact=True)
    budget.fill(str(BUDGET))
    budget.press("Tab")
    page.wait_for_timeout(500)
    page.get_by_role("button", name="Start").click()

    # the page switches to Live run on the new run (not the recorded one any more)
    page.get_by_role("heading", name="Live run", level=1).wait_for(timeout=180_000)
    page.locator(".st-key-exp_count").wait_for(timeout=60_000)
    assert page.get_by_text(RECORDED_BADGE).count() == 0

    # the first experiment, then Stop (the engine stops after the one in flight)
    seen, latencies, status, zoom = _watch(page, app["db"], RUN_WAIT_S, until=1)
    assert status != "failed", f"the run failed; counts seen {seen}"
    assert seen and seen[-1] >= 1, seen
    if status not in ("done", "stopped"):
        page.get_by_role("button", name="Stop").click()
        status = _wait_status(page, STOP_WAIT_S)
    assert status in ("stopped", "done"), status
    stopped_at = int(_metric(page, "exp_count"))
    if status == "stopped" and stopped_at < BUDGET:
        # Continue run: the page follows the resumed run to its next experiments
        page.get_by_role("button", name="Continue run").click()
        _wait_metric(page, "run_status", lambda t: t in ("starting", "running", "done"), 60)
        more, lat2, status, zoom = _watch(page, app["db"], RUN_WAIT_S, until=stopped_at + 1)
        assert more and more[-1] > stopped_at, f"the continued run did not move: {more}"
        latencies += lat2
    assert latencies and max(latencies) <= SHOW_WITHIN_S, \
        f"new experiments showed {latencies} s after landing (limit {SHOW_WITHIN_S} s)"
    print(f"experiment landed -> shown in the browser: {['%.2f s' % x for x in latencies]}")
    if zoom["checked"]:
        assert zoom["after"] == pytest.approx(zoom["before"], rel=1e-6), zoom

    _charts(page, 3)
    if not _has_gpu():
        assert page.get_by_text(re.compile("interpreter timing — not GPU performance",
                                           re.I)).count() >= 1
    _no_error(page)
    plot = _chart_frame(page, "chart_speedup").locator(".nsewdrag").first
    plot.dblclick()     # the zoom drawn for the check above, undone as a person would
    if SHOTS_ON:
        _shot(page, "live-cpu-run.png", 2300)
    if status not in ("done", "stopped"):
        # ends it after the experiment in flight; the pages below do not wait for that
        page.get_by_role("button", name="Stop").click()
        _wait_metric(page, "run_status", lambda t: t in ("stopping", "stopped", "done"))

    _goto(page, "Kernels")
    page.get_by_text("No roofline for this run").wait_for(timeout=30_000)
    page.locator("[data-testid='stCode']").first.wait_for(timeout=30_000)   # the code diff
    _no_error(page)

    _goto(page, "Report")
    _charts(page, 4)
    head = page.locator(".st-key-headline [data-testid='stMetricLabel']").inner_text()
    assert head.startswith(("Measured end-to-end speedup", "End-to-end speedup",
                            "Projected end-to-end speedup (Amdahl, not measured)")), head
    _no_error(page)
    html = _download(page, "Report (HTML)", app["tmp"])
    assert html.name.startswith("nightshift-llama-tiny-") and html.suffix == ".html"
    _check_self_contained(browser, html, 4)
    runs = Store(app["db"], readonly=True).list_runs()
    assert len(runs) == 1 and runs[0]["model"] == "llama-tiny"
    page.context.close()


def _wait_status(page, wait_s: float) -> str:
    deadline = time.monotonic() + wait_s
    status = ""
    while time.monotonic() < deadline:
        status = _metric(page, "run_status")
        if status in ("done", "failed", "stopped"):
            break
        page.wait_for_timeout(300)
    return status


ZOOM_RANGE_JS = """() => {
  const gd = document.querySelector('.js-plotly-plot');
  return gd && gd._fullLayout ? gd._fullLayout.xaxis.range.slice() : null;
}"""
# experiments drawn in the speedup chart: one marker each (the best-so-far lines aside)
POINTS_JS = """() => document.querySelector('.js-plotly-plot')._fullData
  .filter(t => t.mode === 'markers').reduce((n, t) => n + (t._length || 0), 0)"""


def _zoom_range(page):
    return _chart_frame(page, "chart_speedup").evaluate(ZOOM_RANGE_JS)


def _zoom(page) -> list | None:
    """Drag a zoom box across the middle of the speedup chart, as a person would with the mouse."""
    plot = _chart_frame(page, "chart_speedup").locator(".nsewdrag").first
    box = plot.bounding_box()
    if not box:
        return None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.15, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, y + 2, steps=8)
    page.mouse.move(box["x"] + box["width"] * 0.7, y + 4, steps=8)
    page.mouse.up()
    page.wait_for_timeout(300)
    return _zoom_range(page)


def _watch(page, db: Path, wait_s: float, until: int):
    """Watch the live page until the run ends, ``until`` experiments are shown, or wait_s
    passes.

    For each new experiment count, how long after the experiment's row landed in SQLite the page
    showed it (the browser polls every 50 ms). After the first experiment the speedup chart is
    zoomed; at the next new experiment the zoom must still be there.
    Returns (counts seen, latencies in s, last status, zoom check)."""
    from engine.store import Store
    seen: list[int] = []
    latencies: list[float] = []
    zoom = dict(before=None, after=None, checked=False)
    deadline = time.monotonic() + wait_s
    status = ""
    while time.monotonic() < deadline:
        text = _metric(page, "exp_count")
        status = _metric(page, "run_status")
        _no_error(page)
        if text.isdigit() and (not seen or int(text) != seen[-1]):
            seen.append(int(text))
        if seen and (seen[-1] >= until or (status in ("done", "failed", "stopped")
                                            and len(seen) > 1)):
            break
        if not text.isdigit():
            page.wait_for_timeout(200)
            continue
        if seen[-1] >= 1 and zoom["before"] is None:
            _charts(page, 3)
            zoom["before"] = _zoom(page)
            zoom["points_before"] = _chart_frame(page, "chart_speedup").evaluate(POINTS_JS)
        # wait in the browser for the count to change, polling its text every 50 ms
        remaining = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            page.wait_for_function(
                """(old) => {
                     const el = document.querySelector(".st-key-exp_count [data-testid='stMetricValue']");
                     const st = document.querySelector(".st-key-run_status [data-testid='stMetricValue']");
                     return (el && el.innerText.trim() !== old) ||
                            (st && ['done', 'failed', 'stopped'].includes(st.innerText.trim()));
                   }""", arg=text, polling=50, timeout=remaining)
        except sync_api.TimeoutError:
            break
        shown_at = time.time()
        new = _metric(page, "exp_count")
        if new.isdigit() and int(new) > int(text):
            s = Store(db, readonly=True)
            try:
                row = s.db.execute("SELECT created_at FROM experiments WHERE seq = ?",
                                   [int(new)]).fetchone()
            finally:
                s.close()
            # created_at is stamped just before the row is committed: an upper bound on the lag
            latencies.append(shown_at - row[0])
            if zoom["before"] is not None and not zoom["checked"]:
                frame = _chart_frame(page, "chart_speedup")
                points, until_t = frame.evaluate(POINTS_JS), time.monotonic() + 15
                while points <= zoom["points_before"] and time.monotonic() < until_t:
                    page.wait_for_timeout(100)
                    try:   # the chart's frame is replaced while it redraws
                        points = _chart_frame(page, "chart_speedup").evaluate(POINTS_JS)
                    except sync_api.Error:
                        continue
                zoom.update(after=_zoom_range(page), checked=True, points_after=points)
    return seen, latencies, status, zoom
