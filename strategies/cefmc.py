"""CeFMC server-side maths (Liu et al., "Communication-Efficient Federated Multi-view Clustering").

What crosses the wire, and so what these functions take and return:

- initialisation: each client sends H_v^(0) (N x k floats, Eq. 20); `initialise_consensus` returns y^(0)
  and C^(0), whose segments C̄_v^(0) (k x k, Eq. 23) go back to client v with y^(0).
- CeFMC rounds: each client sends y_v (N ints) and obj_v; `server_round` returns y, C (segment C̄_v to
  client v) and obj (Eq. 35). The server keeps the segments C̄_v^(0) it sent at initialisation: they are
  the clients' fixed centroid matrices C_v (Eq. 24), so from labels alone it can rebuild
  H_c = [C_1[y_1], ..., C_V[y_V]] (Eq. 17) without ever receiving a representation.
- CeFMC-H rounds (ablation, Sec. V-E): each client sends H_v (N x k floats) and obj_v; H_c = [H_1, ...].

All Y-products use label gathers and k x k contingency counts, never N x k one-hot matrices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from logging import INFO
from typing import Any

import numpy as np
from flwr.common import Scalar, log
from scipy import sparse
from sklearn.cluster import KMeans

from fedapp.config.run import RunConfig
from fedapp.methods.cefmc import CeFMCConfig
from fedapp.wire import ArraySpec, ReplyError, label_dtype
from strategies.replies import ClientReply
from strategies.vertical import VerticalStrategy


def _check_labels(labels: np.ndarray, n_samples: int, k: int, name: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.shape != (n_samples,) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"{name} must be {n_samples} integer labels, got dtype {labels.dtype} shape {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= k):
        raise ValueError(f"{name} must lie in [0, {k}), got range [{labels.min()}, {labels.max()}]")
    return labels.astype(np.int64)  # wire labels are uint8: index arithmetic such as y_v * k must not wrap


def _orthonormal_rows_maximising_trace(P: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
    """C = W Uᵀ with U Σ Wᵀ = P: the maximiser of Tr(C P) s.t. C Cᵀ = I (Eq. 34, Theorem 1 of [43]).

    `active` marks the rows of P (columns of C) that belong to real columns of some H_v; the others are
    zero padding (`clients.cefmc.init_embedding(pad="zero")`), and C keeps them zero so no centroid mass
    goes to directions no client has. With fewer active columns than k, C has orthonormal columns instead.
    """
    if active is None or active.all():
        U, _, Wt = np.linalg.svd(P, full_matrices=False)
        return Wt.T @ U.T
    C = np.zeros((P.shape[1], P.shape[0]))
    C[:, active] = _orthonormal_rows_maximising_trace(P[active])
    return C


def _nonzero_columns(blocks: Sequence[np.ndarray]) -> np.ndarray:
    """Columns of [B_1, ..., B_V] that are not all zero: the real (not zero-padded) representation columns."""
    return np.concatenate([np.any(np.asarray(block) != 0.0, axis=0) for block in blocks])


def _cluster_sums(values: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Yᵀ values (k x d) as a sparse one-hot product: row j sums the rows of `values` labelled j."""
    n_samples = labels.shape[0]
    one_hot_t = sparse.csr_matrix((np.ones(n_samples), (labels, np.arange(n_samples))), shape=(k, n_samples))
    return np.asarray(one_hot_t @ values)


