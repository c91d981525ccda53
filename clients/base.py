"""Shared client glue: identity from node config, local data, evaluation, and the final report.

Evaluation sends a contingency table when the client has labels (ground truth never leaves it), else only
its cluster sizes. The final report (`fedapp.report.stages`) assigns every record, writes `assignments.csv` on
this node and returns the aggregates of the label-free metrics.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.client import NumPyClient
from flwr.common import Context, NDArrays, Scalar

from fedapp.config.run import RunConfig
from fedapp.datasets.local import LocalData, client_seed, local_partition, local_view, own_file, owns_file
from fedapp.methods import method_spec
from fedapp.metrics.contingency import contingency_table, encode_table
from fedapp.metrics.label_free import (
    ClusterSums,
    DistanceSums,
    cluster_sums,
    cluster_term_counts,
    distance_sums,
    encode_arrays,
    encode_cluster_sums,
    encode_distance_sums,
    encode_term_counts,
)
from fedapp.privacy.alignment import ALIGN_KEY, ALIGNED_KEY, ALIGNMENT_STATE, aligned_rows, hash_ids, run_key
from fedapp.privacy.dp import (
    RELEASES_KEY,
    clip_rows,
    distance_sensitivity,
    gaussian_mechanism,
    secret_rng,
    sum_count_sensitivity,
)
from fedapp.privacy.floor import WITHHELD_KEY, min_cluster_size
from fedapp.privacy.secagg import SUM, secure_upload
from fedapp.privacy.uplink import Uplink
from fedapp.report.assignments import ASSIGNMENTS_FILE, node_out_dir, run_name, write_assignments
from fedapp.report.stages import (
    DISTANCES_KEY,
    NOISY_KEY,
    REPORT_KEY,
    ROWS_KEY,
    SCALE_KEY,
    SCORE_KIND_KEY,
    SIZES_KEY,
    STAGE_ASSIGN,
    STAGE_DISTANCES,
    SUMS_KEY,
    TABLE_KEY,
    TERMS_KEY,
    Assignment,
    secure_assign_arrays,
    secure_distance_arrays,
)
from fedapp.wire import encode_array

REPORT_STATE = "fedapp.report"  # context.state: the labels and metric space between the two report stages


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
        if not cfg.k and not self.data.labelled and not method_spec(cfg.method).own_k:
            raise ClientConfigError(
                f"client {self.partition_id}: its data has no labels, so k cannot default to the number of "
                "classes: set k"
            )
        self.k = cfg.k or self.data.n_classes
        self.seed = client_seed(cfg.seed, self.partition_id)
        self.floor = min_cluster_size(cfg.min_cluster_size, context.node_config)  # fedapp.privacy.floor
        self.uplink = Uplink(cfg, context.state, self.partition_id, self.floor)  # plain, SecAgg+ or DP

    @property
    def owns_file(self) -> bool:
        """This client reads a file of its own (placeholder spec, or `dataset` in its node config)."""
        return owns_file(self.cfg, "dataset" in self.context.node_config)

    def load_data(self) -> LocalData:
        if self.owns_file:
            return own_file(self.cfg, self.partition_id)
        return local_partition(self.cfg, self.partition_id, self.num_partitions)

    def identity_metrics(self) -> dict[str, Scalar]:
        return {"partition-id": self.partition_id, "k": self.k}

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
        (cluster sizes when it has no labels). The final report's stages are dispatched from here."""
        stage = config.get(REPORT_KEY)
        if stage == STAGE_ASSIGN:
            return self.report_assignments(parameters, config)
        if stage == STAGE_DISTANCES:
            return self.report_distances(parameters)
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
        """Where this node writes its records' clusters (node config `node-out-dir` wins)."""
        configured = str(self.context.node_config.get("node-out-dir", self.cfg.node_out_dir))
        name = run_name(self.cfg.out_dir, self.cfg.method, self.cfg.dataset, self.cfg.seed)
        return node_out_dir(configured, self.partition_id, name)

    def report_assignments(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        """Final report, stage 1: write assignments.csv here; send sizes, cluster sums, term counts."""
        result = self.assign(parameters, config)
        write_assignments(
            self.node_directory() / ASSIGNMENTS_FILE, self.data.ids, result.labels, result.scores
        )
        if self.cfg.dp.enabled:
            return self.private_assignments(result)
        sizes, sums, metrics = self.report_statistics(result)
        metrics.update(self.score(result.labels))
        metrics[SIZES_KEY] = encode_array(sizes)
        if sums is not None:
            metrics[SUMS_KEY] = encode_cluster_sums(sums)
        return 0.0, self.data.n_samples, metrics

    def report_statistics(
        self, result: Assignment
    ) -> tuple[np.ndarray, ClusterSums | None, dict[str, Scalar]]:
        """(cluster sizes, cluster sums under the privacy floor or None, metrics that go in the clear) of
        stage 1; keeps the labels and metric space of the shared clusters for stage 2."""
        sizes = np.bincount(result.labels, minlength=self.k).astype(np.int64)
        metrics: dict[str, Scalar] = {**self.identity_metrics(), ROWS_KEY: len(result.labels)}
        metrics[SCORE_KIND_KEY] = result.score_kind
        # the privacy floor: clusters below it on this client send no sums (their records sit out the metrics)
        shared = sizes[result.labels] >= self.floor
        metrics[WITHHELD_KEY] = int(((sizes > 0) & (sizes < self.floor)).sum())
        kept = {"labels": result.labels[shared].astype(np.int64)}
        sums = None
        if result.space is not None:
            kept["space"] = np.asarray(result.space, dtype=np.float64)[shared]
            sums = cluster_sums(kept["space"], kept["labels"], self.k)
        if self.data.dataset.texts is not None:
            min_docs = max(self.cfg.keyword_min_docs, self.floor)
            counts = cluster_term_counts(self.data.texts, result.labels, self.k, min_documents=min_docs)
            metrics[TERMS_KEY] = encode_term_counts(counts)
        self.keep_report_state(kept)
        return sizes, sums, metrics

    def keep_report_state(self, kept: dict[str, np.ndarray]) -> None:
        self.context.state[REPORT_STATE] = ArrayRecord(
            {name: Array(np.ascontiguousarray(a)) for name, a in kept.items()}
        )

    def report_state(self) -> dict[str, np.ndarray]:
        """The labels (and metric space) stage 1 kept for stage 2."""
        if REPORT_STATE not in self.context.state:
            raise ValueError(f"client {self.partition_id}: no assignments yet (the report's first stage)")
        kept = {name: array.numpy() for name, array in self.context.state[REPORT_STATE].items()}
        if "space" not in kept:
            raise ValueError(f"client {self.partition_id}: method '{self.cfg.method}' has no metric space")
        return kept

    def report_distances(self, parameters: NDArrays) -> tuple[float, int, dict[str, Scalar]]:
        """Final report, stage 2: distances to the pooled cluster means the server sent."""
        if self.cfg.dp.enabled:
            return self.private_distances(parameters)
        sums = self.distances_to(parameters)
        return (
            0.0,
            self.data.n_samples,
            {**self.identity_metrics(), DISTANCES_KEY: encode_distance_sums(sums)},
        )

    def distances_to(self, parameters: NDArrays) -> DistanceSums:
        kept = self.report_state()
        means, counts = self.pooled_means(parameters, kept["space"].shape[1])
        return distance_sums(kept["space"], kept["labels"], means, counts)

    def pooled_means(self, parameters: NDArrays, width: int) -> tuple[np.ndarray, np.ndarray]:
        means, counts = np.asarray(parameters[0], np.float64), np.asarray(parameters[1], np.int64)
        if means.shape != (self.k, width) or counts.shape != (self.k,):
            raise ValueError(f"pooled means {means.shape} / counts {counts.shape} do not fit k={self.k}")
        return means, counts

    # ------------------------------------------------------------------- the report under SecAgg+
    def secure_report(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """The report's stages as fit replies for SecAgg+ (`fedapp.report.stages`): every summable statistic
        is
        masked, so the server learns only its total; what is not a sum stays in the metrics."""
        scale = float(config.get(SCALE_KEY, 1.0))
        if not (np.isfinite(scale) and scale > 0):
            raise ValueError(f"report scale {scale!r} is not a positive number")
        stage = config.get(REPORT_KEY)
        if stage == STAGE_ASSIGN:
            result = self.assign(parameters, config)
            write_assignments(
                self.node_directory() / ASSIGNMENTS_FILE, self.data.ids, result.labels, result.scores
            )
            sizes, sums, metrics = self.report_statistics(result)
            arrays = secure_assign_arrays(sizes, sums, scale)
        elif stage == STAGE_DISTANCES:
            arrays, metrics = (
                secure_distance_arrays(self.distances_to(parameters), scale),
                self.identity_metrics(),
            )
        else:
            raise ValueError(f"unknown report stage {stage!r}")
        rows = self.data.n_samples  # SecAgg+'s weight, in the clear as in every secure round
        masked, extra = secure_upload(arrays, [SUM] * len(arrays), rows, self.cfg.secagg_clip)
        return masked, rows, {**metrics, **extra}

    # ------------------------------------------------------------ the report under differential privacy
    def private_assignments(self, result: Assignment) -> tuple[float, int, dict[str, Scalar]]:
        """Stage 1 under DP: nothing (`dp.report = withhold`, client-level methods), or one Gaussian
        release of the sizes and per-cluster sums of the clipped records (no privacy floor: the noise
        covers small clusters; no term counts or table: they are not noised)."""
        dp = self.cfg.dp
        metrics: dict[str, Scalar] = {**self.identity_metrics(), SCORE_KIND_KEY: result.score_kind}
        if not self.uplink.plan or not self.uplink.plan.report:
            return 0.0, 0, metrics
        z, made = self.report_release()
        metrics[RELEASES_KEY], rng = made, secret_rng(dp, self.partition_id, made)
        sizes = np.bincount(result.labels, minlength=self.k).astype(np.float64)
        kept = {"labels": result.labels.astype(np.int64)}
        if result.space is None:
            (noisy_sizes,) = gaussian_mechanism([sizes], 1.0, z, rng)
            metrics[NOISY_KEY] = encode_arrays(sizes=noisy_sizes)
        else:
            kept["space"] = clip_rows(result.space, dp.clip)
            sums = cluster_sums(kept["space"], kept["labels"], self.k).sums
            noisy_sizes, noisy_sums = gaussian_mechanism(
                [sizes, sums], sum_count_sensitivity(dp.clip), z, rng
            )
            metrics[NOISY_KEY] = encode_arrays(sizes=noisy_sizes, sums=noisy_sums)
        self.keep_report_state(kept)
        return 0.0, 0, metrics

    def private_distances(self, parameters: NDArrays) -> tuple[float, int, dict[str, Scalar]]:
        """Stage 2 under DP: one Gaussian release of the distance sums and the silhouette sum of the clipped
        records around the pooled means, which this client projects into the clip ball itself (the
        sensitivity needs it; the server's means are public, noisy). Records of clusters the pooled
        counts call empty sit out (a choice by each record's own label and public data)."""
        dp = self.cfg.dp
        if not self.uplink.plan or not self.uplink.plan.report:
            raise ValueError(f"client {self.partition_id}: dp.report withholds the report's distances")
        kept = self.report_state()
        means, counts = self.pooled_means(parameters, kept["space"].shape[1])
        present = counts[kept["labels"]] > 0
        sums = distance_sums(
            kept["space"][present], kept["labels"][present], clip_rows(means, dp.clip), counts
        )
        z, made = self.report_release()
        noisy = gaussian_mechanism(
            [sums.distance_sums, sums.squared_sums, np.array(sums.silhouette_sum)],
            distance_sensitivity(dp.clip),
            z,
            secret_rng(dp, self.partition_id, made),
        )
        blob = encode_arrays(
            **dict(zip(("distance_sums", "squared_sums", "silhouette_sum"), noisy, strict=True))
        )
        return 0.0, 0, {**self.identity_metrics(), NOISY_KEY: blob, RELEASES_KEY: made}

    def report_release(self) -> tuple[float, int]:
        """(noise multiplier, releases made so far) for one more release of the report, within the plan."""
        release = self.uplink.release(report=True)
        return release.noise_multiplier, release.made


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
        shared = self.context.run_config  # the same on every party (a node may override `dataset`)
        name = run_name(
            str(shared.get("out-dir", "")), self.cfg.method, str(shared.get("dataset", "")), self.cfg.seed
        )
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
