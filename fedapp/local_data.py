"""What one client holds: its partition of a registered dataset, resolved from the run config.

Every client derives its partition from the same seeded partitioner, so in simulation the union of the
clients' data is exactly the dataset (nothing is shared: each client computes only its own indices). In
a real deployment each SuperNode would load its own files instead; this module is the single place that
maps (run config, partition id) to local arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fedapp.config import RunConfig
from fedapp.datasets import Dataset, load_dataset, resolve_data_dir
from fedapp.partition import partition_indices, vertical_view
from fedapp.preprocessing import scale_view


@dataclass(frozen=True)
class LocalData:
    """A client's samples (row-aligned features and labels) and the global class count."""

    features: np.ndarray
    labels: np.ndarray
    n_classes: int
    indices: np.ndarray

    @property
    def n_samples(self) -> int:
        return int(self.labels.shape[0])


def load_run_dataset(cfg: RunConfig) -> Dataset:
    """The dataset named by the run config (cached by the data registry)."""
    return load_dataset(
        cfg.dataset, resolve_data_dir(cfg.data_dir or None), seed=cfg.seed, max_samples=cfg.max_samples
    )


def local_partition(cfg: RunConfig, partition_id: int, num_partitions: int) -> LocalData:
    """This client's horizontal partition (vector features: a multi-view set's views concatenated),
    scaled by the client on its own rows per `cfg.scaling` ("none" keeps the dataset's arrays as they are)."""
    return _local_partition(
        cfg.dataset,
        cfg.data_dir,
        cfg.seed,
        cfg.max_samples,
        cfg.partition,
        cfg.p,
        cfg.ratio,
        cfg.alpha,
        cfg.scaling,
        partition_id,
        num_partitions,
    )


@lru_cache(maxsize=16)
def _local_partition(
    dataset: str,
    data_dir: str,
    seed: int,
    max_samples: int,
    scheme: str,
    p: float,
    ratio: str,
    alpha: float,
    scaling: str,
    partition_id: int,
    num_partitions: int,
) -> LocalData:
    # Cached: Flower rebuilds the client every round, and a Ray actor may host several virtual clients.
    data = load_dataset(dataset, resolve_data_dir(data_dir or None), seed=seed, max_samples=max_samples)
    if data.features is None:
        raise ValueError(f"dataset '{dataset}' has no vector features (kind '{data.kind}')")
    parts = partition_indices(data.y, num_partitions, scheme, seed=seed, p=p, ratio=ratio, alpha=alpha)
    idx = parts[partition_id]
    features = data.features[idx] if scaling == "none" else scale_view(data.features[idx], scaling)
    return LocalData(features, data.y[idx], data.n_classes, idx)


def local_view(cfg: RunConfig, partition_id: int, num_partitions: int) -> LocalData:
    """Vertical federation: view `partition_id` of every sample, scaled per `cfg.scaling`.

    Labels come along only for evaluation by the label holder (partition 0); they never leave the client.
    """
    return _local_view(
        cfg.dataset, cfg.data_dir, cfg.seed, cfg.max_samples, cfg.scaling, partition_id, num_partitions
    )


@lru_cache(maxsize=16)
def _local_view(
    dataset: str,
    data_dir: str,
    seed: int,
    max_samples: int,
    scaling: str,
    partition_id: int,
    num_partitions: int,
) -> LocalData:
    data = load_dataset(dataset, resolve_data_dir(data_dir or None), seed=seed, max_samples=max_samples)
    view = scale_view(vertical_view(views_of(data), partition_id, num_partitions), scaling)
    return LocalData(view, data.y, data.n_classes, np.arange(data.n_samples))


def views_of(data: Dataset) -> tuple[np.ndarray, ...]:
    """The views of a multi-view dataset; a clear error for any other kind."""
    if data.views is None:
        raise ValueError(
            f"dataset '{data.name}' has no views (kind '{data.kind}'); vertical methods need a multi-view "
            "dataset such as hw, bdgp, drybean, digits-mv or mat:<path>"
        )
    return data.views


def client_seed(seed: int, partition_id: int) -> int:
    """A per-client seed derived from the run seed: reproducible, and different across clients."""
    return int(np.random.SeedSequence([seed, partition_id]).generate_state(1)[0])
