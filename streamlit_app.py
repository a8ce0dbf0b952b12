"""nightshift dashboard: `streamlit run streamlit_app.py`.

The entry point only declares the pages, reads and writes the view in the URL (app/view.py) and
draws the sidebar every page shares; the pages live in app/ (one file each, run by
st.navigation). The database path defaults to $NIGHTSHIFT_DB, else data/runs.db; with no runs
there, the pages open the runs recorded on an H200 that ship in data/.
"""
from pathlib import Path

import streamlit as st

from app import view
from app.shared import presentation, sidebar

# A local file, not an emoji or ":material/...:" icon: Streamlit fetches those favicons from a
# CDN, and the dashboard makes no request that leaves the machine.
ICON = str(Path(__file__).resolve().parent / "app" / "static" / "favicon.png")

st.set_page_config(page_title="nightshift", page_icon=ICON, layout="wide")
page = st.navigation([
    st.Page("app/runs_page.py", title="Runs", icon=":material/table_rows:", url_path="runs"),
    st.Page("app/live.py", title="Live run", icon=":material/monitoring:", url_path="live",
            default=True),
    st.Page("app/new_run.py", title="New run", icon=":material/play_arrow:", url_path="new"),
    st.Page("app/kernel_page.py", title="Kernels", icon=":material/memory:", url_path="kernels"),
    st.Page("app/compare.py", title="Compare runs", icon=":material/compare_arrows:",
            url_path="compare"),
    st.Page("app/report.py", title="Report", icon=":material/summarize:", url_path="report"),
])
view.load_once()
sidebar()
presentation()
view.start_page()
page.run()
view.write()
