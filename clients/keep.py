"""Client side of `select = best` (`fedapp.report.keep`): label the records with both candidates and
send only their summable statistics in the start's space (plus, on a labelled client, the two
contingency tables an evaluation sends anyway)."""

from __future__ import annotations

from typing import Protocol

from flwr.common import NDArrays, Scalar

from fedapp.datasets.local import LocalData
from fedapp.metrics.contingency import contingency_table, encode_table
from fedapp.report.keep import (
    CANDIDATE_SUMS_KEY,
    FINAL_TABLE_KEY,
    LABELS_BY_KEY,
    START_ARRAYS_KEY,
    START_TABLE_KEY,
    candidate_sums,
    encode_candidate_sums,
)
from fedapp.report.stages import Assignment

Reply = tuple[float, int, dict[str, Scalar]]


class ChoosingClient(Protocol):
    """What the choice needs of its client (`clients.base.ClusteringClient`)."""

    data: LocalData
    k: int
    floor: int

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment: ...

    def identity_metrics(self) -> dict[str, Scalar]: ...


def score_candidates(client: ChoosingClient, parameters: NDArrays, config: dict[str, Scalar]) -> Reply:
    """The first `START_ARRAYS_KEY` arrays are the start (assigned with `LABELS_BY_KEY` when the server
    sends one), the rest the final model; the space is the start's."""
    n_start = int(config[START_ARRAYS_KEY])  # type: ignore[call-overload]
    start_config: dict[str, Scalar] = {}
    if LABELS_BY_KEY in config:
        start_config[LABELS_BY_KEY] = config[LABELS_BY_KEY]
    start = client.assign(list(parameters[:n_start]), start_config)
    final = client.assign(list(parameters[n_start:]), {})
    if start.space is None:
        raise ValueError("the starting clustering has no metric space to score it in")
    sums = candidate_sums(start.space, [start.labels, final.labels], client.k, client.floor)
    metrics: dict[str, Scalar] = {
        **client.identity_metrics(),
        CANDIDATE_SUMS_KEY: encode_candidate_sums(sums),
    }
    data = client.data
    if data.labelled:
        for key, labels in ((START_TABLE_KEY, start.labels), (FINAL_TABLE_KEY, final.labels)):
            metrics[key] = encode_table(contingency_table(labels, data.labels, client.k, data.n_classes))
    return 0.0, data.n_samples, metrics
