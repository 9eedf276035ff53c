"""The least a dashboard page can be: a title and one three-point Plotly chart. `bench_pages.floor_times` serves it
with the same Streamlit and times it in the same browser, beside the app's pages: on a 2-core machine the browser
spends about a second evaluating Streamlit's Plotly bundle (4.6 MB of JavaScript) before the first chart appears."""

import plotly.graph_objects as go
import streamlit as st

st.title("Floor")
st.plotly_chart(go.Figure(go.Scatter(x=[1, 2, 3], y=[1, 3, 2])), key="chart")
