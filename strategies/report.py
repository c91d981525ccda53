"""Server side of the final report (`fedapp.report.stages`): label-free metrics, keywords and the saved model.

After the last round the server loop (`fedapp.app.server_loop.run_report`) asks every usable client to
label its records with the global model (`assign`; each writes `assignments.csv` on its own machine)
and, with the pooled cluster means that gives, for distances (`distances`). What comes back is merged
into the label-free metrics (exactly those of the pooled data), cluster sizes and, for texts, c-TF-IDF
keywords; then `OUT/model/` is written. A client that fails the report is named in the status.

Under SecAgg+ (`secagg`) the two stages are fit messages aggregated by Flower's SecAgg+
(`configure_secure_report` / `aggregate_secure_report`, driven by `fedapp.app.server_loop.run_secure_report`):
the server gets only the totals of sizes, sums and distance sums, which it rounds and merges as the plain
report merges the clients' parts. Under differential privacy the clients send noisy statistics of
clipped records or nothing (`dp.report`); the metrics from noisy totals are clamped and marked `noisy`.

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
    FitIns,
    FitRes,
    Parameters,
    log,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from fedapp.methods import method_spec
from fedapp.metrics.label_free import (
    ClusterSums,
    DistanceSums,
    LabelFreeError,
    approximate_cluster_sums,
    approximate_distance_sums,
    ctfidf_keywords,
    decode_arrays,
    decode_cluster_sums,
    decode_distance_sums,
    decode_term_counts,
    label_free_metrics,
    merge_cluster_sums,
    merge_distance_sums,
    merge_term_counts,
    pooled_means,
)
from fedapp.privacy.dp import RELEASES_KEY, clip_rows
from fedapp.privacy.secagg import CLIPPED_KEY
from fedapp.report.assignments import SCORE_KINDS
from fedapp.report.model_store import MODEL_DIR, write_model
from fedapp.report.records import PROGRESS_MARKER
from fedapp.report.stages import (
    DISTANCES_KEY,
    NOISY_ASSIGN,
    NOISY_DISTANCES,
    NOISY_KEY,
    REPORT_KEY,
    ROWS_KEY,
    SCALE_KEY,
    SCORE_KIND_KEY,
    SECURE_DONE,
    SECURE_RETRY,
    SECURE_STOP,
    SIZES_KEY,
    STAGE_ASSIGN,
    STAGE_DISTANCES,
    SUMS_KEY,
    TERMS_KEY,
    assign_from_totals,
    distances_from_totals,
)
from fedapp.wire import decode_array
from strategies.replies import describe_failure

KEYWORDS = 10  # keywords kept per cluster
POOLED = -1  # key of the one pooled part when only totals reach the server (SecAgg+, DP)


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
        if self.cfg.dp.enabled:  # type: ignore[attr-defined]  # noisy means, into the records' clip ball
            means = clip_rows(means, self.cfg.dp.clip)  # type: ignore[attr-defined]
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
        if self.cfg.dp.enabled:  # type: ignore[attr-defined]
            self._count_releases(results)
            if stage == STAGE_ASSIGN:
                return self._take_noisy_assignments(results)
            return self._take_noisy_distances(results)
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
        return self._label_free(merged)

    def _label_free(self, merged: DistanceSums) -> bool:
        """The label-free metrics of the pooled sums and `merged` distances, into the report and metrics."""
        metrics = label_free_metrics(self._pooled_sums(), merged)
        if self.vertical:  # per-record distances across parties would be needed (module docstring)
            metrics["davies_bouldin"] = metrics["simplified_silhouette"] = None
        self.report["label_free"] = metrics
        scalars = {key: float(value) for key, value in metrics.items() if isinstance(value, int | float)}
        self.final_metrics = {**(self.final_metrics or {}), **scalars}  # type: ignore[has-type]
        log(INFO, "%s final report: %s", PROGRESS_MARKER, _describe_metrics(metrics))
        return True

    # ------------------------------------------------------------------------ differential privacy
    def _count_releases(self, results: list[tuple[ClientProxy, EvaluateRes]]) -> None:
        made = [res.metrics.get(RELEASES_KEY) for _, res in results]
        spent = max((m for m in made if isinstance(m, int)), default=0)
        self.privacy.releases = max(self.privacy.releases, spent)  # type: ignore[attr-defined]

    def _take_noisy_assignments(self, results: list[tuple[ClientProxy, EvaluateRes]]) -> bool:
        """Stage 1 under DP: the noisy totals (clamped, rounded) or, with `dp.report` withholding,
        only who answered and what their scores mean."""
        self.report["dp"] = self.privacy.plan.report_summary()  # type: ignore[attr-defined]
        self._report_sums, self._report_clients, self._report_terms = {}, {}, []
        self._record_score_kinds(results)
        parts, clients, rejected = [], {}, []
        for client, res in sorted(results, key=lambda item: item[0].cid):
            partition = res.metrics.get("partition-id")
            if not isinstance(partition, int):
                rejected.append(client.cid)
                continue
            clients[partition] = client
            if NOISY_KEY not in res.metrics:
                continue
            try:
                blob = res.metrics[NOISY_KEY]
                try:
                    parts.append(decode_arrays(blob, NOISY_ASSIGN, "noisy statistics"))  # type: ignore[arg-type]
                except LabelFreeError:  # a method without a metric space sends only its sizes
                    parts.append(decode_arrays(blob, {"sizes"}, "noisy statistics"))  # type: ignore[arg-type]
            except LabelFreeError as exc:
                rejected.append(client.cid)
                log(WARNING, "final report: rejected client %s: %s", client.cid, exc)
        if rejected:
            self.report.setdefault("problems", {})["rejected"] = rejected
        self.report["assigned_rows"] = {}  # a client's record count is private under DP
        if not parts:
            self.report["cluster_sizes"] = None
            return False
        k = self.k  # type: ignore[attr-defined]
        sizes = np.sum([part["sizes"] for part in parts], axis=0)
        self.report["noisy"] = True
        if sizes.shape != (k,) or any(set(part) != set(parts[0]) for part in parts):
            log(WARNING, "final report: noisy statistics of different shapes; no label-free metrics")
            return False
        if "sums" not in parts[0]:
            self.report["cluster_sizes"] = np.maximum(np.rint(sizes), 0).astype(np.int64).tolist()
            return False
        pooled = approximate_cluster_sums(sizes, np.sum([part["sums"] for part in parts], axis=0))
        self.report["cluster_sizes"] = pooled.counts.tolist()
        if int((pooled.counts > 0).sum()) < 1:
            return False
        self._report_sums, self._report_clients = {POOLED: pooled}, clients
        return True

    def _take_noisy_distances(self, results: list[tuple[ClientProxy, EvaluateRes]]) -> bool:
        parts = []
        for client, res in results:
            try:
                parts.append(decode_arrays(res.metrics.get(NOISY_KEY), NOISY_DISTANCES, "noisy distances"))  # type: ignore[arg-type]
            except LabelFreeError as exc:
                log(WARNING, "final report: rejected distances of client %s: %s", client.cid, exc)
        if len(parts) != len(self._report_clients):
            log(
                WARNING,
                "final report: noisy distances of %d of %d clients",
                len(parts),
                len(self._report_clients),
            )
            return False
        total = {name: np.sum([part[name] for part in parts], axis=0) for name in NOISY_DISTANCES}
        counts = self._pooled_sums().counts
        merged = approximate_distance_sums(
            total["distance_sums"], total["squared_sums"], float(total["silhouette_sum"]), counts
        )
        return self._label_free(merged)

    def _record_score_kinds(self, results: list[tuple[ClientProxy, Any]]) -> None:
        kinds = {str(res.metrics.get(SCORE_KIND_KEY, "none")) for _, res in results}
        if len(kinds) == 1:
            kind = kinds.pop()
            self.report["score"] = {"kind": kind, "meaning": SCORE_KINDS.get(kind, "")}

    # ------------------------------------------------------------------------------------ SecAgg+
    def configure_secure_report(
        self, stage: str, client_manager: ClientManager, scale: float
    ) -> list[tuple[ClientProxy, FitIns]]:
        """A stage's instructions as fit messages for SecAgg+, the sums multiplied by `scale` (public)."""
        started = self._report_started
        evaluate = self.configure_report(stage, client_manager)
        if stage == STAGE_DISTANCES and started:
            self._report_started = started  # a retried stage does not restart the report's clock
        config = {REPORT_KEY: stage, SCALE_KEY: scale}
        return [(client, FitIns(ins.parameters, config)) for client, ins in evaluate]

    def aggregate_secure_report(
        self,
        stage: str,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
        scale: float,
        last_try: bool,
    ) -> str:
        """Take a stage's secure totals: SECURE_DONE, SECURE_RETRY (SecAgg+ clipped a value: ask again
        with a smaller scale) or SECURE_STOP (the report cannot go on)."""
        for failure in failures:
            log(WARNING, "final report (%s, SecAgg+): client failure: %s", stage, describe_failure(failure))
        self.record.received(self._report_round, "report", results)  # type: ignore[attr-defined]
        self.report["seconds"] = time.perf_counter() - self._report_started
        secure = self.report.setdefault("secagg", {"scale": {}, "attempts": {}, "largest_rounding": 0.0})
        secure["attempts"][stage] = secure["attempts"].get(stage, 0) + 1
        missing = sorted(set(self._report_cids) - {client.cid for client, _ in results})
        if missing:
            self.report.setdefault("problems", {})[stage] = missing
        if not results:
            return SECURE_STOP
        clipped = sum(int(res.metrics.get(CLIPPED_KEY, 0)) for _, res in results)  # type: ignore[call-overload]
        if clipped and not last_try:
            log(
                INFO,
                "final report (%s): SecAgg+ would clip %d values at scale %g; again",
                stage,
                clipped,
                scale,
            )
            return SECURE_RETRY
        if clipped:
            self.privacy.secagg_clipped += clipped  # type: ignore[attr-defined]
            log(WARNING, "final report (%s): SecAgg+ clipped %d values (raise secagg-clip)", stage, clipped)
        secure["scale"][stage] = scale
        weight = sum(int(res.num_examples) for _, res in results)
        totals = [
            np.asarray(a, np.float64) * weight for a in parameters_to_ndarrays(results[0][1].parameters)
        ]
        try:
            if stage == STAGE_ASSIGN:
                return self._take_secure_assignments(results, totals, scale)
            return self._take_secure_distances(totals, scale)
        except (ValueError, LabelFreeError) as exc:
            log(WARNING, "final report (%s, SecAgg+): %s", stage, exc)
            self.report.setdefault("problems", {}).setdefault("rejected", []).append(str(exc))
            return SECURE_STOP

    def _take_secure_assignments(
        self, results: list[tuple[ClientProxy, FitRes]], totals: list[np.ndarray], scale: float
    ) -> str:
        """Stage 1's totals; every reply inside the secure sum must be valid, since a share cannot be
        taken out of it again."""
        k = self.k  # type: ignore[attr-defined]
        rows, clients, terms = {}, {}, []
        for client, res in sorted(results, key=lambda item: item[0].cid):
            partition = res.metrics.get("partition-id")
            if not isinstance(partition, int) or res.metrics.get(ROWS_KEY) != res.num_examples:
                raise ValueError(f"client {client.cid}: no partition-id or row count, inside the secure sum")
            if TERMS_KEY in res.metrics:
                terms.append(decode_term_counts(res.metrics[TERMS_KEY], k))  # type: ignore[arg-type]
            rows[str(partition)], clients[partition] = int(res.num_examples), client
        sizes, pooled = assign_from_totals(totals, k, scale)
        approximate = [totals[0]] + ([totals[1]] if pooled is not None else [])
        rounding = max(float(np.abs(t - np.rint(t)).max()) for t in approximate)
        self.report["secagg"]["largest_rounding"] = rounding  # > 0.5: a count may be off by one
        self._report_sums, self._report_clients, self._report_terms = {}, {}, terms
        self.report["assigned_rows"] = dict(sorted(rows.items(), key=lambda kv: int(kv[0])))
        self.report["cluster_sizes"] = sizes.tolist()
        self._record_score_kinds(results)
        if terms:
            self.report["keywords"] = ctfidf_keywords(merge_term_counts(terms), KEYWORDS)
        if pooled is None:
            return SECURE_STOP  # no metric space: nothing for stage 2
        self.report["withheld_records"] = int(sizes.sum() - pooled.counts.sum())
        self._report_sums, self._report_clients = {POOLED: pooled}, clients
        return SECURE_DONE

    def _take_secure_distances(self, totals: list[np.ndarray], scale: float) -> str:
        counts = self._pooled_sums().counts
        merged = distances_from_totals(totals, counts, scale)
        if abs(float(totals[3][0]) - merged.n) > 0.5:
            log(
                WARNING, "final report: secure distances cover %.1f rows, the sums %d", totals[3][0], merged.n
            )
        return SECURE_DONE if self._label_free(merged) else SECURE_STOP

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
