"""`bench-echo` client: returns a fixed-size payload and labels every sample 0 (the round-cost floor)."""

from __future__ import annotations

import numpy as np
from flwr.common import NDArrays, Scalar

from clients.base import ClusteringClient
from fedapp.methods.bench_echo import EchoConfig


class EchoClient(ClusteringClient):
    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        return [np.zeros(self.cfg.params(EchoConfig).up_floats)], self.data.n_samples, self.identity_metrics()

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        return np.zeros(self.data.n_samples, dtype=np.int64)
