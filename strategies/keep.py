"""Server side of `select = best` (`fedapp.report.keep`), composed into the final report: one evaluate
message before the report's stages scores the start and the final clustering; the report then labels
with the kept one, `summary.json` `report.select` says which and why, model.json says how to apply it."""

from __future__ import annotations

from logging import INFO, WARNING
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
from fedapp.metrics.contingency import clustering_metrics
from fedapp.report.keep import (
    CANDIDATE_SUMS_KEY,
    CANDIDATES,
    FINAL_TABLE_KEY,
    KEEP_KEY,
    START_ARRAYS_KEY,
    START_TABLE_KEY,
    CandidateSums,
    Choice,
    StartCandidate,
    candidate_sums_from_totals,
    choose,
    decode_candidate_sums,
    merge_candidate_sums,
)
from fedapp.report.stages import SCALE_KEY, SECURE_DONE, SECURE_RETRY, SECURE_STOP
from fedapp.wire import ReplyError, decode_counts
from strategies.k_choice import KChoice
from strategies.privacy import PrivacyLayer
from strategies.records import RunRecord
from strategies.replies import describe_failure
from strategies.report_intake import clipped_or_retry, secure_totals
from strategies.roster import ClientRoster

Failures = list[tuple[ClientProxy, EvaluateRes] | BaseException]


class ChoiceHost(Protocol):
    """What the choice needs of its strategy (`strategies.base.ClusteringStrategy`)."""

    cfg: RunConfig
    k: int | None
    stopped: bool
    rounds_run: int
    roster: ClientRoster
    record: RunRecord
    privacy: PrivacyLayer
    k_choice: KChoice
    final_metrics: dict[str, float] | None

    def report_parameters(self) -> Parameters | None: ...

    def start_candidate(self) -> StartCandidate | None: ...

    def warn(self, message: str) -> None: ...


