"""Server side of the final report (`fedapp.report.stages`): label-free metrics, keywords and the saved model.

After the last round the server loop (`fedapp.app.server_loop.run_report`) asks every usable client to
label its records with the global model (`assign`; each writes `assignments.csv` on its own machine)
and, with the pooled cluster means that gives, for distances (`distances`). What comes back is merged
into the label-free metrics (exactly those of the pooled data), cluster sizes and, for texts, c-TF-IDF
keywords; then `OUT/model/` is written. A client that fails the report is named in the status.

Plain, SecAgg+ and differentially private runs differ only in how a stage's statistics arrive: as every
client's own (`aggregate`), as SecAgg+ totals (`configure_secure` / `aggregate_secure`, driven by
`fedapp.app.secure_loop.run_secure_report`) or as noisy releases (`dp.report`). `strategies.report_intake`
turns each into one shape, which `merge_assignments` / `merge_distances` take the same way; metrics from
noisy totals are clamped and marked `noisy`.

Vertical federations: each party reports on its own view of the same (aligned) records, so the sums are
concatenated along the features; inertia and Calinski–Harabasz are exact on the concatenated views,
while Davies–Bouldin and the silhouette would need per-record distances across parties and are left out.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Protocol

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

from fedapp.config.run import RunConfig
from fedapp.methods import method_spec
from fedapp.metrics.label_free import (
    ClusterSums,
    DistanceSums,
    ctfidf_keywords,
    label_free_metrics,
    merge_cluster_sums,
    merge_term_counts,
    pooled_means,
)
from fedapp.privacy.dp import clip_rows
from fedapp.report.assignments import SCORE_KINDS
from fedapp.report.model_store import MODEL_DIR, write_model
from fedapp.report.records import PROGRESS_MARKER
from fedapp.report.stages import (
    REPORT_KEY,
    SCALE_KEY,
    SECURE_DONE,
    SECURE_RETRY,
    SECURE_STOP,
    STAGE_ASSIGN,
    STAGE_DISTANCES,
)
from strategies.k_choice import KChoice
from strategies.keep import ModelChoice
from strategies.privacy import PrivacyLayer
from strategies.records import RunRecord
from strategies.replies import describe_failure
from strategies.report_intake import (
    Assignments,
    clipped_or_retry,
    largest_rounding,
    noisy_assignments,
    noisy_distances,
    plain_assignments,
    plain_distances,
    secure_assignments,
    secure_distances,
    secure_totals,
)
from strategies.roster import ClientRoster

KEYWORDS = 10  # keywords kept per cluster
Failures = list[tuple[ClientProxy, Any] | BaseException]


class ReportHost(Protocol):
    """What the final report needs of its strategy (`strategies.base.ClusteringStrategy`)."""

    cfg: RunConfig
    k: int | None
    stopped: bool
    rounds_run: int
    out_dir: Path
    record: RunRecord  # the communication ledger books the report's messages
    roster: ClientRoster  # who is asked
    final_metrics: dict[str, float] | None  # the label-free metrics join them
    privacy: PrivacyLayer  # the report's DP releases and SecAgg+ clipping count with the training's
    k_choice: KChoice  # its messages carry the chosen k when the run chose one

    def report_parameters(self) -> Parameters | None: ...

    def model_description(self) -> dict[str, Any]: ...

    def report_views(self) -> int | None: ...

    def effective_config(self) -> dict[str, Any]: ...

    def warn(self, message: str) -> None: ...


class FinalReport:
    """The final report's two stages, composed into a strategy; `summary` is summary.json's `report`."""

    def __init__(self, host: ReportHost) -> None:
        self.host = host
        self.summary: dict[str, Any] = {}
        self.parameters: Parameters | None = None  # the global model the clients labelled with
        self.sums: dict[int, ClusterSums] = {}  # partition (or POOLED) -> its pass-1 sums
        self.reporters: dict[int, str] = {}  # partition -> the client that sent them, asked for distances
        self.asked: list[str] = []  # clients sent the current stage
        self.started = 0.0  # perf_counter at stage 1: the report's seconds, both stages end to end
        self.choice = ModelChoice(host)  # type: ignore[arg-type]  # `select = best`: which model to label with

    @property
    def vertical(self) -> bool:
        return method_spec(self.host.cfg.method).vertical

    @property
    def problems(self) -> dict[str, list[str]]:
        """Clients that failed a stage or sent a malformed reply, by stage (`rejected`: malformed)."""
        return self.summary.get("problems", {})

    @property
    def server_round(self) -> int:
        """The ledger books the report as the round after the last one."""
        return self.host.rounds_run + 1

    # ---------------------------------------------------------------------------------- stages
    def configure(self, stage: str, client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Instructions for one stage; [] when there is nothing (more) to do."""
        if self.host.stopped or self.host.k is None:
            return []
        if stage == STAGE_ASSIGN:
            parameters = self.choice.parameters() or self.host.report_parameters()
            if parameters is None or not parameters.tensors:
                return []
            self.parameters, self.started = parameters, time.perf_counter()
            if self.choice.summary:
                self.summary["select"] = self.choice.summary
            ins = EvaluateIns(parameters, {REPORT_KEY: STAGE_ASSIGN, **self.choice.assign_config})
            instructions = [
                (client, ins) for client in self.host.roster.usable(client_manager, self.host.record)
            ]
            self.asked = [client.cid for client, _ in instructions]
        elif stage == STAGE_DISTANCES:
            if not self.sums:
                return []
            instructions = self._distance_instructions(client_manager)
            self.asked = [cid for _, cid in sorted(self.reporters.items())]
        else:
            raise ValueError(f"unknown report stage {stage!r}")
        self.host.record.sent(self.server_round, "report", instructions)
        return self.host.k_choice.stamp(instructions)

    def _distance_instructions(self, client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        """The pooled means and counts (each party its view's columns) to every client that sent sums."""
        sums = self.pooled_sums()
        means, counts = pooled_means(sums), sums.counts
        if self.host.cfg.dp.enabled:  # noisy means, into the records' clip ball
            means = clip_rows(means, self.host.cfg.dp.clip)
        offsets = self._view_offsets()
        proxies = client_manager.all()
        instructions = []
        for partition, cid in sorted(self.reporters.items()):
            if cid not in proxies:  # gone since stage 1: missing from stage 2
                continue
            arrays = [means, counts]
            if self.vertical:
                start, stop = offsets[partition]
                arrays = [means[:, start:stop], counts]
            ins = EvaluateIns(ndarrays_to_parameters(arrays), {REPORT_KEY: STAGE_DISTANCES})
            instructions.append((proxies[cid], ins))
        return instructions

    def _view_offsets(self) -> dict[int, tuple[int, int]]:
        offsets, start = {}, 0
        for partition in sorted(self.sums):
            width = self.sums[partition].sums.shape[1]
            offsets[partition] = (start, start + width)
            start += width
        return offsets

    def pooled_sums(self) -> ClusterSums:
        """The pass-1 sums of the pooled data: summed over clients, or the parties' views side by side."""
        parts = [self.sums[partition] for partition in sorted(self.sums)]
        if not self.vertical:
            return merge_cluster_sums(parts)
        return ClusterSums(parts[0].counts, np.hstack([part.sums for part in parts]))

    def aggregate(
        self, stage: str, results: list[tuple[ClientProxy, EvaluateRes]], failures: Failures
    ) -> bool:
        """Take one stage's evaluate replies (plain or noisy); False when the report cannot go on."""
        self._received(stage, results, failures, "")
        problems = self.summary.setdefault("problems", {})
        missing = self._missing(results)
        if missing:
            problems[stage] = missing
        k, cfg = self.host.k or 0, self.host.cfg
        if not cfg.dp.enabled:
            if stage == STAGE_ASSIGN:
                views = self.host.report_views()
                return self.merge_assignments(plain_assignments(results, k, self.vertical, views))
            return self.merge_distances(plain_distances(results, self.reporters, self.vertical))
        self.host.privacy.note_releases([res.metrics for _, res in results])
        if stage == STAGE_ASSIGN:
            self.summary["dp"] = self.host.privacy.plan.report_summary()  # type: ignore[union-attr]
            return self.merge_assignments(noisy_assignments(results, k))
        counts = self.pooled_sums().counts
        return self.merge_distances(noisy_distances(results, len(self.reporters), counts))

    def configure_secure(
        self, stage: str, client_manager: ClientManager, scale: float
    ) -> list[tuple[ClientProxy, FitIns]]:
        """A stage's instructions as fit messages for SecAgg+, the sums multiplied by `scale` (public); the
        plain stage's config goes too (the chosen k, how a kept start labels): a Ray process that serves
        only this message builds its client from it."""
        return [
            (client, FitIns(ins.parameters, {**ins.config, REPORT_KEY: stage, SCALE_KEY: scale}))
            for client, ins in self.configure(stage, client_manager)
        ]

    def aggregate_secure(
        self,
        stage: str,
        results: list[tuple[ClientProxy, FitRes]],
        failures: Failures,
        scale: float,
        last_try: bool,
    ) -> str:
        """Take a stage's secure totals: SECURE_DONE, SECURE_RETRY (SecAgg+ clipped a value: ask again
        with a smaller scale) or SECURE_STOP (the report cannot go on)."""
        self._received(stage, results, failures, ", SecAgg+")
        secure = self.summary.setdefault("secagg", {"scale": {}, "attempts": {}, "largest_rounding": 0.0})
        secure["attempts"][stage] = secure["attempts"].get(stage, 0) + 1
        missing = self._missing(results)
        if missing:
            self.summary.setdefault("problems", {})[stage] = missing
        if not results:
            return SECURE_STOP
        clipped = clipped_or_retry(results, f"final report ({stage})", scale, last_try)
        if clipped is None:
            return SECURE_RETRY
        if clipped:
            self.host.privacy.note_clipped(f"final report ({stage})", clipped)
        secure["scale"][stage] = scale
        totals = secure_totals(results)
        try:
            if stage == STAGE_ASSIGN:
                arrived = secure_assignments(results, totals, self.host.k or 0, scale)
                secure["largest_rounding"] = largest_rounding(totals)
                merged = self.merge_assignments(arrived)
            else:
                merged = self.merge_distances(secure_distances(totals, self.pooled_sums().counts, scale))
        except ValueError as exc:  # a malformed reply inside the sum, or totals that are no statistics
            log(WARNING, "final report (%s, SecAgg+): %s", stage, exc)
            self.summary.setdefault("problems", {}).setdefault("rejected", []).append(str(exc))
            return SECURE_STOP
        return SECURE_DONE if merged else SECURE_STOP

    def _received(
        self, stage: str, results: list[tuple[ClientProxy, Any]], failures: Failures, via: str
    ) -> None:
        for failure in failures:
            log(WARNING, "final report (%s%s): client failure: %s", stage, via, describe_failure(failure))
        self.host.record.received(self.server_round, "report", results)
        self.summary["seconds"] = time.perf_counter() - self.started

    def lost(self, stage: str, why: str) -> None:
        """A stage no reply reached the server for (SecAgg+ aggregated nothing, in a run that was not
        stopped): every client asked missed it, and the run says so in its status."""
        if self.host.stopped:
            return
        self.summary.setdefault("problems", {})[stage] = list(self.asked) or ["every client"]
        self.host.warn(f"final report ({stage}): {why}")

    def _missing(self, results: list[tuple[ClientProxy, Any]]) -> list[str]:
        return sorted(set(self.asked) - {client.cid for client, _ in results})

    # ------------------------------------------------------------------------------ the merge
    def merge_assignments(self, arrived: Assignments) -> bool:
        """Stage 1 into the report, whichever way it arrived; True when there are sums to ask
        distances about."""
        if arrived.rejected:
            self.summary.setdefault("problems", {})["rejected"] = arrived.rejected
        self.summary["assigned_rows"] = {str(partition): n for partition, n in sorted(arrived.rows.items())}
        if arrived.noisy:
            self.summary["noisy"] = True
        sizes = arrived.sizes
        self.summary["cluster_sizes"] = None if sizes is None else sizes.tolist()
        if arrived.withheld is not None:
            self.summary["withheld_records"] = arrived.withheld
        if sizes is not None and arrived.exact and not self.vertical:
            self._warn_empty(sizes)
        if len(arrived.score_kinds) == 1:  # what the third column of every assignments.csv means
            kind = next(iter(arrived.score_kinds))
            self.summary["score"] = {"kind": kind, "meaning": SCORE_KINDS.get(kind, "")}
        if arrived.terms:
            self.summary["keywords"] = ctfidf_keywords(merge_term_counts(arrived.terms), KEYWORDS)
        self.sums, self.reporters = arrived.sums, arrived.reporters
        return bool(self.sums)

    def _warn_empty(self, sizes: np.ndarray) -> None:
        empty = int((sizes == 0).sum())
        if empty:
            self.host.warn(
                f"{empty} of {len(sizes)} clusters hold no record after the last round "
                "(k may be larger than the clusters this data holds)"
            )

    def merge_distances(self, merged: DistanceSums | None) -> bool:
        """The label-free metrics of the pooled sums and `merged` distances, into the report and the
        run's final metrics; False when the distances did not arrive."""
        if merged is None:
            return False
        metrics = label_free_metrics(self.pooled_sums(), merged)
        if self.vertical:  # per-record distances across parties would be needed (module docstring)
            metrics["davies_bouldin"] = metrics["simplified_silhouette"] = None
        self.summary["label_free"] = metrics
        scalars = {key: float(value) for key, value in metrics.items() if isinstance(value, int | float)}
        self.host.final_metrics = {**(self.host.final_metrics or {}), **scalars}
        log(INFO, "%s final report: %s", PROGRESS_MARKER, _describe_metrics(metrics))
        return True

    # ------------------------------------------------------------------------------------ model
    def write_model(self) -> None:
        """`OUT/model/`: model.json and the weights the clients labelled their records with."""
        host = self.host
        parameters = self.parameters or host.report_parameters()
        if host.stopped or parameters is None or not parameters.tensors:
            return
        spec = method_spec(host.cfg.method)
        arrays = None if spec.vertical else parameters_to_ndarrays(parameters)
        info = {
            "method": host.cfg.method,
            "k": host.k,
            "transductive": spec.vertical,
            "config": host.effective_config(),
            "metrics": host.final_metrics or {},
            "cluster_sizes": self.summary.get("cluster_sizes"),
            "keywords": self.summary.get("keywords"),
            "score": self.summary.get("score"),
            "label_free": self.summary.get("label_free"),
            **host.model_description(),
            **self.choice.model_fields(),
        }
        try:
            write_model(host.out_dir / MODEL_DIR, info, arrays, torch_weights=spec.torch_model)
        except OSError as exc:
            log(WARNING, "could not write the model: %s", exc)

    # ------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the report (clients by id: proxies are this process's)."""
        return {
            "summary": self.summary,
            "parameters": self.parameters,
            "sums": self.sums,
            "reporters": self.reporters,
            "asked": self.asked,
            "choice": self.choice.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The inverse of `state_dict`."""
        self.summary, self.parameters, self.sums = state["summary"], state["parameters"], state["sums"]
        self.reporters, self.asked = state["reporters"], state["asked"]
        self.choice.load_state_dict(state["choice"])


def _describe_metrics(metrics: dict[str, Any]) -> str:
    shown = []
    for key in ("inertia", "calinski_harabasz", "davies_bouldin", "simplified_silhouette"):
        value = metrics.get(key)
        if isinstance(value, int | float):
            shown.append(f"{key} {value:.4g}")
    return " ".join(shown) or "no metric (fewer than 2 clusters)"
