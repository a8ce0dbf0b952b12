"""The view in the URL: which database, run, target, experiments and compared runs a page shows,
so a reload keeps it and a link opens the same view in another browser.

The page itself is the URL's path (st.navigation's url_path: /runs, /kernels, ...; Live run, the
default page, is the root /). The rest is query parameters:

| parameter | what | read by |
|---|---|---|
| db | the database the run is in, as the sidebar takes it (relative to the repository) | sidebar |
| run | the run id | sidebar |
| target | the target id | Kernels |
| a, b | the two experiments compared, by seq | Kernels |
| cmp | the compared runs, one "database|run id" each (repeated) | Compare runs |
| q | the Runs table's search text | Runs |
| present | 1: presentation mode | every page |

A session reads the URL once, at its first script run (load_once), into session state; from
then on session state is the truth and every full script run writes it back (write), so the
address bar always shows the view. A page names its own parameters with set_page; the
parameters of other pages are dropped from the URL when it is shown.
"""
from __future__ import annotations

import streamlit as st

COMMON = ("db", "run", "present")
PAGE_KEYS = ("target", "a", "b", "cmp", "q")


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def load_once() -> None:
    """At the first script run of a session, copy the URL's view into session state:
    url_db and pending_run_id (the sidebar applies them), url_target / url_a / url_b (Kernels),
    url_cmp (Compare runs), runs_q (Runs) and present."""
    ss = st.session_state
    if ss.get("_view_loaded"):
        return
    ss["_view_loaded"] = True
    qp = st.query_params
    if qp.get("db"):
        ss["url_db"] = qp["db"]
    if qp.get("run"):
        ss["pending_run_id"] = qp["run"]
    for key in ("target", "a", "b"):
        if _int(qp.get(key)) is not None:
            ss[f"url_{key}"] = _int(qp.get(key))
    if qp.get_all("cmp"):
        ss["url_cmp"] = [c for c in qp.get_all("cmp") if "|" in c]
    if qp.get("q"):
        ss["runs_q"] = qp["q"]
    ss["present"] = qp.get("present") == "1"


def set_page(**params) -> None:
    """The shown page's own view parameters (target=..., a=..., cmp=[...]); None leaves one out."""
    st.session_state["_view_page"] = {k: v for k, v in params.items()
                                      if v is not None and v != "" and v != []}


def start_page() -> None:
    """Before a page runs: it has named no parameters yet."""
    st.session_state["_view_page"] = {}


def wanted() -> dict:
    """The query parameters of the current view, as st.query_params.from_dict takes them."""
    ss = st.session_state
    out: dict = {}
    if ss.get("view_db"):
        out["db"] = str(ss["view_db"])
    if ss.get("run_id"):
        out["run"] = str(ss["run_id"])
    for k, v in (ss.get("_view_page") or {}).items():
        out[k] = [str(x) for x in v] if isinstance(v, (list, tuple)) else str(v)
    if ss.get("present"):
        out["present"] = "1"
    return out


def write() -> None:
    """Put the view into the address bar, only when it changed (each change is a message to
    the browser)."""
    want = wanted()
    qp = st.query_params
    have = {k: (qp.get_all(k) if isinstance(want.get(k), list) else qp.get(k)) for k in qp.keys()}
    if have != want:
        qp.from_dict(want)
