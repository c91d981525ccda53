"""In-memory, Flower-free reference runs of CeFMC, CeFMC-H, FedCMv, FedFCMv and centralized k-means.

Each run calls the client functions once per view and the server functions in exactly the order of the
federated message flow, and counts the bytes each message would carry: labels and sample indices as
int32, everything else as float64 (H_v^(0), C̄_v, obj_v, distances, memberships). float64 is kept (float32
was not validated); it is also what the paper's Table VII implies (HW, 6 clients: 1.21 MB after 2 rounds,
1.32 MB after 3, paper 1.3 MB; float32 would give 0.73 MB after 2). Totals are summed over all clients
and both directions; index 0 of the per-round lists is the initialisation exchange. These runs are the
numbers the Flower implementation must reproduce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.cluster import KMeans

from clients import cefmc as cefmc_client
from clients import fedcmv as fedcmv_client
from fedapp.datasets.preprocessing import scale_view
from fedapp.methods.fedcmv import choose_initial_samples
from strategies import cefmc as cefmc_server
from strategies import fedcmv as fedcmv_server
from strategies.vertical import has_converged

METHODS = ("cefmc", "cefmc-h", "fedcmv", "fedfcmv", "kmeans")
LABEL_WIRE_DTYPE = np.int32
FLOAT_WIRE_DTYPE = np.float64


@dataclass(frozen=True)
class ReferenceRun:
    """Outcome of one reference run.

    `objectives[t - 1]` is the objective after round t (Eq. 35 for CeFMC/CeFMC-H, maximised; the c-means
    objectives for the baselines, minimised; the k-means inertia for `kmeans`). `initial_labels` is the
    consensus y^(0) of CeFMC/CeFMC-H (None otherwise), to measure how far the rounds move the labels.
    """

    method: str
    labels: np.ndarray
    objectives: list[float]
    bytes_up: list[int]
    bytes_down: list[int]
    converged: bool
    initial_labels: np.ndarray | None = None

    @property
    def n_rounds(self) -> int:
        """Number of training rounds run after the initialisation exchange."""
        return len(self.objectives) if self.method != "kmeans" else 0

    @property
    def total_bytes(self) -> int:
        """All bytes that crossed the wire, both directions, all clients, initialisation included."""
        return sum(self.bytes_up) + sum(self.bytes_down)


class _Wire:
    """Per-round byte counts; `send_up`/`send_down` return what the receiver gets (in the wire dtypes)."""

    def __init__(self) -> None:
        self.up: list[int] = []
        self.down: list[int] = []

    def next_round(self) -> None:
        self.up.append(0)
        self.down.append(0)

    def _send(self, ledger: list[int], payload: np.ndarray | float) -> np.ndarray:
        array = np.asarray(payload)
        array = array.astype(LABEL_WIRE_DTYPE if np.issubdtype(array.dtype, np.integer) else FLOAT_WIRE_DTYPE)
        ledger[-1] += array.nbytes
        return array

    def send_up(self, payload: np.ndarray | float) -> np.ndarray:
        """Client -> server."""
        return self._send(self.up, payload)

    def send_down(self, payload: np.ndarray | float) -> np.ndarray:
        """Server -> client."""
        return self._send(self.down, payload)


def _check_views(views: Sequence[np.ndarray], n_clusters: int, max_rounds: int = 1) -> None:
    if not views:
        raise ValueError("at least one view is needed")
    rows = {len(X) for X in views}
    if len(rows) != 1:
        raise ValueError(
            f"all views must hold the same samples (vertical split), got row counts {sorted(rows)}"
        )
    if not 1 <= n_clusters <= rows.pop():
        raise ValueError(f"n_clusters must be in [1, n_samples], got {n_clusters}")
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")


def _stop(objectives: list[float], objective: float, delta: float | None) -> bool:
    """Alg. 2's relative-change rule against the previous round; `delta=None` runs all `max_rounds`."""
    return delta is not None and has_converged(objectives[-1] if objectives else None, objective, delta)


Inbox = list[tuple[np.ndarray, np.ndarray]]


