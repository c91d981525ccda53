"""Client side of choosing k (`fedapp.app.k_selection`): round A's floored local centres, round B's
per-candidate sums, plainly (an evaluate reply) or for SecAgg+ (a fit reply whose arrays are masked); a
vertical party's choice on its own view."""

from __future__ import annotations

import json
from typing import Protocol

import numpy as np
from flwr.common import NDArrays, Scalar

from fedapp.app.k_selection import (
    CANDIDATE_KS_KEY,
    CENTRES_KEY,
    LABELLED_KEY,
    LOCAL_K_KEY,
    PHASE_CENTRES,
    PHASE_STATISTICS,
    PHASE_VIEW,
    SCALE_KEY,
    SELECT_KEY,
    SIZES_KEY,
    SPLITS_KEY,
    SQUARES_KEY,
    STATISTICS_KEY,
    VIEW_SELECTION_KEY,
    candidates_from_arrays,
    selection_rows,
    selection_space,
    statistics_to_arrays,
)
from fedapp.config.run import RunConfig
from fedapp.datasets.local import LocalData
from fedapp.features.embeddings import EmbeddingCache
from fedapp.maths.selection import candidate_statistics, local_summary, select_k
from fedapp.privacy.secagg import SUM, secure_upload
from fedapp.wire import encode_array, encode_arrays


class SelectingClient(Protocol):
    """What the selection needs of its client (`clients.base.ClusteringClient`)."""

    cfg: RunConfig
    data: LocalData
    partition_id: int
    seed: int
    floor: int

    def identity_metrics(self) -> dict[str, Scalar]: ...

    def embedding_cache(self) -> EmbeddingCache: ...


def _rows(client: SelectingClient) -> np.ndarray:
    """The client's rows in the selection space (text: embedded once, in its node's embedding cache)."""
    cache = client.embedding_cache() if selection_space(client.cfg) == "embeddings" else None
    return selection_rows(client.cfg, client.data, client.partition_id, cache)


def selection_reply(
    client: SelectingClient, parameters: NDArrays, config: dict[str, Scalar]
) -> tuple[float, int, dict[str, Scalar]]:
    """Round A or B as an evaluate reply (no SecAgg+)."""
    metrics: dict[str, Scalar] = dict(client.identity_metrics())
    phase = config.get(SELECT_KEY)
    if phase == PHASE_CENTRES:
        if client.data.labelled:  # k = the classes: nothing of the data is needed
            return 0.0, client.data.n_samples, {**metrics, LABELLED_KEY: client.data.n_classes}
        k_local = int(config.get(LOCAL_K_KEY, client.cfg.k_max))  # type: ignore[arg-type]
        if k_local < 1:
            raise ValueError(f"k-selection local k' {k_local} is not positive")
        centres, sizes, squares = local_summary(_rows(client), k_local, client.seed, client.floor)
        metrics[CENTRES_KEY] = encode_array(centres)
        metrics[SIZES_KEY] = encode_array(np.asarray(sizes, dtype=np.int64))
        metrics[SQUARES_KEY] = squares  # with the centres and sizes: the spread around them (the null's)
    elif phase == PHASE_STATISTICS:
        metrics[STATISTICS_KEY] = encode_arrays(*_statistics(client, parameters, config, 1.0))
    elif phase == PHASE_VIEW:  # vertical: this party chooses on its own view of every record
        if client.data.labelled:
            return 0.0, client.data.n_samples, {**metrics, LABELLED_KEY: client.data.n_classes}
        cfg = client.cfg
        selection, _ = select_k(
            [_rows(client)], cfg.k_min, cfg.k_max, cfg.seed, client.floor, cfg.k_rule, extend=cfg.k_extend
        )
        metrics[VIEW_SELECTION_KEY] = json.dumps(selection.to_json())
    else:
        raise ValueError(f"unknown k-selection phase {phase!r}")
    return 0.0, client.data.n_samples, metrics


def secure_selection_reply(
    client: SelectingClient, parameters: NDArrays, config: dict[str, Scalar]
) -> tuple[NDArrays, int, dict[str, Scalar]]:
    """Round B as a fit reply for SecAgg+: every array is a sum, masked; the server learns its total."""
    if config.get(SELECT_KEY) != PHASE_STATISTICS:
        raise ValueError(f"k-selection phase {config.get(SELECT_KEY)!r} does not go through SecAgg+")
    scale = float(config.get(SCALE_KEY, 1.0))  # type: ignore[arg-type]
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"k-selection scale {scale!r} is not a positive number")
    arrays = _statistics(client, parameters, config, scale)
    rows = client.data.n_samples  # SecAgg+'s weight, in the clear as in every secure round
    masked, extra = secure_upload(arrays, [SUM] * len(arrays), rows, client.cfg.secagg_clip)
    return masked, rows, {**client.identity_metrics(), **extra}


def _statistics(
    client: SelectingClient, parameters: NDArrays, config: dict[str, Scalar], scale: float
) -> list[np.ndarray]:
    candidates, pairs = candidates_from_arrays(
        parameters, config.get(CANDIDATE_KS_KEY), config.get(SPLITS_KEY, 0)
    )
    stats = candidate_statistics(_rows(client), candidates, client.floor, pairs)
    return statistics_to_arrays(stats, scale)