class ModelChoice:
    """Which model the final report labels with (module docstring); `summary` is `report.select`."""

    def __init__(self, host: ChoiceHost) -> None:
        self.host = host
        self.summary: dict[str, Any] = {}
        self.start: StartCandidate | None = None  # set when the start was kept

    def skip_reason(self) -> str | None:
        """Why no choice is made this run (None: it is made)."""
        host = self.host
        if host.cfg.select != "best":
            return "select = final"
        if host.privacy.private:  # its statistics are not noised
            return "not under differential privacy (the final model is kept)"
        return None

    def configure(self, client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        """The one scoring message, or [] (no start to compare, `select = final`, a stopped run)."""
        host = self.host
        if host.stopped or host.k is None or self.summary:
            return []
        start, final = host.start_candidate(), host.report_parameters()
        if start is None or final is None or not final.tensors:
            return []
        reason = self.skip_reason()
        if reason is not None:
            self.summary = {"kept": "final", "why": reason}
            return []
        arrays = [*start.arrays, *parameters_to_ndarrays(final)]
        config = {KEEP_KEY: True, START_ARRAYS_KEY: len(start.arrays), **start.assign_config}
        ins = EvaluateIns(ndarrays_to_parameters(arrays), config)
        instructions = [(client, ins) for client in host.roster.usable(client_manager, host.record)]
        host.record.sent(host.rounds_run + 1, "report", instructions)
        return host.k_choice.stamp(instructions)

    def aggregate(self, results: list[tuple[ClientProxy, EvaluateRes]], failures: Failures) -> None:
        """Merge the candidates' statistics, choose, and make the kept model the report's."""
        host = self.host
        host.record.received(host.rounds_run + 1, "report", results)
        for failure in failures:
            log(WARNING, "model choice: client failure: %s", describe_failure(failure))
        parts, tables = [], {name: [] for name in CANDIDATES}
        for client, res in results:
            try:  # a reply counts whole or not at all
                sums = decode_candidate_sums(res.metrics.get(CANDIDATE_SUMS_KEY))
                own = _tables(res.metrics)
            except ReplyError as exc:
                log(WARNING, "model choice: rejected the reply of client %s: %s", client.cid, exc)
                continue
            parts.append(sums)
            for name, table in own.items():
                tables[name].append(table)
        if not parts:
            self.summary = {"kept": "final", "why": "no client scored the candidates"}
            return
        try:
            merged = merge_candidate_sums(parts)
        except ReplyError as exc:
            self.summary = {"kept": "final", "why": f"candidate statistics do not merge: {exc}"}
            return
        self._take(merged, tables, len(parts))

    def configure_secure(
        self, client_manager: ClientManager, scale: float
    ) -> list[tuple[ClientProxy, FitIns]]:
        """The scoring message as SecAgg+ fit messages, the sums multiplied by `scale` (public)."""
        return [
            (client, FitIns(ins.parameters, {**ins.config, SCALE_KEY: scale}))
            for client, ins in self.configure(client_manager)
        ]

    def aggregate_secure(
        self, results: list[tuple[ClientProxy, FitRes]], failures: Failures, scale: float, last_try: bool
    ) -> str:
        """SecAgg+'s totals of the candidates' sums: SECURE_DONE, SECURE_RETRY (it would clip: again with a
        smaller scale) or SECURE_STOP (the final model is kept)."""
        host = self.host
        host.record.received(host.rounds_run + 1, "report", results)
        for failure in failures:
            log(WARNING, "model choice (SecAgg+): client failure: %s", describe_failure(failure))
        if not results:
            self.summary = {"kept": "final", "why": "no client scored the candidates"}
            return SECURE_STOP
        clipped = clipped_or_retry(results, "model choice", scale, last_try)
        if clipped is None:
            return SECURE_RETRY
        try:
            if clipped:
                raise ReplyError(f"SecAgg+ clipped {clipped} values even at scale {scale:g}")
            merged = candidate_sums_from_totals(secure_totals(results), scale)
            tables = {name: [] for name in CANDIDATES}
            for _, res in results:
                for name, table in _tables(res.metrics).items():
                    tables[name].append(table)
        except ReplyError as exc:
            self.summary = {"kept": "final", "why": f"candidate statistics under SecAgg+: {exc}"}
            return SECURE_STOP
        self._take(merged, tables, len(results))
        self.summary["secagg"] = {"scale": scale}
        return SECURE_DONE

    def abandon(self, why: str) -> None:
        """No choice could be made (e.g. SecAgg+ aggregated nothing): the final model is kept."""
        if not self.summary:
            self.summary = {"kept": "final", "why": why}

    def _take(self, merged: CandidateSums, tables: dict[str, list[np.ndarray]], clients: int) -> None:
        """Choose between the merged candidates and make the kept model the report's."""
        host = self.host
        try:
            choice = choose(merged, host.cfg.select)
        except ReplyError as exc:
            self.summary = {"kept": "final", "why": f"candidate statistics do not merge: {exc}"}
            return
        self.summary = self._describe(choice, tables, clients)
        start = host.start_candidate()  # the start configure sent: nothing moved it since
        if choice.degraded and start is not None:
            self.start = start
            start_metrics = self.summary.get("labelled", {}).get("start")
            if start_metrics:  # the run's metrics are the kept model's
                host.final_metrics = {**(host.final_metrics or {}), **start_metrics}
            host.warn(
                f"training made the clustering worse ({choice.why}, in the starting clustering's space): "
                "kept the starting clustering"
                + (
                    f" (`--method {start.method}` is the one-shot method it amounts to)"
                    if start.method
                    else ""
                )
            )
        log(INFO, "model choice: kept the %s clustering (%s)", choice.kept, choice.why)

    def _describe(self, choice: Choice, tables: dict[str, list[np.ndarray]], clients: int) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "kept": choice.kept,
            "why": choice.why,
            "criterion": "SSB / SSW in the starting clustering's space (fedapp/report/keep.py)",
            "scores": choice.scores,
            "calinski_harabasz": {name: s.calinski_harabasz for name, s in choice.scatter.items()},
            "clusters_used": choice.clusters_used,
            "scatter": {name: s.to_json() for name, s in choice.scatter.items()},
            "clients": clients,
        }
        if all(tables.values()):
            summary["labelled"] = {
                name: clustering_metrics(np.sum(parts, axis=0)) for name, parts in tables.items()
            }
        return summary

    # --------------------------------------------------------------- what the report labels with
    def parameters(self) -> Parameters | None:
        """The kept start as the report's model; None: the final model."""
        return None if self.start is None else ndarrays_to_parameters(self.start.arrays)

    @property
    def assign_config(self) -> dict[str, str]:
        return {} if self.start is None else dict(self.start.assign_config)

    def model_fields(self) -> dict[str, Any]:
        """model.json: how `fedapp predict` applies the kept model."""
        if self.start is None:
            return {}
        return {"kept": "start", "assign_config": self.assign_config}

    def state_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "start": self.start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.summary, self.start = state["summary"], state["start"]


def _tables(metrics: dict[str, Any]) -> dict[str, np.ndarray]:
    """A labelled client's two contingency tables (start, final); {} from an unlabelled one."""
    keys = dict(zip(CANDIDATES, (START_TABLE_KEY, FINAL_TABLE_KEY), strict=True))
    return {name: decode_counts(metrics[key]) for name, key in keys.items() if key in metrics}
