"""Choosing k without labels as two Flower messages before a method's first round (`fedapp.maths.selection`
holds the maths): which runs may, in what space, and what the messages carry.

Shared by the preflight checks, the clients (`clients/select_k.py`), the strategies (`strategies/k_choice.py`)
and `fedapp tune` (`simulation/tune.py`), so a dry run refuses exactly what a run would and every side
reads the same wire form:

- round A (evaluate, `SELECT_KEY` = `PHASE_CENTRES`): a client with labels answers only `LABELLED_KEY`
  (k is then the number of classes, as without selection); any other sends its floored local centres and
  their sizes (`CENTRES_KEY`, `SIZES_KEY`). Under SecAgg+ too: they are means of at least the privacy floor
  of records, the k-FED baseline's message, not a sum.
- round B (`PHASE_STATISTICS`): the server sends every candidate's centres stacked (`candidates_to_arrays`);
  each client returns, per candidate, counts, feature sums, distance and squared-distance sums, the
  silhouette sum and its row count (`statistics_to_arrays`). All are sums: plainly in an evaluate reply's
  metrics, or masked by SecAgg+ in a fit message (`secagg = true`), where the server learns only totals.
- vertical methods (every party holds all records, one view each) take one round instead
  (`PHASE_VIEW`): each party runs the selection on its own view alone and returns its criteria table and
  choice (`VIEW_SELECTION_KEY`, numbers per candidate k, nothing per record); the server takes the
  rounded mean of the parties' choices (`fedapp.maths.selection.view_consensus`).
- after the choice, every message of the run carries `CHOSEN_K_KEY` in its config, and a client whose run
  config says k = 0 takes it from there (`fedapp.app.managed_client`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedapp.config.run import ConfigError, RunConfig
from fedapp.datasets import PARTITION_PLACEHOLDER
from fedapp.datasets.local import LocalData
from fedapp.features.embeddings import EmbeddingCache
from fedapp.maths.selection import CandidateStats
from fedapp.methods import method_spec
from fedapp.metrics.label_free import ClusterSums, DistanceSums
from fedapp.wire import ReplyError

SELECT_KEY = "select-k"  # message config: this message is k selection's round A or B
PHASE_CENTRES, PHASE_STATISTICS = "centres", "statistics"
PHASES = (PHASE_CENTRES, PHASE_STATISTICS)
PHASE_VIEW = "view"  # vertical: one round, each party chooses on its own view (`view_consensus`)
VIEW_SELECTION_KEY = "select-k-view"  # its reply: the party's `Selection.to_json()` as JSON text
CANDIDATE_KS_KEY = "select-k-candidates"  # round B config: the candidates' k, comma-separated
SCALE_KEY = "select-k-scale"  # round B under SecAgg+: the public factor on the sums (retries shrink it)
CHOSEN_K_KEY = "chosen-k"  # every message after the choice: the k the run uses
LABELLED_KEY = "select-k-labelled"  # round A reply of a client with labels (value: its classes)
CENTRES_KEY, SIZES_KEY = "select-k-centres", "select-k-sizes"  # round A reply (encoded arrays)
STATISTICS_KEY = "select-k-statistics"  # round B plain reply (`fedapp.wire.encode_arrays`)
SELECTION_MAX_LENGTH = 32  # encoder input length in tokens: FSBERT's, FSTC's and FSCCL's default


def selection_space(cfg: RunConfig) -> str:
    """ "embeddings" (text methods: their sentence embeddings) or "features" (every other method; a
    vertical party: its own view); a one-line ConfigError for a run that cannot choose k."""
    spec = method_spec(cfg.method)
    if spec.own_k or not spec.federated:
        raise ConfigError(f"k = 0 without labels: method '{cfg.method}' has no federated k selection; set k")
    if cfg.dp.epsilon > 0:
        raise ConfigError(
            f"k = 0 without labels and dp.epsilon={cfg.dp.epsilon:g}: the selection's local centres and "
            "sums are not noised; set k"
        )
    return "embeddings" if "texts" in spec.modalities and "vectors" not in spec.modalities else "features"


def may_select(cfg: RunConfig) -> bool:
    """A run whose k is open: k = 0 on own files (whose labels, if any, only the clients see) for a
    method that takes run-config k. Registered datasets are labelled: their k is the classes."""
    spec = method_spec(cfg.method)
    return not cfg.k and cfg.own_data and spec.federated and not spec.own_k


def selection_rows(
    cfg: RunConfig, local: LocalData, partition_id: int, cache: EmbeddingCache | None = None
) -> np.ndarray:
    """One client's rows in the selection space (float64): its sentence embeddings for text methods (in
    `cache`, its node's embedding cache; None: the one `node-out-dir` names), else its features."""
    if selection_space(cfg) == "features":
        return np.asarray(local.features, dtype=np.float64)
    from fedapp.features.texts import embedding_cache, local_embeddings

    if cache is None:
        node_dir = Path(cfg.node_out_dir.replace(PARTITION_PLACEHOLDER, str(partition_id)))
        cache = embedding_cache(
            cfg.embedding_cache, own_data=cfg.own_data, node_dir=node_dir, partition_id=partition_id
        )
    vectors = local_embeddings(local, cfg.embedding_model, SELECTION_MAX_LENGTH, cfg.device, cache)
    return np.asarray(vectors, dtype=np.float64)


