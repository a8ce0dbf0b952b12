"""nightshift dashboard: `streamlit run streamlit_app.py`.

The entry point only declares the pages and draws the sidebar every page shares; the pages live
in app/ (one file each, run by st.navigation). The database path defaults to $NIGHTSHIFT_DB, else
data/runs.db; with no runs there, the pages open the run recorded on an H200 that ships in data/.
"""
import streamlit as st

from app.shared import sidebar

st.set_page_config(page_title="nightshift", page_icon=":material/bolt:", layout="wide")
page = st.navigation([
    st.Page("app/live.py", title="Live run", icon=":material/monitoring:", url_path="live",
            default=True),
    st.Page("app/new_run.py", title="New run", icon=":material/play_arrow:", url_path="new"),
    st.Page("app/kernel_page.py", title="Kernels", icon=":material/memory:", url_path="kernels"),
    st.Page("app/compare.py", title="Compare runs", icon=":material/compare_arrows:",
            url_path="compare"),
    st.Page("app/report.py", title="Report", icon=":material/summarize:", url_path="report"),
])
sidebar()
page.run()
