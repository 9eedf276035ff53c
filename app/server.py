"""`python -m fastrl_app.server run <app/main.py> [streamlit options]`: Streamlit's own command line, started after
importing what every page imports (pandas, scipy.stats, Plotly, DuckDB and the app's modules, ~1 s on these 2
cores). Under plain `streamlit run` that import happens inside the first page a browser opens after the app starts;
here it happens while the server starts, before `fastrl app` says the app is up (`launch.serve`)."""

import sys

import fastrl_app.analysis  # noqa: F401  (imported for their side effect: loaded once, in this process)
import fastrl_app.cached  # noqa: F401
import fastrl_app.charts  # noqa: F401
import fastrl_app.widgets  # noqa: F401
from streamlit.web import cli

if __name__ == "__main__":
    sys.exit(cli.main(prog_name="streamlit"))
