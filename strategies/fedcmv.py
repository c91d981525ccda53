"""FedCMv / FedFCMv server-side maths: vertical federated c-means and fuzzy c-means (Bárcena et al. 2024).

The server never sees features or centroids. At initialisation it draws k sample indices (every client
copies those rows into its centroid segment); each round it sums the clients' N x k partial squared
distances into full distances, assigns samples (hard labels for FedCMv, fuzzy memberships for FedFCMv)
and sends the assignment back. Stop with `strategies.vertical.has_converged` (Alg. 2's relative-objective
rule) so that the baselines and CeFMC stop alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.common import Scalar

from fedapp.config.run import RunConfig
from fedapp.methods.fedcmv import FedCMvConfig, FedFCMvConfig
from fedapp.wire import ArraySpec, ReplyError, label_dtype
from strategies.replies import ClientReply
from strategies.vertical import VerticalStrategy


def sum_distances(distance_views: Sequence[np.ndarray]) -> np.ndarray:
    """Full squared distances to the concatenated centroids: the sum of the views' partial distances."""
    shapes = {np.shape(d) for d in distance_views}
    if len(shapes) != 1:
        raise ValueError(f"all clients must send N x k distances of one shape, got {sorted(shapes)}")
    return np.sum([np.asarray(d, dtype=np.float64) for d in distance_views], axis=0)


def hard_assignments(distances: np.ndarray) -> np.ndarray:
    """FedCMv assignment: each sample to its nearest centroid (c-means / Lloyd's E-step)."""
    return np.argmin(distances, axis=1).astype(np.int64)


def fuzzy_memberships(distances: np.ndarray, fuzzifier: float = 2.0) -> np.ndarray:
    """FedFCMv memberships u_ij = 1 / Σ_l (d_ij / d_il)^(1/(m-1)) on squared distances d (Bezdek 1981).

    Computed as (min_l d_il / d_ij)^(1/(m-1)) normalised per row, which cannot overflow. A sample lying on
    one or more centroids (d = 0, e.g. the initial centroids themselves) shares its membership equally
    among those centroids, the standard limit of the formula. Rows sum to 1.
    """
    if fuzzifier <= 1.0:
        raise ValueError(f"the fuzzifier m must be > 1, got {fuzzifier}")
    distances = np.asarray(distances, dtype=np.float64)
    on_centroid = distances <= 0.0
    degenerate = on_centroid.any(axis=1)
    memberships = np.empty_like(distances)
    regular = distances[~degenerate]
    ratios = (regular.min(axis=1, keepdims=True) / regular) ** (1.0 / (fuzzifier - 1.0))
    memberships[~degenerate] = ratios / ratios.sum(axis=1, keepdims=True)
    hits = on_centroid[degenerate].astype(np.float64)
    memberships[degenerate] = hits / hits.sum(axis=1, keepdims=True)
    return memberships


def cmeans_objective(distances: np.ndarray, labels: np.ndarray) -> float:
    """c-means objective Σ_i d_{i, y_i} (within-cluster sum of squares), non-increasing over rounds."""
    return float(np.take_along_axis(distances, np.asarray(labels)[:, None], axis=1).sum())


def fuzzy_cmeans_objective(distances: np.ndarray, memberships: np.ndarray, fuzzifier: float = 2.0) -> float:
    """Fuzzy c-means objective J_m = Σ_ij u_ij^m d_ij, non-increasing over rounds."""
    return float(np.sum(np.asarray(memberships) ** fuzzifier * distances))


def server_round(
    distance_views: Sequence[np.ndarray], *, fuzzy: bool, fuzzifier: float = 2.0
) -> tuple[np.ndarray, np.ndarray, float]:
    """One round: sum partial distances, assign, score. Returns (labels, assignment to send, objective).

    The assignment sent back is the label vector (FedCMv) or the N x k membership matrix (FedFCMv); the
    labels are the hard clustering in both cases (argmax membership for FedFCMv).
    """
    distances = sum_distances(distance_views)
    if fuzzy:
        memberships = fuzzy_memberships(distances, fuzzifier)
        return (
            memberships.argmax(axis=1),
            memberships,
            fuzzy_cmeans_objective(distances, memberships, fuzzifier),
        )
    labels = hard_assignments(distances)
    return labels, labels, cmeans_objective(distances, labels)


# ------------------------------------------------------------------------------------------ Flower glue
class FedCMvStrategy(VerticalStrategy):
    """FedCMv: sums the views' partial distances, assigns each sample to its nearest full centroid and
    sends the labels back; stops on the relative objective change <= delta (as CeFMC)."""

    method = "fedcmv"
    state_fields = ("assignment",)

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.params = cfg.params(FedCMvConfig)
        self.fuzzifier: float | None = None  # FedFCMv's m; None: hard assignments
        self.assignment: np.ndarray | None = None

    def stop_delta(self) -> float:
        return self.params.delta

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        phase = "init" if self.assignment is None else "update"
        config = {**super().fit_config(server_round), "phase": phase}
        if self.fuzzifier is not None:
            config["fuzziness"] = self.fuzzifier
        return config

    def initialised(self) -> bool:
        return self.assignment is not None

    def view_payload(self, view: int) -> list[np.ndarray]:
        assert self.assignment is not None and self.k is not None
        if self.fuzzifier is not None:
            return [self.assignment]
        return [self.assignment.astype(label_dtype(self.k))]

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        return [ArraySpec("partial distances", (self.n_samples, self.k))]

    def check_view_reply(self, server_round: int, reply: ClientReply) -> None:
        if (reply.arrays[0] < 0).any():
            raise ReplyError("negative squared distances")

    def aggregate_views(
        self, round_number: int, arrays: list[np.ndarray], metrics: list[dict[str, Any]]
    ) -> np.ndarray:
        labels, self.assignment, objective = server_round(
            arrays, fuzzy=self.fuzzifier is not None, fuzzifier=self.fuzzifier or 2.0
        )
        self.record_objective(objective)
        return labels


class FedFCMvStrategy(FedCMvStrategy):
    """FedFCMv: fuzzy memberships (fuzzifier `fuzziness`) instead of hard labels."""

    method = "fedfcmv"

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.fuzzifier = cfg.params(FedFCMvConfig).fuzziness
