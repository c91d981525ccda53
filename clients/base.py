"""Shared client glue: identity from node config, local data, evaluation as a contingency table."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.client import NumPyClient
from flwr.common import Context, NDArrays, Scalar

from fedapp.config import RunConfig
from fedapp.local_data import LocalData, client_seed, local_partition, local_view
from fedapp.metrics import contingency_table, encode_table


class ClientConfigError(ValueError):
    """The node config does not fit the run config (e.g. num-partitions != num-clients)."""


def node_identity(context: Context, cfg: RunConfig) -> tuple[int, int]:
    """(partition-id, num-partitions) from the node config, checked against the run config."""
    try:
        partition_id = int(context.node_config["partition-id"])
        num_partitions = int(context.node_config["num-partitions"])
    except KeyError as exc:
        raise ClientConfigError(
            f"node config lacks {exc}; start SuperNodes with --node-config "
            '"partition-id=<i> num-partitions=<N>"'
        ) from None
    if cfg.num_clients and num_partitions != cfg.num_clients:
        raise ClientConfigError(
            f"node config num-partitions={num_partitions} but run-config num-clients={cfg.num_clients}"
        )
    if not 0 <= partition_id < num_partitions:
        raise ClientConfigError(f"partition-id={partition_id} outside [0, {num_partitions})")
    return partition_id, num_partitions


class ClusteringClient(NumPyClient):
    """Base client for horizontal methods: subclasses implement `fit` and `predict`."""

    def __init__(self, context: Context, cfg: RunConfig) -> None:
        self.context = context  # context.state survives rounds; the client object does not
        self.cfg = cfg
        self.partition_id, self.num_partitions = node_identity(context, cfg)
        self.data: LocalData = self.load_data()
        self.k = cfg.k or self.data.n_classes
        self.seed = client_seed(cfg.seed, self.partition_id)

    def load_data(self) -> LocalData:
        return local_partition(self.cfg, self.partition_id, self.num_partitions)

    def identity_metrics(self) -> dict[str, Scalar]:
        return {"partition-id": self.partition_id, "k": self.k}

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        """Who this client is: the server asks clients it has not heard from (e.g. after a resume)."""
        return self.identity_metrics()

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        raise NotImplementedError

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        """Label local data with the global model; only the (cluster x class) counts leave the client."""
        predicted = self.predict(parameters, config)
        table = contingency_table(predicted, self.data.labels, self.k, self.data.n_classes)
        return 0.0, self.data.n_samples, {"table": encode_table(table), **self.identity_metrics()}


class VerticalClient(ClusteringClient):
    """Base client for vertical methods: client v holds view v of all N samples (same sample order).

    The server's global model is the consensus label vector; only the label holder turns it into a
    contingency table (every party has the same samples, so one table is the whole evaluation).
    """

    def load_data(self) -> LocalData:
        return local_view(self.cfg, self.partition_id, self.num_partitions)

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        labels = np.asarray(parameters[0]).astype(np.int64)
        if labels.shape != (self.data.n_samples,):
            raise ValueError(
                f"consensus labels of shape {labels.shape}, this view has {self.data.n_samples} rows"
            )
        return labels

    def state_arrays(self, key: str) -> dict[str, np.ndarray]:
        """Arrays this client kept in `context.state[key]` in earlier rounds ({} on the first)."""
        if key not in self.context.state:
            return {}
        return {name: array.numpy() for name, array in self.context.state[key].items()}

    def keep_state(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        self.context.state[key] = ArrayRecord(
            {name: Array(np.ascontiguousarray(a)) for name, a in arrays.items()}
        )
