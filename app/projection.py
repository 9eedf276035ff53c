"""2-D maps of gradient sketches: PCA at once, UMAP fitted in a background thread (docs/notes.md §4).

UMAP's first fit in a process takes 10–30 s on 2 cores (numba compiles it), so it never runs inside a
page request. `SketchMap.project` answers at once: PCA coordinates until the background fit for that
key is ready, then the fitted UMAP coordinates; rollouts that arrive later (a live run) are placed with
`UMAP.transform`, also in the background, and are reported as pending until then.

The fits run in one spawned, daemonic worker process at low priority (a thread alone would hold the GIL while
numba compiles, stalling the app's pages for seconds); a thread per key only waits on it and files the results.
The worker dies with the app.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits  # installed with scikit-learn, which umap-learn requires

MIN_UMAP_POINTS = 20  # below this UMAP's neighbour graph is degenerate; PCA is shown instead


def pca_2d(x: np.ndarray) -> np.ndarray:
    """First two principal components of `x` (n, D) -> (n, 2), signs fixed for stable orientation.

    Axes are the top eigenvectors of the D x D scatter matrix (an SVD of the n x D data when n < D): on 2 busy
    cores an SVD of 2,500 x 256 took 0.05-6 s, the scatter matrix 0.03 s. Each axis is flipped so that its
    largest-magnitude loading is positive, so a map does not mirror itself between refreshes. Missing
    dimensions (n < 2 or D < 2) are zero columns.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"pca_2d expects an (n, D) array, got shape {x.shape}")
    out = np.zeros((x.shape[0], 2))
    if x.shape[0] < 2:
        return out
    centred = x - x.mean(axis=0)
    with threadpool_limits(1, "blas"):  # a 2-thread BLAS on 2 shared cores stalls behind the busy one
        if x.shape[0] >= x.shape[1]:
            _, vectors = np.linalg.eigh(centred.T @ centred)  # ascending eigenvalues, (D, D)
            axes = vectors[:, ::-1][:, :2].T  # (k, D)
        else:
            axes = np.linalg.svd(centred, full_matrices=False)[2][:2]
    axes = axes * np.sign(axes[np.arange(len(axes)), np.abs(axes).argmax(axis=1)])[:, None]
    out[:, : len(axes)] = centred @ axes.T
    return out


_MODELS: dict = {}  # in the worker process: key -> fitted UMAP


def _worker_init(niceness: int) -> None:
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    os.nice(niceness)  # let the trainer on the same cores go first


