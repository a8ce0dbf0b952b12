"""nightshift dashboard: `streamlit run streamlit_app.py`.

The entry point only declares the pages and draws the sidebar every page shares; the pages live
in app/. The database path defaults to $NIGHTSHIFT_DB, else data/runs.db.
"""
import streamlit as st

from app import live
from app.shared import sidebar

st.set_page_config(page_title="nightshift", page_icon=":material/bolt:", layout="wide")
page = st.navigation([
    st.Page(live.page, title="Live run", icon=":material/monitoring:", url_path="live",
            default=True),
])
sidebar()
page.run()