# ------------------------------------------------------------------------------------------ wire forms
def candidates_to_arrays(candidates: dict[int, np.ndarray]) -> tuple[list[np.ndarray], str]:
    """Round B's parameters (every candidate's centres stacked in k order) and its config value."""
    ks = sorted(candidates)
    return [np.concatenate([candidates[k] for k in ks])], ",".join(str(k) for k in ks)


def candidates_from_arrays(arrays: Sequence[np.ndarray], ks_text: object) -> dict[int, np.ndarray]:
    """The inverse of `candidates_to_arrays`; ValueError for a message that does not fit it."""
    try:
        ks = [int(k) for k in str(ks_text).split(",")]
    except ValueError:
        raise ValueError(f"candidate list {ks_text!r} is not comma-separated integers") from None
    if len(arrays) != 1 or arrays[0].ndim != 2 or arrays[0].shape[0] != sum(ks) or min(ks) < 1:
        raise ValueError(f"candidate centres {[a.shape for a in arrays]} do not hold k = {ks}")
    bounds = np.cumsum([0, *ks])
    stacked = np.asarray(arrays[0], dtype=np.float64)
    return {k: stacked[start:end] for k, start, end in zip(ks, bounds[:-1], bounds[1:], strict=True)}


def statistics_to_arrays(stats: dict[int, CandidateStats], scale: float = 1.0) -> list[np.ndarray]:
    """Round B's sums, in candidate order: counts (sum of k), feature sums (sum of k, D), distance and
    squared-distance sums (sum of k), and per candidate (silhouette sum, rows). The sums of values
    (not the counts, silhouette or rows) are multiplied by `scale`."""
    ks = sorted(stats)
    return [
        np.concatenate([stats[k].sums.counts for k in ks]).astype(np.float64),
        np.concatenate([stats[k].sums.sums for k in ks]) * scale,
        np.concatenate([stats[k].distances.distance_sums for k in ks]) * scale,
        np.concatenate([stats[k].distances.squared_sums for k in ks]) * scale,
        np.array([[stats[k].distances.silhouette_sum, stats[k].distances.n] for k in ks], dtype=np.float64),
    ]


def statistics_from_arrays(
    arrays: Sequence[np.ndarray], ks: Sequence[int], dims: int, scale: float = 1.0, rounded: bool = False
) -> dict[int, CandidateStats]:
    """The inverse of `statistics_to_arrays` (a client's reply or the secure totals, `rounded` to whole
    counts); ReplyError for arrays that are not these statistics."""
    total = sum(ks)
    shapes = [(total,), (total, dims), (total,), (total,), (len(ks), 2)]
    if len(arrays) != len(shapes) or [tuple(np.shape(a)) for a in arrays] != shapes:
        raise ReplyError(f"selection statistics of shapes {[np.shape(a) for a in arrays]}, expected {shapes}")
    counts, sums, distances, squared, per_k = (np.asarray(a, dtype=np.float64) for a in arrays)
    if not all(np.isfinite(a).all() for a in (counts, sums, distances, squared, per_k)):
        raise ReplyError("selection statistics hold a non-finite value")
    if rounded:
        counts, per_k = counts.copy(), per_k.copy()
        counts, per_k[:, 1] = np.rint(counts), np.rint(per_k[:, 1])
    if (counts < 0).any() or (counts != np.rint(counts)).any() or (per_k[:, 1] < 0).any():
        raise ReplyError("selection statistics hold a negative or fractional count")
    bounds = np.cumsum([0, *ks])
    out = {}
    for index, (k, start, end) in enumerate(zip(ks, bounds[:-1], bounds[1:], strict=True)):
        out[k] = CandidateStats(
            ClusterSums(counts[start:end].astype(np.int64), sums[start:end] / scale),
            DistanceSums(
                np.maximum(distances[start:end] / scale, 0.0),
                np.maximum(squared[start:end] / scale, 0.0),
                float(per_k[index, 0]),
                int(per_k[index, 1]),
            ),
        )
    return out
