"""FastRL dashboard entry point: only the router (st.navigation over the page files in app/views/;
not app/pages/: Streamlit 1.67 would then ignore st.navigation and list that folder itself).

    streamlit run app/main.py -- --store runs      (or FASTRL_STORE=runs; default ./runs)

Nothing a page loads comes from outside the server: the favicon is an emoji (Streamlit draws it as an inline SVG;
a ":material/...:" page icon would be fetched from fonts.gstatic.com), and the Material icons in the sidebar come
from the font Streamlit serves itself.
"""

import time
from pathlib import Path

import streamlit as st

from fastrl_app import cached, widgets

PAGES = Path(__file__).parent / "views"
FAVICON = "⚡"
# Streamlit serves the default page only at the root (its url_path, "index" here, is reserved but opens nothing), so
# an address naming it (`/runs`, or `/home`, the usual name of a root page) matched no page ("Page not found", then
# the default): hidden pages serve the same file at each of these addresses.
RUNS_ADDRESSES = ("runs", "home")

SIDEBAR_PX = 400  # the run picker shows a whole run id (name, date, time) and its status
st.set_page_config(page_title="FastRL", page_icon=FAVICON, layout="wide", initial_sidebar_state=SIDEBAR_PX)
navigation = st.navigation([
    st.Page(PAGES / "runs.py", title="Runs", icon=":material/monitoring:", url_path="index", default=True),
    *[st.Page(PAGES / "runs.py", title="Runs", icon=":material/monitoring:", url_path=address, visibility="hidden")
      for address in RUNS_ADDRESSES],
    st.Page(PAGES / "budget.py", title="Budget", icon=":material/tune:", url_path="budget"),
    st.Page(PAGES / "rollouts.py", title="Rollouts", icon=":material/search:", url_path="rollouts"),
    st.Page(PAGES / "embeddings.py", title="Embeddings", icon=":material/scatter_plot:", url_path="embeddings"),
    st.Page(PAGES / "demo.py", title="Demo", icon=":material/slideshow:", url_path="demo"),
])
started = time.monotonic()
try:
    navigation.run()
finally:  # also on st.stop(): what drawing the page cost, which paces its live redraws (widgets.redraw_on_change)
    widgets.page_drawn(started)
cached.damage_notice()  # the damaged store files the page's reads skipped, named (widgets.stop does it on a stop)
