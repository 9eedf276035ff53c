"""FastRL dashboard entry point: only the router (st.navigation over the page files in app/views/;
not app/pages/: Streamlit 1.67 would then ignore st.navigation and list that folder itself).

    streamlit run app/main.py -- --store runs      (or FASTRL_STORE=runs; default ./runs)
"""

from pathlib import Path

import streamlit as st

from fastrl_app import cached

PAGES = Path(__file__).parent / "views"

st.set_page_config(page_title="FastRL", page_icon=":material/bolt:", layout="wide")
# The default page is served at the root and Streamlit gives it the URL path "" whatever url_path says, so
# `/runs` matched no page ("Page not found", then the default): a hidden page serves the same file at /runs.
navigation = st.navigation([
    st.Page(PAGES / "runs.py", title="Runs", icon=":material/monitoring:", url_path="home", default=True),
    st.Page(PAGES / "runs.py", title="Runs", icon=":material/monitoring:", url_path="runs", visibility="hidden"),
    st.Page(PAGES / "budget.py", title="Budget", icon=":material/tune:", url_path="budget"),
    st.Page(PAGES / "rollouts.py", title="Rollouts", icon=":material/search:", url_path="rollouts"),
    st.Page(PAGES / "embeddings.py", title="Embeddings", icon=":material/scatter_plot:", url_path="embeddings"),
    st.Page(PAGES / "demo.py", title="Demo", icon=":material/slideshow:", url_path="demo"),
])
navigation.run()
cached.damage_notice()  # the damaged store files the page's reads skipped, named (widgets.stop does it on a stop)
