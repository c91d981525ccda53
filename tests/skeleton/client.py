"""Piece 3 (`clients/<m>.py`): the client's maths as a plain function, then a thin client."""

from __future__ import annotations

import numpy as np
from flwr.common import NDArrays, Scalar

from clients.base import ClusteringClient
from fedapp.maths.clustering import nearest_centre
from fedapp.privacy.dp import sum_count_sensitivity
from fedapp.privacy.secagg import SUM


def cluster_sums(X: np.ndarray, centres: np.ndarray, floor: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster sums and counts of the records nearest each centre; a cluster of fewer than `floor`
    records is withheld (zeros): its sum would be too close to its records."""
    labels, k = nearest_centre(X, centres), centres.shape[0]
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    sums = np.zeros((k, X.shape[1]))
    np.add.at(sums, labels, X)
    withheld = counts < floor
    sums[withheld], counts[withheld] = 0.0, 0.0
    return sums, counts


class MeansClient(ClusteringClient):
    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        X = self.uplink.records(self.data.features)  # clipped under DP
        if not parameters:  # round 1: this client's means
            return self.uplink.send_moments(X, self.identity_metrics())
        sums, counts = cluster_sums(X, parameters[0], self.uplink.floor)
        sensitivity = sum_count_sensitivity(self.cfg.dp.clip)
        return self.uplink.send(
            [sums, counts], [SUM, SUM], len(X), self.identity_metrics(), sensitivity=sensitivity
        )

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        return nearest_centre(self.uplink.records(self.data.features), parameters[0])
