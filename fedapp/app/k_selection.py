"""Choosing k without labels as two Flower messages before a method's first round (`fedapp.maths.selection`
holds the maths): which runs may, in what space, and what the messages carry.

Shared by the preflight checks, the clients (`clients/select_k.py`), the strategies (`strategies/k_choice.py`)
and `fedapp tune` (`simulation/tune.py`), so a dry run refuses exactly what a run would and every side
reads the same wire form:

- round A (evaluate, `SELECT_KEY` = `PHASE_CENTRES`, `LOCAL_K_KEY` = k'): a client with labels answers
  only `LABELLED_KEY` (k is then the number of classes, as without selection); any other sends its
  floored local centres and their sizes (`CENTRES_KEY`, `SIZES_KEY`) and its sum of squared norms
  (`SQUARES_KEY`, one number: with them the server has the spread around the centres, for the null).
  Under SecAgg+ too: they are means of at least the privacy floor of records, the k-FED baseline's
  message, not a sum.
- round B (`PHASE_STATISTICS`): the server sends every candidate's centres and every split pair's two
  centre sets stacked (`candidates_to_arrays`); each client returns, per candidate, counts, feature sums,
  distance and squared-distance sums, the silhouette sum and its row count, and the split pairs'
  contingency tables (`statistics_to_arrays`). All are sums: plainly in an evaluate reply's metrics, or
  masked by SecAgg+ in a fit message (`secagg = true`), where the server learns only totals.
- a choice on the top of the range extends it (`fedapp.maths.selection.KSearch`): rounds A and B again
  with k-max doubled, for the new candidates only.
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
from typing import Any

import numpy as np

from fedapp.config.run import ConfigError, RunConfig
from fedapp.datasets import PARTITION_PLACEHOLDER
from fedapp.datasets.local import LocalData
from fedapp.features.embeddings import EmbeddingCache
from fedapp.maths.selection import CandidateStats, view_consensus
from fedapp.methods import method_spec
from fedapp.metrics.label_free import ClusterSums, DistanceSums
from fedapp.wire import ReplyError

SELECT_KEY = "select-k"  # message config: this message is k selection's round A or B
PHASE_CENTRES, PHASE_STATISTICS = "centres", "statistics"
PHASES = (PHASE_CENTRES, PHASE_STATISTICS)
PHASE_VIEW = "view"  # vertical: one round, each party chooses on its own view (`view_consensus`)
VIEW_SELECTION_KEY = "select-k-view"  # its reply: the party's `Selection.to_json()` as JSON text
CANDIDATE_KS_KEY = "select-k-candidates"  # round B config: the candidates' k, comma-separated
SPLITS_KEY = "select-k-splits"  # round B config: split pairs per candidate (their centres follow)
LOCAL_K_KEY = "select-k-local"  # round A config: the local k' of this pass (`fedapp.maths.selection.local_k`)
SCALE_KEY = "select-k-scale"  # round B under SecAgg+: the public factor on the sums (retries shrink it)
CHOSEN_K_KEY = "chosen-k"  # every message after the choice: the k the run uses
LABELLED_KEY = "select-k-labelled"  # round A reply of a client with labels (value: its classes)
CENTRES_KEY, SIZES_KEY = "select-k-centres", "select-k-sizes"  # round A reply (encoded arrays)
SQUARES_KEY = "select-k-squares"  # round A reply: the client's sum of squared norms (the null's spread)
STATISTICS_KEY = "select-k-statistics"  # round B plain reply (`fedapp.wire.encode_arrays`)
SELECTION_MAX_LENGTH = 32  # encoder input length in tokens: FSBERT's, FSTC's and FSCCL's default


def selection_space(cfg: RunConfig) -> str:
    """ "embeddings" (text methods: their sentence embeddings) or "features" (every other method; a
    vertical party: its own view); a one-line ConfigError for a run that cannot choose k."""
    spec = method_spec(cfg.method)
    if spec.own_k:
        raise ConfigError(
            f"method '{cfg.method}' chooses no k: its number of topics is its own key "
            f"({cfg.method}.topics), not run-config k"
        )
    if not spec.federated:
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


def views_outcome(views: dict[str, dict[str, Any]], rule: str) -> dict[str, Any]:
    """Vertical federations: the parties' own selections (each `Selection.to_json()`, by partition) and
    the run's k, their rounded mean (`view_consensus`); strong only where every party's choice is."""
    chosen = view_consensus([int(view["chosen_k"]) for view in views.values()])
    weak = sorted(pid for pid, view in views.items() if view.get("confidence", {}).get("verdict") != "strong")
    confidence = {
        "verdict": "weak" if weak else "strong",
        "why": f"weak on the view of party {', '.join(weak)}" if weak else "every party's choice is strong",
        "choices": {pid: int(view["chosen_k"]) for pid, view in views.items()},
    }
    return {
        "rule": f"rounded mean of the parties' {rule} choices",
        "chosen_k": chosen,
        "confidence": confidence,
        "views": views,
    }


# ------------------------------------------------------------------------------------------ wire forms
Pairs = dict[int, list[tuple[np.ndarray, np.ndarray]]]


def candidates_to_arrays(
    candidates: dict[int, np.ndarray], pairs: Pairs
) -> tuple[list[np.ndarray], str, int]:
    """Round B's parameters (every candidate's centres stacked in k order, then every candidate's split
    pairs, first and second set, float32: they only assign rows) and its config values."""
    ks = sorted(candidates)
    splits = len(pairs[ks[0]]) if ks and pairs else 0
    stacked_pairs = [c for k in ks for pair in pairs.get(k, []) for c in pair]
    arrays = [np.concatenate([candidates[k] for k in ks])]
    if splits:
        arrays.append(np.concatenate(stacked_pairs).astype(np.float32))
    return arrays, ",".join(str(k) for k in ks), splits


def candidates_from_arrays(
    arrays: Sequence[np.ndarray], ks_text: object, splits: object = 0
) -> tuple[dict[int, np.ndarray], Pairs]:
    """The inverse of `candidates_to_arrays`; ValueError for a message that does not fit it."""
    try:
        ks = [int(k) for k in str(ks_text).split(",")]
        splits = int(splits)  # type: ignore[call-overload]
    except ValueError:
        raise ValueError(f"candidate list {ks_text!r} / splits {splits!r} are not integers") from None
    expected = 2 if splits else 1
    if (
        len(arrays) != expected
        or arrays[0].ndim != 2
        or arrays[0].shape[0] != sum(ks)
        or min(ks) < 1
        or splits < 0
        or (splits and arrays[1].shape != (2 * splits * sum(ks), arrays[0].shape[1]))
    ):
        raise ValueError(
            f"candidate centres {[a.shape for a in arrays]} do not hold k = {ks}, {splits} splits"
        )
    bounds = np.cumsum([0, *ks])
    stacked = np.asarray(arrays[0], dtype=np.float64)
    candidates = {k: stacked[start:end] for k, start, end in zip(ks, bounds[:-1], bounds[1:], strict=True)}
    pairs: Pairs = {}
    if splits:
        pair_rows = np.asarray(arrays[1], dtype=np.float64)
        offset = 0
        for k in ks:
            sets = [pair_rows[offset + i * k : offset + (i + 1) * k] for i in range(2 * splits)]
            pairs[k] = [(sets[2 * i], sets[2 * i + 1]) for i in range(splits)]
            offset += 2 * splits * k
    return candidates, pairs


def statistics_to_arrays(stats: dict[int, CandidateStats], scale: float = 1.0) -> list[np.ndarray]:
    """Round B's sums, in candidate order: counts (sum of k), feature sums (sum of k, D), distance and
    squared-distance sums (sum of k), per candidate (silhouette sum, rows), and the split pairs'
    contingency tables flattened (sum of splits x k x k). The sums of values (not the counts, silhouette,
    rows or tables) are multiplied by `scale`."""
    ks = sorted(stats)
    return [
        np.concatenate([stats[k].sums.counts for k in ks]).astype(np.float64),
        np.concatenate([stats[k].sums.sums for k in ks]) * scale,
        np.concatenate([stats[k].distances.distance_sums for k in ks]) * scale,
        np.concatenate([stats[k].distances.squared_sums for k in ks]) * scale,
        np.array([[stats[k].distances.silhouette_sum, stats[k].distances.n] for k in ks], dtype=np.float64),
        np.concatenate([stats[k].agreement.ravel() for k in ks]).astype(np.float64),
    ]


def statistics_from_arrays(
    arrays: Sequence[np.ndarray],
    ks: Sequence[int],
    dims: int,
    splits: int,
    scale: float = 1.0,
    rounded: bool = False,
) -> dict[int, CandidateStats]:
    """The inverse of `statistics_to_arrays` (a client's reply or the secure totals, `rounded` to whole
    counts; a candidate's row count is then its rounded counts' sum, so the two agree); ReplyError for
    arrays that are not these statistics."""
    total = sum(ks)
    tables = sum(splits * k * k for k in ks)
    shapes = [(total,), (total, dims), (total,), (total,), (len(ks), 2), (tables,)]
    if len(arrays) != len(shapes) or [tuple(np.shape(a)) for a in arrays] != shapes:
        raise ReplyError(f"selection statistics of shapes {[np.shape(a) for a in arrays]}, expected {shapes}")
    counts, sums, distances, squared, per_k, agreement = (np.asarray(a, dtype=np.float64) for a in arrays)
    if not all(np.isfinite(a).all() for a in (counts, sums, distances, squared, per_k, agreement)):
        raise ReplyError("selection statistics hold a non-finite value")
    bounds = np.cumsum([0, *ks])
    if rounded:
        counts, per_k, agreement = np.rint(counts), per_k.copy(), np.maximum(np.rint(agreement), 0.0)
        per_k[:, 1] = [counts[start:end].sum() for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
    if (counts < 0).any() or (counts != np.rint(counts)).any() or (per_k[:, 1] < 0).any():
        raise ReplyError("selection statistics hold a negative or fractional count")
    if (agreement < 0).any() or (agreement != np.rint(agreement)).any():
        raise ReplyError("selection contingency tables hold a negative or fractional count")
    out = {}
    table_offset = 0
    for index, (k, start, end) in enumerate(zip(ks, bounds[:-1], bounds[1:], strict=True)):
        size = splits * k * k
        out[k] = CandidateStats(
            ClusterSums(counts[start:end].astype(np.int64), sums[start:end] / scale),
            DistanceSums(
                np.maximum(distances[start:end] / scale, 0.0),
                np.maximum(squared[start:end] / scale, 0.0),
                float(per_k[index, 0]),
                int(per_k[index, 1]),
            ),
            agreement[table_offset : table_offset + size].reshape(splits, k, k).astype(np.int64),
        )
        table_offset += size
    return out