def _broadcast_consensus(y: np.ndarray, C: np.ndarray, n_views: int, wire: _Wire) -> Inbox:
    """Server -> every client v: the consensus labels y and its own segment C̄_v of C (Alg. 2, line 5/12)."""
    return [(wire.send_down(y), wire.send_down(C_bar)) for C_bar in cefmc_server.split_centroids(C, n_views)]


def _initialise_cefmc(
    views: Sequence[np.ndarray], k: int, wire: _Wire, *, n_init: int, seed: int, pad: str
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, Inbox]:
    """Shared CeFMC/CeFMC-H initialisation exchange: H_v^(0) up, y^(0) and C̄_v^(0) down.

    Returns the clients' H_v^(0), the server's y^(0) and C^(0), and what each client received.
    """
    wire.next_round()
    H_views = [
        cefmc_client.init_embedding(X, k, np.random.default_rng([seed, v]), pad=pad)
        for v, X in enumerate(views)
    ]
    y, C = cefmc_server.initialise_consensus([wire.send_up(H) for H in H_views], k, seed=seed, n_init=n_init)
    return H_views, y, C, _broadcast_consensus(y, C, len(views), wire)


def run_cefmc(
    views: Sequence[np.ndarray],
    n_clusters: int,
    *,
    lam: float = 1.0,
    beta: float | None = None,
    mm_factor: float = 2.0,
    h_iters: int = 1,
    delta: float | None = 1e-6,
    max_rounds: int = 100,
    n_init: int = 10,
    seed: int = 0,
    pad: str = "zero",
    full_representation: bool = False,
) -> ReferenceRun:
    """CeFMC (Alg. 2) on already-scaled views; `beta=None` means β = λ, the paper's recommendation.

    `full_representation`: the CeFMC-H ablation, same initialisation, then clients send H_v (N x k floats)
    instead of y_v; it has no approximation term, so λ only serves as the default for β."""
    _check_views(views, n_clusters, max_rounds)
    beta = lam if beta is None else beta
    wire = _Wire()
    H_views, y, C, inbox = _initialise_cefmc(views, n_clusters, wire, n_init=n_init, seed=seed, pad=pad)
    # Eq. 24: each client fixes C_v = C̄_v^(0) and starts from y_v = y^(0); the server keeps the C_v it sent.
    client_centroids = [C_bar for _, C_bar in inbox]
    client_labels = [y_received for y_received, _ in inbox]
    server_centroids = cefmc_server.split_centroids(C, len(views))
    initial_labels = y
    objectives: list[float] = []
    converged = False
    while not converged and len(objectives) < max_rounds:
        wire.next_round()
        received, received_objectives = [], []
        for v, (X, (y_received, C_bar_received)) in enumerate(zip(views, inbox, strict=True)):
            if full_representation:
                H_views[v], obj_v = cefmc_client.client_round_full_representation(
                    X, H_views[v], y_received, C_bar_received, beta=beta, mm_factor=mm_factor, n_iter=h_iters
                )
                received.append(wire.send_up(H_views[v]))
            else:
                H_views[v], client_labels[v], obj_v = cefmc_client.client_round(
                    X,
                    H_views[v],
                    client_labels[v],
                    client_centroids[v],
                    y_received,
                    C_bar_received,
                    lam=lam,
                    beta=beta,
                    mm_factor=mm_factor,
                    n_iter=h_iters,
                )
                received.append(wire.send_up(client_labels[v]))
            received_objectives.append(float(wire.send_up(obj_v)))
        if full_representation:
            y, C, objective = cefmc_server.server_round_full(received, received_objectives, C, beta=beta)
        else:
            y, C, objective = cefmc_server.server_round(
                received, received_objectives, server_centroids, C, beta=beta
            )
        inbox = _broadcast_consensus(y, C, len(views), wire)
        converged = _stop(objectives, objective, delta)
        objectives.append(objective)
    name = "cefmc-h" if full_representation else "cefmc"
    return ReferenceRun(name, y, objectives, wire.up, wire.down, converged, initial_labels)


