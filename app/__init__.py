"""The FastRL dashboard (Streamlit): `fastrl app --store DIR` or `streamlit run app/main.py -- --store DIR`.

It reads the run store only through `fastrl_core.store`'s read functions and never writes to it.
"""
