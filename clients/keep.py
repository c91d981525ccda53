"""Client side of `select = best` (`fedapp.report.keep`): label the records with both candidates and
send only their summable statistics in the start's space (plus, on a labelled client, the two
contingency tables an evaluation sends anyway)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
from flwr.common import NDArrays, Scalar

from fedapp.config.run import RunConfig
from fedapp.datasets.local import LocalData
from fedapp.metrics.contingency import contingency_table, encode_table
from fedapp.privacy.secagg import SUM, secure_upload
from fedapp.report.keep import (
    CANDIDATE_SUMS_KEY,
    FINAL_TABLE_KEY,
    LABELS_BY_KEY,
    START_ARRAYS_KEY,
    START_TABLE_KEY,
    candidate_sums,
    decode_candidate_sums,
    encode_candidate_sums,
    secure_candidate_arrays,
)
from fedapp.report.stages import SCALE_KEY, Assignment

Reply = tuple[float, int, dict[str, Scalar]]


class ChoosingClient(Protocol):
    """What the choice needs of its client (`clients.base.ClusteringClient`)."""

    cfg: RunConfig
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


def secure_score_candidates(
    client: ChoosingClient, parameters: NDArrays, config: dict[str, Scalar]
) -> tuple[NDArrays, int, dict[str, Scalar]]:
    """The same scoring as a SecAgg+ fit reply: the sums masked (the server learns their totals); the
    contingency tables stay in the metrics, as an evaluation's do."""
    scale = float(config.get(SCALE_KEY, 1.0))  # type: ignore[arg-type]
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"model choice scale {scale!r} is not a positive number")
    _, rows, metrics = score_candidates(client, parameters, config)
    arrays = secure_candidate_arrays(decode_candidate_sums(metrics.pop(CANDIDATE_SUMS_KEY)), scale)
    masked, extra = secure_upload(arrays, [SUM] * len(arrays), rows, client.cfg.secagg_clip)
    return masked, rows, {**metrics, **extra}