def run_cefmc_h(views: Sequence[np.ndarray], n_clusters: int, **settings: Any) -> ReferenceRun:
    """CeFMC-H ablation (`run_cefmc` with `full_representation`): clients send H_v instead of y_v."""
    return run_cefmc(views, n_clusters, full_representation=True, **settings)


def run_vertical_cmeans(
    views: Sequence[np.ndarray],
    n_clusters: int,
    *,
    fuzzy: bool = False,
    fuzzifier: float = 2.0,
    delta: float | None = 1e-6,
    max_rounds: int = 100,
    seed: int = 0,
) -> ReferenceRun:
    """FedCMv (`fuzzy=False`) or FedFCMv (`fuzzy=True`): partial distances up, labels/memberships down."""
    _check_views(views, n_clusters, max_rounds)
    wire = _Wire()
    wire.next_round()
    indices = choose_initial_samples(len(views[0]), n_clusters, seed)
    segments = [fedcmv_client.init_centroids(X, wire.send_down(indices)) for X in views]
    objectives: list[float] = []
    converged = False
    while not converged and len(objectives) < max_rounds:
        wire.next_round()
        distances = [
            wire.send_up(fedcmv_client.squared_distances(X, C_v))
            for X, C_v in zip(views, segments, strict=True)
        ]
        labels, assignment, objective = fedcmv_server.server_round(
            distances, fuzzy=fuzzy, fuzzifier=fuzzifier
        )
        received = [wire.send_down(assignment) for _ in views]
        if fuzzy:
            segments = [
                fedcmv_client.update_centroids_fuzzy(X, U, fuzzifier)
                for X, U in zip(views, received, strict=True)
            ]
        else:
            segments = [
                fedcmv_client.update_centroids_hard(X, y_v, C_v)
                for X, y_v, C_v in zip(views, received, segments, strict=True)
            ]
        converged = _stop(objectives, objective, delta)
        objectives.append(objective)
    return ReferenceRun("fedfcmv" if fuzzy else "fedcmv", labels, objectives, wire.up, wire.down, converged)


def run_central_kmeans(
    views: Sequence[np.ndarray], n_clusters: int, *, n_init: int = 10, seed: int = 0
) -> ReferenceRun:
    """Centralized k-means on the concatenated views; its "communication" is uploading every view once."""
    _check_views(views, n_clusters)
    kmeans = KMeans(n_clusters=n_clusters, n_init=n_init, random_state=seed).fit(np.hstack(views))
    upload = sum(np.size(X) for X in views) * np.dtype(FLOAT_WIRE_DTYPE).itemsize
    return ReferenceRun(
        "kmeans", kmeans.labels_.astype(np.int64), [float(kmeans.inertia_)], [upload], [0], True
    )


def run_reference(
    method: str,
    views: Sequence[np.ndarray],
    n_clusters: int,
    *,
    scaling: str = "none",
    lam: float = 1.0,
    beta: float | None = None,
    mm_factor: float = 2.0,
    h_iters: int = 1,
    fuzzifier: float = 2.0,
    delta: float | None = 1e-6,
    max_rounds: int = 100,
    n_init: int = 10,
    seed: int = 0,
    pad: str = "zero",
) -> ReferenceRun:
    """Scale every view on its own client (`scale_view`), then run `method` (one of `METHODS`)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    scaled = [scale_view(X, scaling) for X in views]
    if method in ("cefmc", "cefmc-h"):
        runner = run_cefmc if method == "cefmc" else run_cefmc_h
        return runner(
            scaled,
            n_clusters,
            lam=lam,
            beta=beta,
            mm_factor=mm_factor,
            h_iters=h_iters,
            delta=delta,
            max_rounds=max_rounds,
            n_init=n_init,
            seed=seed,
            pad=pad,
        )
    if method in ("fedcmv", "fedfcmv"):
        return run_vertical_cmeans(
            scaled,
            n_clusters,
            fuzzy=method == "fedfcmv",
            fuzzifier=fuzzifier,
            delta=delta,
            max_rounds=max_rounds,
            seed=seed,
        )
    return run_central_kmeans(scaled, n_clusters, n_init=n_init, seed=seed)