def _co_occurrences(y_v: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """Y_vᵀ Y (k x k): how many samples client v labels a and the server labels b."""
    pairs = np.asarray(y_v, dtype=np.int64) * k + np.asarray(y, dtype=np.int64)
    return np.bincount(pairs, minlength=k * k).reshape(k, k).astype(np.float64)


# --------------------------------------------------------------------------- initialisation


def kmeans_on_representations(
    H_views: Sequence[np.ndarray], k: int, *, seed: int = 0, n_init: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """y^(0) and Ĉ^(0) (k x Vk) from seeded k-means on H_c^(0) = [H_1^(0), ..., H_V^(0)] (Eq. 21)."""
    H_c = np.hstack([np.asarray(H, dtype=np.float64) for H in H_views])
    kmeans = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(H_c)
    return kmeans.labels_.astype(np.int64), kmeans.cluster_centers_


def orthogonalise_centroids(C_hat: np.ndarray) -> np.ndarray:
    """C^(0) = U^(0) V^(0)ᵀ from the SVD of Ĉ^(0) (Eq. 22): the nearest matrix with C Cᵀ = I_k.

    Columns of Ĉ that are zero (zero-padded columns of every H_v^(0)) stay zero, as in Eq. 34.
    """
    C_hat = np.asarray(C_hat, dtype=np.float64)
    active = _nonzero_columns([C_hat])
    U, _, Vt = np.linalg.svd(C_hat[:, active], full_matrices=False)
    C = np.zeros_like(C_hat)
    C[:, active] = U @ Vt
    return C


def split_centroids(C: np.ndarray, n_views: int) -> list[np.ndarray]:
    """[C̄_1, ..., C̄_V] = C (Eq. 23/27): the k x k segment of C that client v receives."""
    if C.shape[1] % n_views:
        raise ValueError(f"C has {C.shape[1]} columns, not a multiple of n_views={n_views}")
    return [segment.copy() for segment in np.hsplit(C, n_views)]


def initialise_consensus(
    H_views: Sequence[np.ndarray], k: int, *, seed: int = 0, n_init: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """Server initialisation (Alg. 2, server lines 2-4): y^(0) by k-means on H_c^(0), C^(0) by Eq. 22.

    Send y^(0) and `split_centroids(C0, V)[v]` to client v; keep those segments: they are the clients'
    fixed C_v (Eq. 24) that `server_round` needs.
    """
    for v, H in enumerate(H_views):
        if H.shape[1] != k:
            raise ValueError(f"H_{v} has {H.shape[1]} columns; CeFMC uses N x k representations with k={k}")
    y0, C_hat = kmeans_on_representations(H_views, k, seed=seed, n_init=n_init)
    return y0, orthogonalise_centroids(C_hat)


# --------------------------------------------------------------------------- CeFMC rounds (labels up)


def update_consensus_labels(
    y_views: Sequence[np.ndarray], C_views: Sequence[np.ndarray], C: np.ndarray
) -> np.ndarray:
    """Y-subproblem: y(i) = argmax_j Q(i, j) (Eq. 32) with Q = H_c Cᵀ (Eq. 31).

    With H_c = [C_1[y_1], ..., C_V[y_V]] (Eq. 17), Q = Σ_v C_v[y_v] C̄_vᵀ = Σ_v (C_v C̄_vᵀ)[y_v]: one row
    gather of a k x k matrix per view, O(V k N).
    """
    k = C.shape[0]
    n_samples = np.asarray(y_views[0]).shape[0]
    scores = np.zeros((n_samples, k))
    for v, (y_v, C_v, C_bar_v) in enumerate(
        zip(y_views, C_views, split_centroids(C, len(C_views)), strict=True)
    ):
        scores += (C_v @ C_bar_v.T)[_check_labels(y_v, n_samples, k, f"y_{v}")]
    return np.argmax(scores, axis=1).astype(np.int64)


def update_consensus_centroids(
    y_views: Sequence[np.ndarray], C_views: Sequence[np.ndarray], y: np.ndarray
) -> np.ndarray:
    """C-subproblem: maximise Tr(C P) s.t. C Cᵀ = I_k (Eq. 33) by C = W Uᵀ (Eq. 34).

    P = H_cᵀ Y stacks C_vᵀ (Y_vᵀ Y) over views; Y_vᵀ Y is the k x k co-occurrence count of (y_v, y).
    """
    k = C_views[0].shape[0]
    y = _check_labels(y, len(y), k, "y")
    P = np.vstack(
        [
            C_v.T @ _co_occurrences(_check_labels(y_v, len(y), k, "y_v"), y, k)
            for y_v, C_v in zip(y_views, C_views, strict=True)
        ]
    )
    return _orthonormal_rows_maximising_trace(P, _nonzero_columns(C_views))


def label_integration(
    y_views: Sequence[np.ndarray], C_views: Sequence[np.ndarray], y: np.ndarray, C: np.ndarray
) -> float:
    """Tr(H_cᵀ Y C) = Σ_v Σ_ab (Y_vᵀ Y)_ab <C_v[a], C̄_v[b]>, the label-integration term of Eq. 18/35."""
    k = C.shape[0]
    return float(
        sum(
            np.sum(_co_occurrences(np.asarray(y_v), np.asarray(y), k) * (C_v @ C_bar_v.T))
            for y_v, C_v, C_bar_v in zip(y_views, C_views, split_centroids(C, len(C_views)), strict=True)
        )
    )


def consensus_objective(
    y_views: Sequence[np.ndarray],
    C_views: Sequence[np.ndarray],
    y: np.ndarray,
    C: np.ndarray,
    view_objectives: Sequence[float],
    *,
    beta: float,
) -> float:
    """obj = β Tr(H_cᵀ Y C) + Σ_v obj_v (Eq. 35), the Eq. 19 objective at the current iterate."""
    return beta * label_integration(y_views, C_views, y, C) + float(np.sum(view_objectives))


def server_round(
    y_views: Sequence[np.ndarray],
    view_objectives: Sequence[float],
    C_views: Sequence[np.ndarray],
    C: np.ndarray,
    *,
    beta: float,
) -> tuple[np.ndarray, np.ndarray, float]:
    """One CeFMC server round (Alg. 2, server lines 9-13): y by Eq. 32, C by Eq. 34, obj by Eq. 35.

    `C_views` are the fixed C_v = C̄_v^(0) kept from initialisation, `C` the consensus centroids of the
    previous round. Returns (y, C, obj); client v then receives y and `split_centroids(C, V)[v]`.
    """
    y = update_consensus_labels(y_views, C_views, C)
    C = update_consensus_centroids(y_views, C_views, y)
    return y, C, consensus_objective(y_views, C_views, y, C, view_objectives, beta=beta)


# --------------------------------------------------------------------------- CeFMC-H rounds (H_v up)


def update_consensus_labels_full(H_views: Sequence[np.ndarray], C: np.ndarray) -> np.ndarray:
    """CeFMC-H Y-subproblem: Eq. 31-32 with H_c = [H_1, ..., H_V], i.e. Q = Σ_v H_v C̄_vᵀ."""
    scores = sum(
        np.asarray(H_v) @ C_bar_v.T
        for H_v, C_bar_v in zip(H_views, split_centroids(C, len(H_views)), strict=True)
    )
    return np.argmax(scores, axis=1).astype(np.int64)


def update_consensus_centroids_full(H_views: Sequence[np.ndarray], y: np.ndarray) -> np.ndarray:
    """CeFMC-H C-subproblem: Eq. 33-34 with P = H_cᵀ Y = [Yᵀ H_1, ..., Yᵀ H_V]ᵀ (cluster sums of H_v)."""
    k = H_views[0].shape[1]
    y = _check_labels(y, H_views[0].shape[0], k, "y")
    P = np.vstack([_cluster_sums(H_v, y, k).T for H_v in H_views])
    return _orthonormal_rows_maximising_trace(P, _nonzero_columns(H_views))


def consensus_objective_full(
    H_views: Sequence[np.ndarray],
    y: np.ndarray,
    C: np.ndarray,
    view_objectives: Sequence[float],
    *,
    beta: float,
) -> float:
    """CeFMC-H objective: β Tr(H_cᵀ Y C) + Σ_v Tr(H_vᵀ K_v H_v) (Eq. 35 with H_c = [H_1, ..., H_V])."""
    k = C.shape[0]
    alignment = sum(
        float(np.sum(_cluster_sums(H_v, y, k) * C_bar_v))
        for H_v, C_bar_v in zip(H_views, split_centroids(C, len(H_views)), strict=True)
    )
    return beta * alignment + float(np.sum(view_objectives))


def server_round_full(
    H_views: Sequence[np.ndarray], view_objectives: Sequence[float], C: np.ndarray, *, beta: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """One CeFMC-H server round: y (Eq. 32), C (Eq. 34) and obj (Eq. 35) from the received H_v."""
    y = update_consensus_labels_full(H_views, C)
    C = update_consensus_centroids_full(H_views, y)
    return y, C, consensus_objective_full(H_views, y, C, view_objectives, beta=beta)


# ------------------------------------------------------------------------------------------ Flower glue
class CeFMCStrategy(VerticalStrategy):
    """CeFMC server (Alg. 2). Round 1: H_v^(0) from every view -> y^(0), C^(0). Then one round per
    iteration: y_v + obj_v from every view -> y, C, obj; stops on the relative objective change <= delta.
    Each client gets y and its own segment C̄_v only (per-client FitIns)."""

    method = "cefmc"
    full_representation = False
    state_fields = ("y", "C", "C_views", "initial_labels")

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.params = cfg.params(CeFMCConfig)
        self.y: np.ndarray | None = None
        self.C: np.ndarray | None = None
        self.C_views: list[np.ndarray] = []  # the fixed C_v = C̄_v^(0) (Eq. 24), kept from initialisation
        self.initial_labels: np.ndarray | None = None

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        return {
            **super().fit_config(server_round),
            "phase": "init" if self.C is None else "update",
            "lambda": self.params.lam,
            "beta": self.params.effective_beta,
            "mm-factor": self.params.mm_factor,
            "h-iters": self.params.h_iters,
            "pad": self.params.pad,
        }

    def stop_delta(self) -> float:
        return self.params.delta

    def view_payload(self, view: int) -> list[np.ndarray]:
        assert self.y is not None and self.C is not None
        return [self.y.astype(label_dtype(self.C.shape[0])), split_centroids(self.C, self.n_views)[view]]

    def initialised(self) -> bool:
        return self.C is not None

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        if self.C is None:
            return [ArraySpec("H_v", (self.n_samples, self.k))]
        if self.full_representation:
            return [ArraySpec("H_v", (self.n_samples, self.k))]
        return [ArraySpec("y_v", (self.n_samples,), "i")]

    def check_view_reply(self, server_round: int, reply: ClientReply) -> None:
        objective = reply.metrics.get("objective")
        if self.C is not None and not (isinstance(objective, float) and math.isfinite(objective)):
            raise ReplyError(f"metrics need a finite float 'objective' (obj_v, Eq. 30), got {objective!r}")

    def aggregate_views(self, round_number: int, arrays: list[np.ndarray], metrics: list[dict]) -> np.ndarray:
        beta = self.params.effective_beta
        if self.C is None:
            assert self.k is not None
            self.y, self.C = initialise_consensus(arrays, self.k, seed=self.cfg.seed)
            self.C_views = split_centroids(self.C, self.n_views)
            self.initial_labels = self.y.copy()
            return self.y
        view_objectives = [float(m["objective"]) for m in metrics]
        if self.full_representation:
            y, C, objective = server_round_full(arrays, view_objectives, self.C, beta=beta)
        else:
            y, C, objective = server_round(arrays, view_objectives, self.C_views, self.C, beta=beta)
        self.y, self.C = y, C
        log(INFO, "round %d: CeFMC objective %.6f", round_number, objective)
        self.record_objective(objective)
        return y

    def extra_summary(self) -> dict[str, Any]:
        moved = None
        if self.initial_labels is not None and self.y is not None:
            moved = float(np.mean(self.initial_labels != self.y))
        return {**super().extra_summary(), "labels_changed_since_init": moved}


class CeFMCHStrategy(CeFMCStrategy):
    """CeFMC-H ablation (Sec. V-E): clients send H_v every round instead of labels."""

    method = "cefmc-h"
    full_representation = True