def _worker_fit(key: Hashable, x: np.ndarray, fit_limit: int, seed: int, n_neighbors: int, min_dist: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """Fit UMAP on a seeded sample of at most `fit_limit` rows of x (n, D), transform the rest.
    Returns (row order (n,), xy (n, 2))."""
    import umap

    rng = np.random.default_rng(seed)
    fit_rows = np.sort(rng.permutation(len(x))[:fit_limit])
    rest = np.setdiff1d(np.arange(len(x)), fit_rows)
    model = umap.UMAP(n_components=2, n_neighbors=min(n_neighbors, len(fit_rows) - 1), min_dist=min_dist,
                      random_state=seed)
    xy_fit = model.fit_transform(x[fit_rows])
    _MODELS[key] = model
    xy_rest = model.transform(x[rest]) if len(rest) else np.zeros((0, 2))
    return np.concatenate([fit_rows, rest]), np.concatenate([xy_fit, xy_rest])


def _worker_transform(key: Hashable, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(len(x)), _MODELS[key].transform(x)


def _serve(connection, niceness: int) -> None:
    """The worker's loop: receive (function name, args), send ("ok", result) or ("error", message)."""
    _worker_init(niceness)
    jobs = {"fit": _worker_fit, "transform": _worker_transform}
    while True:
        try:
            name, args = connection.recv()
        except EOFError:
            return
        try:
            connection.send(("ok", jobs[name](*args)))
        except Exception as error:  # noqa: BLE001 - sent back and shown in the page caption
            connection.send(("error", f"{type(error).__name__}: {error}"))


@dataclass
class Projection:
    xy: np.ndarray  # (n, 2); NaN rows are rollouts not yet placed on the UMAP map
    method: str  # "umap" or "pca"
    pending: int  # rollouts still waiting for the background UMAP fit or transform
    note: str  # one honest sentence for the caption


@dataclass
class _MapState:
    coords: dict = field(default_factory=dict)  # id -> (x, y) on the fitted UMAP map
    queue: list = field(default_factory=list)  # [(ids, sketches)] waiting for the worker
    queued: set = field(default_factory=set)
    fitted: bool = False
    fitting: bool = False
    thread: threading.Thread | None = None
    error: str | None = None


class SketchMap:
    """Per-key (e.g. per run) UMAP maps computed off the request path; thread-safe.

    fit_limit: most sketches used for the fit (a seeded sample; the rest are transformed).
    """

    def __init__(self, *, fit_limit: int = 4096, seed: int = 0, n_neighbors: int = 15, min_dist: float = 0.1,
                 niceness: int = 10):
        self.fit_limit, self.seed = fit_limit, seed
        self.n_neighbors, self.min_dist = n_neighbors, min_dist
        self.niceness = niceness
        self._lock = threading.Lock()
        self._states: dict[Hashable, _MapState] = {}
        self._call_lock = threading.Lock()  # one job at a time in the worker
        self._process = None
        self._connection = None

    def _call(self, name: str, *args):
        """Run `name` in the worker process and wait for it (waiting releases the GIL)."""
        with self._call_lock:
            if self._process is None or not self._process.is_alive():
                context = multiprocessing.get_context("spawn")
                self._connection, child = context.Pipe()
                self._process = context.Process(target=_serve, args=(child, self.niceness), daemon=True,
                                                name="fastrl-umap-worker")
                self._process.start()
                child.close()
            try:
                self._connection.send((name, args))
                status, result = self._connection.recv()
            except (EOFError, OSError):
                raise RuntimeError("the UMAP worker process died") from None
        if status == "error":
            raise RuntimeError(result)
        return result

    def close(self) -> None:
        """Stop the worker process (a new one starts on the next request; fitted maps are forgotten)."""
        process = self._process
        if process is not None:
            process.terminate()  # a waiting _call gets EOFError and lets go of the call lock
            process.join(5)
        with self._call_lock:
            self._process = None
        with self._lock:
            self._states.clear()

    def project(self, key: Hashable, ids: Sequence[Hashable], sketches: np.ndarray) -> Projection:
        """Coordinates for `sketches` (n, D) with row ids `ids`; never blocks on UMAP."""
        sketches = np.asarray(sketches, dtype=np.float32)
        if len(ids) != len(sketches):
            raise ValueError(f"project: {len(ids)} ids for {len(sketches)} sketches")
        with self._lock:
            state = self._states.setdefault(key, _MapState())
            if state.error is not None:
                return Projection(pca_2d(sketches), "pca", 0, f"PCA: the UMAP fit failed ({state.error}).")
            if not state.fitted and not state.fitting and len(ids) < MIN_UMAP_POINTS:
                return Projection(pca_2d(sketches), "pca", 0,
                                  f"PCA: UMAP needs at least {MIN_UMAP_POINTS} sketches, {len(ids)} shown.")
            new = [i for i, rid in enumerate(ids) if rid not in state.coords and rid not in state.queued]
            if new:
                state.queue.append(([ids[i] for i in new], sketches[new]))
                state.queued.update(ids[i] for i in new)
            if state.queue and (state.thread is None or not state.thread.is_alive()):
                state.thread = threading.Thread(target=self._work, args=(key, state), daemon=True,
                                                name=f"fastrl-umap-{key}")
                state.thread.start()
            placed = [state.coords.get(rid) for rid in ids]
        n_placed = sum(p is not None for p in placed)
        if n_placed == 0:
            what = "fitting" if not state.fitted else "placing these rollouts on"
            return Projection(pca_2d(sketches), "pca", len(ids), f"PCA for now: UMAP is {what} its map in the "
                              "background; the page updates when it is done.")
        xy = np.array([p if p is not None else (np.nan, np.nan) for p in placed], dtype=np.float64)
        pending = len(ids) - n_placed
        note = "UMAP of the gradient sketches (fitted in the background; newer rollouts placed with transform)."
        if pending:
            note += f" {pending} newer rollouts are still being placed and are not drawn yet."
        return Projection(xy, "umap", pending, note)

    def wait(self, key: Hashable, timeout: float) -> bool:
        """Block until the key's background work is done (tests, benchmarks); True when finished."""
        with self._lock:
            thread = self._states.get(key, _MapState()).thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _work(self, key: Hashable, state: _MapState) -> None:
        while True:
            with self._lock:
                if not state.queue:
                    return
                ids = [rid for batch_ids, _ in state.queue for rid in batch_ids]
                x = np.concatenate([batch for _, batch in state.queue])
                state.queue.clear()
                state.fitting = not state.fitted
            try:
                if not state.fitted:
                    rows, xy = self._call("fit", key, x, self.fit_limit, self.seed, self.n_neighbors, self.min_dist)
                else:
                    rows, xy = self._call("transform", key, x)
            except Exception as error:  # noqa: BLE001 - reported in the page caption, PCA stays up
                with self._lock:
                    state.error, state.fitting = f"{type(error).__name__}: {error}", False
                    state.queue.clear()
                return
            with self._lock:
                state.fitted, state.fitting = True, False
                for row, point in zip(rows, xy):
                    state.coords[ids[row]] = (float(point[0]), float(point[1]))
                    state.queued.discard(ids[row])
