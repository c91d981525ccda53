"""Client side of the final report (`fedapp.report.stages`), composed into every client as `final_report`.

Stage 1 labels every local record with the global model (the method's `assign`), writes `assignments.csv`
and this node's own page `report.html` (`fedapp.report.pages.node`; never sent) on this node and computes
the statistics once: cluster sizes, the per-cluster sums of the clusters at or above the privacy floor, term
counts for texts, the contingency table when the client has labels. Stage 2 sums the distances to the
pooled means the server sends (their counts go on the node's page). A run then differs only in
how they leave: in the clear in an evaluate reply (plain), as SecAgg+ sums in a fit reply (`secagg`,
`secure`), or as differentially private releases of clipped records (`dp.report = noise`; with
`withhold`, only the client's identity leaves).
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import WARNING
from pathlib import Path
from typing import Protocol

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.common import Context, NDArrays, Scalar, log

from fedapp.config.run import RunConfig
from fedapp.datasets.local import LocalData
from fedapp.metrics.label_free import (
    ClusterSums,
    DistanceSums,
    cluster_sums,
    cluster_term_counts,
    distance_sums,
)
from fedapp.privacy.dp import clip_rows, distance_sensitivity, sum_count_sensitivity
from fedapp.privacy.floor import WITHHELD_KEY
from fedapp.privacy.secagg import SUM, secure_upload
from fedapp.privacy.uplink import Uplink
from fedapp.report.assignments import ASSIGNMENTS_FILE, run_name, write_assignments
from fedapp.report.pages.node import add_pooled_sizes, node_page_data, write_node_page
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
    TERMS_KEY,
    Assignment,
    encode_cluster_sums,
    encode_distance_sums,
    encode_noisy,
    encode_term_counts,
    secure_assign_arrays,
    secure_distance_arrays,
)
from fedapp.wire import encode_array

REPORT_STATE = "fedapp.report"  # context.state: the labels and metric space between the two stages
Reply = tuple[float, int, dict[str, Scalar]]  # an evaluate reply: (loss, examples, metrics)


class ReportingClient(Protocol):
    """What the report needs of its client (`clients.base.ClusteringClient`)."""

    cfg: RunConfig
    context: Context  # context.state keeps stage 1's labels for stage 2
    data: LocalData
    k: int
    floor: int  # this node's privacy floor
    partition_id: int
    uplink: Uplink  # counts the report's DP releases against the run's plan

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment: ...

    def identity_metrics(self) -> dict[str, Scalar]: ...

    def score(self, predicted: np.ndarray) -> dict[str, Scalar]: ...

    def node_directory(self) -> Path: ...


@dataclass(frozen=True)
class Statistics:
    """Stage 1's statistics: what leaves as sums (sizes, the floor's cluster sums) and what goes in the
    clear in every run (identity, rows, score kind, the floor's count, term counts)."""

    sizes: np.ndarray  # (k,) int64
    sums: ClusterSums | None  # clusters below the privacy floor hold zeros; None: no metric space
    clear: dict[str, Scalar]


class ClientReport:
    """The final report's two stages on one client (module docstring)."""

    def __init__(self, client: ReportingClient) -> None:
        self.client = client

    # ------------------------------------------------------------------------- the messages
    def evaluate(self, parameters: NDArrays, config: dict[str, Scalar]) -> Reply:
        """A stage as an evaluate message: plain, or differentially private under `dp`."""
        stage, private = config.get(REPORT_KEY), self.client.cfg.dp.enabled
        if stage == STAGE_ASSIGN:
            result = self.labelled(parameters, config)
            return self.private_assignments(result) if private else self.plain_assignments(result)
        if stage == STAGE_DISTANCES:
            if private:
                return self.private_distances(parameters)
            blob = encode_distance_sums(self.distances(parameters))
            return 0.0, self.client.data.n_samples, {**self.client.identity_metrics(), DISTANCES_KEY: blob}
        raise ValueError(f"unknown report stage {stage!r}")

    def secure(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """A stage as a fit message for SecAgg+: every summable statistic is masked, so the server
        learns only its total; what is not a sum stays in the metrics."""
        scale = float(config.get(SCALE_KEY, 1.0))
        if not (np.isfinite(scale) and scale > 0):
            raise ValueError(f"report scale {scale!r} is not a positive number")
        stage = config.get(REPORT_KEY)
        if stage == STAGE_ASSIGN:
            statistics = self.statistics(self.labelled(parameters, config))
            arrays = secure_assign_arrays(statistics.sizes, statistics.sums, scale)
            metrics = statistics.clear
        elif stage == STAGE_DISTANCES:
            arrays = secure_distance_arrays(self.distances(parameters), scale)
            metrics = self.client.identity_metrics()
        else:
            raise ValueError(f"unknown report stage {stage!r}")
        rows = self.client.data.n_samples  # SecAgg+'s weight, in the clear as in every secure round
        masked, extra = secure_upload(arrays, [SUM] * len(arrays), rows, self.client.cfg.secagg_clip)
        return masked, rows, {**metrics, **extra}

    # ------------------------------------------------------------------ the statistics, once
    def labelled(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        """Every local record's cluster under the global model, written to this node's assignments.csv."""
        client = self.client
        result = client.assign(parameters, config)
        path = client.node_directory() / ASSIGNMENTS_FILE
        write_assignments(path, client.data.id_values, result.labels, result.scores)
        self._node_page(result)
        return result

    def _node_page(self, result: Assignment) -> None:
        """This node's own page beside its assignments (`fedapp.report.pages.node`); never sent. A page
        that cannot be drawn is a warning: the assignments and the report go on without it."""
        client, cfg = self.client, self.client.cfg
        header = {
            "run": run_name(cfg.out_dir, cfg.method, cfg.dataset, cfg.seed),
            "method": cfg.method,
            "dataset": cfg.dataset,
            "partition_id": client.partition_id,
        }
        names = [name.strip() for name in cfg.feature_columns.split(",") if name.strip()]
        try:
            data = node_page_data(
                client.data,
                result.labels,
                result.scores,
                result.score_kind,
                result.space,
                k=client.k,
                header=header,
                seed=cfg.seed,
                keyword_min_docs=cfg.keyword_min_docs,
                feature_names=names,
            )
            write_node_page(client.node_directory(), data)
        except Exception as exc:  # noqa: BLE001 - a view of the node's records must not fail its report
            log(
                WARNING,
                "client %d: report.html not written: %s: %s",
                client.partition_id,
                type(exc).__name__,
                exc,
            )

    def _pooled_page(self, counts: np.ndarray) -> None:
        """The pooled sizes the server sent back: the node's page shows its share of each cluster."""
        try:
            add_pooled_sizes(self.client.node_directory(), counts, noisy=self.client.cfg.dp.enabled)
        except Exception as exc:  # noqa: BLE001 - as `_node_page`
            log(WARNING, "client %d: report.html not updated: %s", self.client.partition_id, exc)

    def statistics(self, result: Assignment) -> Statistics:
        """Stage 1's statistics; keeps the labels and metric space of the shared clusters for stage 2."""
        client, k = self.client, self.client.k
        sizes = np.bincount(result.labels, minlength=k).astype(np.int64)
        clear: dict[str, Scalar] = {**client.identity_metrics(), ROWS_KEY: len(result.labels)}
        clear[SCORE_KIND_KEY] = result.score_kind
        # the privacy floor: clusters below it on this client send no sums (their records sit out the metrics)
        shared = sizes[result.labels] >= client.floor
        clear[WITHHELD_KEY] = int(((sizes > 0) & (sizes < client.floor)).sum())
        kept = {"labels": result.labels[shared].astype(np.int64)}
        sums = None
        if result.space is not None:
            # the shared clusters' sums over every row, the others in a spare cluster k: no copy of the rows
            every = cluster_sums(result.space, np.where(shared, result.labels, k), k + 1)
            sums = ClusterSums(every.counts[:k], every.sums[:k])
            vectors = client.data.dataset.features is not None  # (`data.features` raises without them)
            if vectors and result.space is client.data.features:  # stage 2 maps them again: no copy kept
                kept["shared"] = shared
            else:
                kept["space"] = result.space if shared.all() else np.asarray(result.space)[shared]
        if client.data.dataset.texts is not None:
            min_docs = max(client.cfg.keyword_min_docs, client.floor)
            counts = cluster_term_counts(client.data.texts, result.labels, k, min_documents=min_docs)
            clear[TERMS_KEY] = encode_term_counts(counts)
        self._keep(kept)
        return Statistics(sizes, sums, clear)

    def distances(self, parameters: NDArrays) -> DistanceSums:
        """Stage 2: distances of the kept records to the pooled means the server sent."""
        kept = self._kept()
        means, counts = self._pooled_means(parameters, kept["space"].shape[1])
        self._pooled_page(counts)
        return distance_sums(kept["space"], kept["labels"], means, counts, kept.get("rows"))

    # ------------------------------------------------------------------------ how they leave
    def plain_assignments(self, result: Assignment) -> Reply:
        """Stage 1 in the clear: sizes, sums, term counts and the contingency table (or sizes)."""
        statistics = self.statistics(result)
        metrics = {**statistics.clear, **self.client.score(result.labels)}
        metrics[SIZES_KEY] = encode_array(statistics.sizes)
        if statistics.sums is not None:
            metrics[SUMS_KEY] = encode_cluster_sums(statistics.sums)
        return 0.0, self.client.data.n_samples, metrics

    def private_assignments(self, result: Assignment) -> Reply:
        """Stage 1 under DP: nothing (`dp.report = withhold`, client-level methods), or one Gaussian
        release of the sizes and per-cluster sums of the clipped records (no privacy floor: the noise
        covers small clusters; no term counts or table: they are not noised)."""
        client, dp = self.client, self.client.cfg.dp
        metrics: dict[str, Scalar] = {**client.identity_metrics(), SCORE_KIND_KEY: result.score_kind}
        if not client.uplink.plan or not client.uplink.plan.report:
            return 0.0, 0, metrics
        release = client.uplink.release(report=True)
        metrics.update(release.metrics)
        sizes = np.bincount(result.labels, minlength=client.k).astype(np.float64)
        kept = {"labels": result.labels.astype(np.int64)}
        if result.space is None:
            (noisy_sizes,) = release.gaussian([sizes], 1.0)
            metrics[NOISY_KEY] = encode_noisy(sizes=noisy_sizes)
        else:
            kept["space"] = clip_rows(result.space, dp.clip)
            sums = cluster_sums(kept["space"], kept["labels"], client.k).sums
            noisy_sizes, noisy_sums = release.gaussian([sizes, sums], sum_count_sensitivity(dp.clip))
            metrics[NOISY_KEY] = encode_noisy(sizes=noisy_sizes, sums=noisy_sums)
        self._keep(kept)
        return 0.0, 0, metrics

    def private_distances(self, parameters: NDArrays) -> Reply:
        """Stage 2 under DP: one Gaussian release of the distance sums and the silhouette sum of the clipped
        records around the pooled means, which this client projects into the clip ball itself (the
        sensitivity needs it; the server's means are public, noisy). Records of clusters the pooled
        counts call empty sit out (a choice by each record's own label and public data)."""
        client, dp = self.client, self.client.cfg.dp
        if not client.uplink.plan or not client.uplink.plan.report:
            raise ValueError(f"client {client.partition_id}: dp.report withholds the report's distances")
        kept = self._kept()
        means, counts = self._pooled_means(parameters, kept["space"].shape[1])
        self._pooled_page(counts)
        present = counts[kept["labels"]] > 0
        sums = distance_sums(
            kept["space"][present], kept["labels"][present], clip_rows(means, dp.clip), counts
        )
        release = client.uplink.release(report=True)
        noisy = release.gaussian(
            [sums.distance_sums, sums.squared_sums, np.array(sums.silhouette_sum)],
            distance_sensitivity(dp.clip),
        )
        blob = encode_noisy(
            **dict(zip(("distance_sums", "squared_sums", "silhouette_sum"), noisy, strict=True))
        )
        return 0.0, 0, {**client.identity_metrics(), NOISY_KEY: blob, **release.metrics}

    # -------------------------------------------------------------- between the two stages
    def _keep(self, kept: dict[str, np.ndarray]) -> None:
        self.client.context.state[REPORT_STATE] = ArrayRecord(
            {name: Array(np.ascontiguousarray(a)) for name, a in kept.items()}
        )

    def _kept(self) -> dict[str, np.ndarray]:
        """The labels (and metric space) stage 1 kept for stage 2."""
        client = self.client
        if REPORT_STATE not in client.context.state:
            raise ValueError(f"client {client.partition_id}: no assignments yet (the report's first stage)")
        kept = {name: array.numpy() for name, array in client.context.state[REPORT_STATE].items()}
        if "shared" in kept:  # the metric space is the client's features (the process's cached read)
            shared = kept.pop("shared").astype(bool)
            kept["space"] = client.data.features  # mapped, not copied: `rows` selects a chunk at a time
            if not shared.all():
                kept["rows"] = shared
        if "space" not in kept:
            raise ValueError(
                f"client {client.partition_id}: method '{client.cfg.method}' has no metric space"
            )
        return kept

    def _pooled_means(self, parameters: NDArrays, width: int) -> tuple[np.ndarray, np.ndarray]:
        means, counts = np.asarray(parameters[0], np.float64), np.asarray(parameters[1], np.int64)
        if means.shape != (self.client.k, width) or counts.shape != (self.client.k,):
            raise ValueError(
                f"pooled means {means.shape} / counts {counts.shape} do not fit k={self.client.k}"
            )
        return means, counts
