"""k-FED client (Dennis et al., ICML 2021, Alg. 1 local step): k' local k-means centres, sent once."""

from __future__ import annotations

import numpy as np
from flwr.common import NDArrays, Scalar

from clients.base import ClusteringClient
from fedapp.clustering import nearest_centre
from fedapp.methods.kfed import KFedConfig
from fedapp.privacy import CLIENT_MIN_CLUSTER, MERGED_KEY, floored_kmeans
from fedapp.report import Assignment, nearest_with_distance


def local_centres(
    X: np.ndarray, k_local: int, seed: int, restarts: int = 10, floor: int = CLIENT_MIN_CLUSTER
) -> tuple[np.ndarray, np.ndarray, int]:
    """Local k-means with k' = min(k_local, n // floor) centres, a cluster below the privacy `floor`
    merged into its nearest neighbour (`fedapp.privacy`); returns (centres, counts, clusters merged)."""
    return floored_kmeans(X, k_local, seed, floor, n_init=restarts)


class KFedClient(ClusteringClient):
    """Round 1: send local centres + counts. Evaluation: label by the nearest global centre."""

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        k_local = int(config.get("local-k", 0)) or self.k
        restarts = self.cfg.params(KFedConfig).local_restarts
        centres, counts, merged = local_centres(self.data.features, k_local, self.seed, restarts, self.floor)
        return [centres, counts], self.data.n_samples, {**self.identity_metrics(), MERGED_KEY: merged}

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        return nearest_centre(self.data.features, parameters[0])

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        labels, distances = nearest_with_distance(self.data.features, parameters[0])
        return Assignment(labels, distances, "distance", self.data.features)
