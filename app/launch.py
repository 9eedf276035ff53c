"""Start the dashboard as a `streamlit run` subprocess and wait until it answers (docs/notes.md §4).

The store directory reaches the app as `--store DIR` after streamlit's `--` (and as FASTRL_STORE for
anything the app spawns); see `fastrl_app.cached.store_dir`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ENTRY = Path(__file__).with_name("main.py")
SERVER = "fastrl_app.server"  # streamlit's command line, the pages' imports done first


def streamlit_command(store_dir: Path, *, port: int, address: str, entry: Path = ENTRY,
                      server: str = SERVER) -> list[str]:
    """The `streamlit run` command line for the app on `store_dir` (through `fastrl_app.server`, which imports what
    the pages import first, so the first page opened does not wait for it). The benchmarks serve another `entry`
    (benchmarks/floor_page.py) or use `server="streamlit"` (plain `streamlit run`) with the same options."""
    return [
        sys.executable, "-m", server, "run", str(entry),
        "--server.headless", "true",
        "--server.address", address,
        "--server.port", str(port),
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--browser.gatherUsageStats", "false",
        "--client.showErrorDetails", "none",  # an error shows as one generic line: no traceback, no paths
        "--client.toolbarMode", "viewer",  # no Deploy button, rerun or clear-cache items: the user only reads runs
        "--", "--store", str(Path(store_dir).resolve()),
    ]


class PortTaken(RuntimeError):
    """The port the app should serve on is already in use (another dashboard, or any other server)."""


def check_port_free(port: int, address: str = "127.0.0.1") -> None:
    """PortTaken (one line naming the port) when a server already listens on `address:port`. Binds with
    SO_REUSEADDR as Streamlit's server does, so a port left in TIME_WAIT by a server that just stopped counts as
    free, as it does for Streamlit."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise PortTaken(f"port {port} on {address} is already in use by another process "
                            "(another dashboard?); stop it or pick a free port with --port") from None


def _die_with_parent() -> None:
    """Linux: SIGTERM the app when the process that started it dies (even by SIGKILL), so no server is orphaned."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def wait_healthy(port: int, timeout: float = 60.0, *, address: str = "127.0.0.1",
                 process: subprocess.Popen | None = None) -> None:
    """Poll `http://address:port/_stcore/health` until it says "ok".

    Raises TimeoutError after `timeout` seconds, or RuntimeError as soon as `process` has exited.
    """
    url = f"http://{address}:{port}/_stcore/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the app exited with code {process.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.read().strip() == b"ok":
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer 'ok' within {timeout:.0f} s")


def serve(store_dir: Path, *, port: int = 8501, address: str = "127.0.0.1", timeout: float = 60.0,
          log_path: Path | None = None, entry: Path = ENTRY, server: str = SERVER) -> subprocess.Popen:
    """Start the app on `store_dir` at http://address:port and return once it is healthy (`entry`, `server`: as
    for `streamlit_command`).

    A port another process already listens on raises PortTaken before anything starts (else the health check
    would be answered by that process, and its page shown as this store's). The app's output goes to `log_path`
    (default: a file in the temp directory named after the port); on failure the error names that file and quotes
    its last lines. Stop it with `process.terminate()`; on Linux it also stops when the calling process dies.
    """
    check_port_free(port, address)
    store_dir = Path(store_dir)
    log_path = Path(log_path or Path(tempfile.gettempdir()) / f"fastrl-app-{port}.log")
    env = {**os.environ, "FASTRL_STORE": str(store_dir.resolve())}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(streamlit_command(store_dir, port=port, address=address, entry=entry, server=server),
                                   stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent)
    try:
        wait_healthy(port, timeout, address=address, process=process)
    except (TimeoutError, RuntimeError) as error:
        process.terminate()
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"{error}; app log {log_path}:\n{tail}") from None
    return process
