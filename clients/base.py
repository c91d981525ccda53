"""Shared client glue: identity from node config, local data, evaluation; the final report is composed in.

Evaluation sends a contingency table when the client has labels (ground truth never leaves it), else only
its cluster sizes. The final report (`clients.report.ClientReport`, as `final_report`) assigns every
record with the method's `assign`, writes `assignments.csv` on this node and returns the aggregates of
the label-free metrics.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.client import NumPyClient
from flwr.common import Context, NDArrays, Scalar

from clients.keep import score_candidates, secure_score_candidates
from clients.report import ClientReport
from clients.select_k import secure_selection_reply, selection_reply
from fedapp.app.k_selection import SELECT_KEY
from fedapp.config.run import RunConfig
from fedapp.datasets.local import LocalData, client_seed, local_partition, local_view, own_file, owns_file
from fedapp.features.embeddings import EmbeddingCache
from fedapp.features.texts import embedding_cache
from fedapp.metrics.contingency import contingency_table, encode_table
from fedapp.privacy.alignment import ALIGN_KEY, ALIGNED_KEY, ALIGNMENT_STATE, aligned_rows, hash_ids, run_key
from fedapp.privacy.floor import CLIENT_MIN_CLUSTER
from fedapp.privacy.uplink import Uplink
from fedapp.report.assignments import node_out_dir, run_name
from fedapp.report.keep import KEEP_KEY
from fedapp.report.stages import REPORT_KEY, SIZES_KEY, TABLE_KEY, Assignment
from fedapp.wire import encode_array


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
        # 0 only while k is being chosen (k = 0, no labels): `ManagedClient` refuses any other message
        self.k = cfg.k or self.data.n_classes
        self.seed = client_seed(cfg.seed, self.partition_id)
        # fedapp.privacy.floor: the ClientApp folded the node's floor into cfg; the client's own holds anyway
        self.floor = max(CLIENT_MIN_CLUSTER, cfg.min_cluster_size)
        # plain, SecAgg+ or DP: how this client's statistics leave it
        self.uplink = Uplink(
            cfg, context.state, self.partition_id, self.floor, self.data.n_samples, self.num_partitions
        )
        self.final_report = ClientReport(self)

    @property
    def owns_file(self) -> bool:
        """This client reads a file of its own (placeholder spec, or `dataset` in its node config)."""
        return owns_file(self.cfg)

    def load_data(self) -> LocalData:
        if self.owns_file:  # parsed once per node: later messages' processes map the node's cache
            return own_file(self.cfg, self.partition_id, self.embedding_cache().directory)
        return local_partition(self.cfg, self.partition_id, self.num_partitions)

    def identity_metrics(self) -> dict[str, Scalar]:
        return {"partition-id": self.partition_id, "k": self.k}

    def secure_selection(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """Choosing k's round B as a SecAgg+ fit message (`clients.select_k`)."""
        return secure_selection_reply(self, parameters, config)

    def secure_choice(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """`select = best`'s scoring as a SecAgg+ fit message (`clients.keep`)."""
        return secure_score_candidates(self, parameters, config)

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        """Who this client is: the server asks clients it has not heard from (e.g. after a resume)."""
        return self.identity_metrics()

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        raise NotImplementedError

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        """Every local record's cluster, a score and the metric space (methods override for theirs)."""
        labels = self.predict(parameters, config)
        space = self.data.features if self.data.dataset.features is not None else None
        return Assignment(labels, np.full(len(labels), np.nan), "none", space)

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        """Label local data with the global model; only the (cluster x class) counts leave the client
        (cluster sizes when it has no labels). The final report's stages go to `final_report`."""
        if REPORT_KEY in config:
            return self.final_report.evaluate(parameters, config)
        if KEEP_KEY in config:  # `select = best`: score the starting and the final clustering
            return score_candidates(self, parameters, config)
        if SELECT_KEY in config:  # k = 0 without labels: choosing k before the first round
            return selection_reply(self, parameters, config)
        return (
            0.0,
            self.data.n_samples,
            {**self.score(self.predict(parameters, config)), **self.identity_metrics()},
        )

    def score(self, predicted: np.ndarray) -> dict[str, Scalar]:
        """What the server may learn of a labelling: a contingency table, or only cluster sizes."""
        if self.data.labelled:
            table = contingency_table(predicted, self.data.labels, self.k, self.data.n_classes)
            return {TABLE_KEY: encode_table(table)}
        return {SIZES_KEY: encode_array(np.bincount(predicted, minlength=self.k).astype(np.int64))}

    def node_directory(self) -> Path:
        """Where this node writes its records' clusters (node config `node-out-dir`, merged, wins)."""
        name = run_name(self.cfg.out_dir, self.cfg.method, self.cfg.dataset, self.cfg.seed)
        return node_out_dir(self.cfg.node_out_dir, self.partition_id, name)

    def embedding_cache(self) -> EmbeddingCache:
        """Where this node caches its texts' embeddings (`embedding-cache`, node config wins): own records
        in its node directory by default, so they stay with the rest of what the node keeps of the run."""
        return embedding_cache(
            self.cfg.embedding_cache,
            own_data=self.cfg.own_data,
            node_dir=self.node_directory(),
            partition_id=self.partition_id,
        )


class VerticalClient(ClusteringClient):
    """Base client for vertical methods: client v holds view v of all N samples (same sample order).

    The server's global model is the consensus label vector; only the label holder turns it into a
    contingency table (every party has the same samples, so one table is the whole evaluation).
    """

    def load_data(self) -> LocalData:
        """A registered multi-view set's view, or this party's own file: its rows lined up with the other
        parties' (`fedapp.privacy.alignment`) once the alignment round has run."""
        if not self.owns_file:
            return local_view(self.cfg, self.partition_id, self.num_partitions)
        data = own_file(self.cfg, self.partition_id)
        if ALIGNMENT_STATE in self.context.state:
            rows = self.context.state[ALIGNMENT_STATE]["rows"].numpy()
            return LocalData(data.dataset, rows, self.cfg.scaling)
        return data

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """The alignment round, and the intersection that arrives with the first round after it, are
        handled here; every other message goes to the method's `fit_view`."""
        if config.get(ALIGN_KEY):
            return [self.id_hashes()], self.data.n_samples, self.identity_metrics()
        if config.get(ALIGNED_KEY):
            intersection, parameters = np.asarray(parameters[0]), list(parameters[1:])
            rows = aligned_rows(self.id_hashes(), intersection)
            self.context.state[ALIGNMENT_STATE] = ArrayRecord({"rows": Array(rows)})
            self.data = LocalData(self.data.dataset, rows, self.cfg.scaling)
        return self.fit_view(parameters, config)

    def fit_view(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        raise NotImplementedError

    def id_hashes(self) -> np.ndarray:
        """Keyed hashes of every id in this party's file (all rows, file order)."""
        if self.data.dataset.ids is None:
            raise ClientConfigError(f"client {self.partition_id}: vertical own data needs an id-column")
        # the same name on every party: the run config's dataset, not the file this node reads
        name = run_name(self.cfg.out_dir, self.cfg.method, self.cfg.node.run_dataset, self.cfg.seed)
        return hash_ids(self.data.dataset.ids, run_key(self.cfg.id_key, name))

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        """The consensus labels (no per-record score); metric space = this party's own view."""
        labels = self.predict(parameters, config)
        return Assignment(labels, np.full(len(labels), np.nan), "none", self.data.features)

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
