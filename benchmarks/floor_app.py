"""The least a dashboard with pages and controls can be: two pages named as the app's first two (st.navigation),
each a title, one three-point Plotly chart and the Rollouts page's Kept and Correct radios (in the sidebar).
`bench_interactions.py --floor` serves it with the same Streamlit and times page switches and radio changes in the
same browser: what any interaction costs on this machine before the app's own work."""

import plotly.graph_objects as go
import streamlit as st


def page(title: str):
    def draw() -> None:
        st.title(title)
        for name in ("Kept", "Correct"):
            st.sidebar.radio(name, ["all", "yes", "no"], horizontal=True, key=f"{title}_{name}")
        st.plotly_chart(go.Figure(go.Scatter(x=[1, 2, 3], y=[1, 3, 2])), key="chart")

    return st.Page(draw, title=title, url_path=title.lower())


st.navigation([page("Budget"), page("Rollouts")]).run()
