"""The layer above the library, installed as `fastrl_app` (this folder is `app/` in the checkout): the `fastrl`
command (`cli`; `bench` and `demo` are its training commands, `report` writes the Demo page as one HTML file) and
the Streamlit dashboard (`main` routes to the pages in `views/`; `fastrl app --store DIR` serves it).

The dashboard reads the run store only through `fastrl_core.store`'s read functions and never writes to it.
`fastrl_core` imports nothing from here.
"""
