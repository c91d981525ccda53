"""Server side of the final report (`fedapp.report`): label-free metrics, keywords and the saved model.

After the last round the server loop (`fedapp.server_loop.run_report`) asks every usable client to
label its records with the global model (`assign`; each writes `assignments.csv` on its own machine)
and, with the pooled cluster means that gives, for distances (`distances`). What comes back is merged
into the label-free metrics (exactly those of the pooled data), cluster sizes and, for texts, c-TF-IDF
keywords; then `OUT/model/` is written. A client that fails the report is named in the status.

Vertical federations: each party reports on its own view of the same (aligned) records, so the sums are
concatenated along the features; inertia and Calinski–Harabasz are exact on the concatenated views,
while Davies–Bouldin and the silhouette would need per-record distances across parties and are left out.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    Parameters,
    log,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from fedapp.label_free import (
    ClusterSums,
    DistanceSums,
    LabelFreeError,
    ctfidf_keywords,
    decode_cluster_sums,
    decode_distance_sums,
    decode_term_counts,
    label_free_metrics,
    merge_cluster_sums,
    merge_distance_sums,
    merge_term_counts,
    pooled_means,
)
from fedapp.methods import method_spec
from fedapp.model_store import MODEL_DIR, write_model
from fedapp.node_outputs import SCORE_KINDS
from fedapp.protocol import decode_array
from fedapp.report import (
    DISTANCES_KEY,
    REPORT_KEY,
    ROWS_KEY,
    SCORE_KIND_KEY,
    SIZES_KEY,
    STAGE_ASSIGN,
    STAGE_DISTANCES,
    SUMS_KEY,
    TERMS_KEY,
)
from fedapp.results import PROGRESS_MARKER
from strategies.replies import describe_failure

KEYWORDS = 10  # keywords kept per cluster


class ReportingStrategy:
    """Mixin for `ClusteringStrategy`: the final report's two stages and the model directory."""

    def _init_report(self) -> None:
        self.report: dict[str, Any] = {}  # what summary.json shows of the final report
        self._report_sums: dict[int, ClusterSums] = {}  # partition -> its pass-1 sums
        self._report_clients: dict[int, ClientProxy] = {}  # partition -> who sent those sums
        self._report_terms: list[list[dict[str, int]]] = []
        self._report_cids: list[str] = []
        self._report_parameters: Parameters | None = None
        self._report_started = 0.0

    # ----------------------------------------------------------------------------------- hooks
    def report_parameters(self) -> Parameters | None:
        """The global model the clients label their records with (and `predict` reloads)."""
        return self.latest_parameters  # type: ignore[attr-defined]

    def model_description(self) -> dict[str, Any]:
        """Method-specific fields of model.json (vocabulary, topic words, ...)."""
        return {}

    @property
    def vertical(self) -> bool:
        return method_spec(self.cfg.method).vertical  # type: ignore[attr-defined]

    # ---------------------------------------------------------------------------------- stages
    def configure_report(
        self, stage: str, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Instructions for one stage; [] when there is nothing (more) to do."""
        if self.stopped or self.k is None:  # type: ignore[attr-defined]
            return []
        if stage == STAGE_ASSIGN:
            parameters = self.report_parameters()
            if parameters is None or not parameters.tensors:
                return []
            self._report_parameters = parameters
            self._report_started = time.perf_counter()
            clients = self.roster.usable(client_manager, self.record)  # type: ignore[attr-defined]
            ins = EvaluateIns(parameters, {REPORT_KEY: STAGE_ASSIGN})
            instructions = [(client, ins) for client in clients]
        elif stage == STAGE_DISTANCES:
            if not self._report_sums:
                return []
            instructions = self._distance_instructions()
        else:
            raise ValueError(f"unknown report stage {stage!r}")
        self.record.sent(self._report_round, "report", instructions)  # type: ignore[attr-defined]
        self._report_cids = [client.cid for client, _ in instructions]
        return instructions

    @property
    def _report_round(self) -> int:
        return self.rounds_run + 1  # type: ignore[attr-defined]

    def _distance_instructions(self) -> list[tuple[ClientProxy, EvaluateIns]]:
        sums = self._pooled_sums()
        means, counts = pooled_means(sums), sums.counts
        config = {REPORT_KEY: STAGE_DISTANCES}
        instructions = []
        offsets = self._view_offsets()
        for partition, proxy in sorted(self._report_clients.items()):
            if self.vertical:
                start, stop = offsets[partition]
                arrays = [means[:, start:stop], counts]
            else:
                arrays = [means, counts]
            instructions.append((proxy, EvaluateIns(ndarrays_to_parameters(arrays), config)))
        return instructions

    def _view_offsets(self) -> dict[int, tuple[int, int]]:
        offsets, start = {}, 0
        for partition in sorted(self._report_sums):
            width = self._report_sums[partition].sums.shape[1]
            offsets[partition] = (start, start + width)
            start += width
        return offsets

    def _pooled_sums(self) -> ClusterSums:
        parts = [self._report_sums[p] for p in sorted(self._report_sums)]
        if not self.vertical:
            return merge_cluster_sums(parts)
        return ClusterSums(parts[0].counts, np.hstack([part.sums for part in parts]))

    def aggregate_report(
        self,
        stage: str,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> bool:
        """Take one stage's replies; False when the report cannot go on (nothing usable came back)."""
        answered = {client.cid for client, _ in results}
        missing = sorted(set(self._report_cids) - answered)
        for failure in failures:
            log(WARNING, "final report (%s): client failure: %s", stage, describe_failure(failure))
        self.record.received(self._report_round, "report", results)  # type: ignore[attr-defined]
        self.report["seconds"] = time.perf_counter() - self._report_started  # both stages, end to end
        record = self.report.setdefault("problems", {})
        if missing:
            record[stage] = missing
        if stage == STAGE_ASSIGN:
            return self._take_assignments(results)
        return self._take_distances(results)

    def _take_assignments(self, results: list[tuple[ClientProxy, EvaluateRes]]) -> bool:
        assert self.k is not None  # type: ignore[attr-defined]
        k = self.k  # type: ignore[attr-defined]
        rows: dict[str, int] = {}
        sizes = np.zeros(k, dtype=np.int64)
        self._report_sums, self._report_clients, self._report_terms = {}, {}, []
        rejected, score_kinds = [], set()
        vertical_sizes = None
        withheld = 0  # records in clusters below the privacy floor at their client: not in the metrics
        for client, res in sorted(results, key=lambda item: item[0].cid):
            metrics = res.metrics
            try:
                partition = metrics.get("partition-id")
                if not isinstance(partition, int):
                    raise ValueError("no integer partition-id")
                client_sizes = decode_array(metrics.get(SIZES_KEY))  # type: ignore[arg-type]
                if (
                    client_sizes.shape != (k,)
                    or client_sizes.dtype.kind not in "iu"
                    or (client_sizes < 0).any()
                ):
                    raise ValueError(f"cluster sizes of shape {client_sizes.shape}, expected ({k},)")
                if int(client_sizes.sum()) != metrics.get(ROWS_KEY):
                    raise ValueError("cluster sizes do not add up to the assigned rows")
                sums = None
                if SUMS_KEY in metrics:
                    sums = decode_cluster_sums(metrics[SUMS_KEY])  # type: ignore[arg-type]
                    sent = sums.counts
                    if sent.shape != (k,) or not np.all((sent == client_sizes) | (sent == 0)):
                        raise ValueError("cluster sums disagree with the cluster sizes")
                    withheld += int(client_sizes[sent == 0].sum())
                terms = decode_term_counts(metrics[TERMS_KEY], k) if TERMS_KEY in metrics else None  # type: ignore[arg-type]
            except (ValueError, LabelFreeError) as exc:
                rejected.append(client.cid)
                log(WARNING, "final report: rejected client %s: %s", client.cid, exc)
                continue
            rows[str(partition)] = int(client_sizes.sum())
            score_kinds.add(str(metrics.get(SCORE_KIND_KEY, "none")))
            if self.vertical:
                if vertical_sizes is not None and not np.array_equal(vertical_sizes, client_sizes):
                    log(WARNING, "final report: party %d labels other rows than the first party", partition)
                vertical_sizes = client_sizes
            else:
                sizes += client_sizes
            if sums is not None:
                self._report_sums[partition], self._report_clients[partition] = sums, client
            if terms is not None:
                self._report_terms.append(terms)
        if rejected:
            self.report.setdefault("problems", {})["rejected"] = rejected
        self.report["assigned_rows"] = dict(sorted(rows.items(), key=lambda kv: int(kv[0])))
        if vertical_sizes is not None:
            sizes = vertical_sizes
        self.report["cluster_sizes"] = sizes.tolist()
        self.report["withheld_records"] = withheld
        empty = int((np.asarray(sizes) == 0).sum())
        if empty and not self.vertical:
            self.warn(  # type: ignore[attr-defined]
                f"{empty} of {len(sizes)} clusters hold no record after the last round "
                "(k may be larger than the clusters this data holds)"
            )
        if len(score_kinds) == 1:  # what the third column of every assignments.csv means
            kind = score_kinds.pop()
            self.report["score"] = {"kind": kind, "meaning": SCORE_KINDS.get(kind, "")}
        if self._report_terms:
            self.report["keywords"] = ctfidf_keywords(merge_term_counts(self._report_terms), KEYWORDS)
        if self.vertical and len(self._report_sums) != (self.n_views or len(self._report_sums)):  # type: ignore[attr-defined]
            log(WARNING, "final report: not every view reported; no label-free metrics")
            self._report_sums, self._report_clients = {}, {}
        return bool(rows)

    def _take_distances(self, results: list[tuple[ClientProxy, EvaluateRes]]) -> bool:
        parts: dict[int, DistanceSums] = {}
        partition_of = {proxy.cid: partition for partition, proxy in self._report_clients.items()}
        for client, res in results:
            partition = partition_of.get(client.cid)
            if partition is None:
                log(WARNING, "final report: distances from client %s, which was not asked", client.cid)
                continue
            try:
                parts[partition] = decode_distance_sums(res.metrics.get(DISTANCES_KEY))  # type: ignore[arg-type,index]
            except (LabelFreeError, ValueError) as exc:
                log(WARNING, "final report: rejected distances of client %s: %s", client.cid, exc)
        if set(parts) != set(self._report_sums):
            log(
                WARNING,
                "final report: distances of %d of %d clients; no label-free metrics",
                len(parts),
                len(self._report_sums),
            )
            return False
        ordered = [parts[p] for p in sorted(parts)]
        if self.vertical:
            merged = DistanceSums(
                np.zeros_like(ordered[0].distance_sums),
                np.sum([part.squared_sums for part in ordered], axis=0),
                0.0,
                ordered[0].n,
            )
        else:
            merged = merge_distance_sums(ordered)
        metrics = label_free_metrics(self._pooled_sums(), merged)
        if self.vertical:  # per-record distances across parties would be needed (module docstring)
            metrics["davies_bouldin"] = metrics["simplified_silhouette"] = None
        self.report["label_free"] = metrics
        scalars = {key: float(value) for key, value in metrics.items() if isinstance(value, int | float)}
        self.final_metrics = {**(self.final_metrics or {}), **scalars}  # type: ignore[has-type]
        log(INFO, "%s final report: %s", PROGRESS_MARKER, _describe_metrics(metrics))
        return True

    # ------------------------------------------------------------------------------------ model
    def write_model(self) -> None:
        """`OUT/model/`: model.json and the weights the clients labelled their records with."""
        parameters = self._report_parameters or self.report_parameters()
        if self.stopped or parameters is None or not parameters.tensors:  # type: ignore[attr-defined]
            return
        spec = method_spec(self.cfg.method)  # type: ignore[attr-defined]
        arrays = None if spec.vertical else parameters_to_ndarrays(parameters)
        info = {
            "method": self.cfg.method,  # type: ignore[attr-defined]
            "k": self.k,  # type: ignore[attr-defined]
            "transductive": spec.vertical,
            "config": self.cfg.to_dict(),  # type: ignore[attr-defined]
            "metrics": self.final_metrics or {},  # type: ignore[attr-defined]
            "cluster_sizes": self.report.get("cluster_sizes"),
            "keywords": self.report.get("keywords"),
            "score": self.report.get("score"),
            "label_free": self.report.get("label_free"),
            **self.model_description(),
        }
        try:
            write_model(self.out_dir / MODEL_DIR, info, arrays, torch_weights=spec.torch_model)  # type: ignore[attr-defined]
        except OSError as exc:
            log(WARNING, "could not write the model: %s", exc)


def _describe_metrics(metrics: dict[str, Any]) -> str:
    shown = []
    for key in ("inertia", "calinski_harabasz", "davies_bouldin", "simplified_silhouette"):
        value = metrics.get(key)
        if isinstance(value, int | float):
            shown.append(f"{key} {value:.4g}")
    return " ".join(shown) or "no metric (fewer than 2 clusters)"
