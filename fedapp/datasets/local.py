"""What one client holds, resolved from the run config: its partition of a dataset, or its own file.

Two ways to hold data:

- a partition: every client derives its rows from the same seeded partitioner over one dataset (a
  registered name, `mat:`, or a single own file), so in simulation the union of the clients' data is
  exactly the dataset (nothing is shared: each client computes only its own indices);
- its own file: a source spec with a `{partition-id}` placeholder (simulation), or a `dataset` in the
  node's own config (deployment): the client reads that file whole, and nothing else.

This module is the single place that maps (run config, partition id) to local arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np

from fedapp.config.run import RunConfig
from fedapp.datasets import (
    Columns,
    Dataset,
    DatasetError,
    has_placeholder,
    load_dataset,
    resolve_data_dir,
)
from fedapp.datasets.node_cache import cached_source, entry_stem
from fedapp.datasets.partition import partition_indices, vertical_view
from fedapp.datasets.preprocessing import scale_view
from fedapp.datasets.sources import source_path, substituted
from fedapp.datasets.streaming import stream_source, streams
from fedapp.methods import method_spec


@dataclass(frozen=True, eq=False)
class LocalData:
    """A client's rows of a dataset, in whatever form its method reads them.

    `features` (vector methods), `images()` (conv nets) and `texts` (text methods) are the same rows
    `indices` of the dataset, computed on first use: a CCFC client on CIFAR-10 never flattens images, an
    FSTC client never asks for features. `view` is set for vertical federations (all rows, one view).
    """

    dataset: Dataset
    indices: np.ndarray
    scaling: str = "none"
    view: int | None = None

    @property
    def n_samples(self) -> int:
        return int(len(self.indices))

    @property
    def n_classes(self) -> int:
        return self.dataset.n_classes

    @property
    def labelled(self) -> bool:
        """Whether this data has ground truth (own files may not: label-free metrics only)."""
        return self.dataset.labelled

    @cached_property
    def whole(self) -> bool:
        """Whether these rows are the whole dataset in order (an own file): its arrays serve as they are,
        a memory-mapped file stays mapped instead of being copied."""
        n = self.dataset.n_samples
        return len(self.indices) == n and bool(np.all(self.indices == np.arange(n)))

    @cached_property
    def ids(self) -> list[str]:
        """Each row's record id, as read (own files), else its row number in the dataset."""
        if self.dataset.ids is not None:
            return list(self.dataset.ids) if self.whole else [self.dataset.ids[i] for i in self.indices]
        return [str(i) for i in self.indices.tolist()]

    @property
    def id_values(self) -> list[str] | np.ndarray:
        """`ids` as the report writes them: row numbers as their integer array (no Python strings)."""
        return self.ids if self.dataset.ids is not None else self.indices

    @cached_property
    def labels(self) -> np.ndarray:
        """Ground truth for evaluation only: never leaves the client (contingency tables do)."""
        return self.dataset.y[self.indices]

    @cached_property
    def features(self) -> np.ndarray:
        """N_local x D vectors, scaled by this client per `scaling` ("none": the dataset's own values)."""
        if self.view is not None:
            rows = self.dataset.views[self.view] if self.dataset.views is not None else None
        else:
            features = self.dataset.features
            rows = None if features is None else features if self.whole else features[self.indices]
        if rows is None:
            raise ValueError(
                f"dataset '{self.dataset.name}' has no vector features (kind '{self.dataset.kind}')"
            )
        return rows if self.scaling == "none" and self.view is None else scale_view(rows, self.scaling)

    def images(self) -> np.ndarray:
        """N_local x C x H x W float images in [0, 1] (a fresh array: callers may modify it)."""
        return self.dataset.unit_images(self.indices)

    @property
    def texts(self) -> list[str]:
        if self.dataset.texts is None:
            raise ValueError(f"dataset '{self.dataset.name}' has no texts (kind '{self.dataset.kind}')")
        return [self.dataset.texts[i] for i in self.indices]


def columns_of(cfg: RunConfig) -> Columns:
    """The own-data column keys of a run (or of a node, whose node config may override them)."""
    return Columns.parse(cfg.text_column, cfg.label_column, cfg.id_column, cfg.feature_columns)


def expected_kind(method: str) -> str | None:
    """ "texts" for a text-only method, so that a table without the text column is that error (not "no
    numeric columns"); None otherwise (`check_kind` then checks what the file gave)."""
    modalities = method_spec(method).modalities
    if "texts" in modalities and not {"vectors", "multiview", "images"} & set(modalities):
        return "texts"
    return None


def load_run_dataset(cfg: RunConfig, partition_id: int | None = None) -> Dataset:
    """The dataset named by the run config (cached by the data registry); for a spec with a
    `{partition-id}`, client `partition_id`'s file."""
    if cfg.own_data:
        data = load_dataset(
            cfg.dataset,
            seed=cfg.seed,
            max_samples=cfg.max_samples,
            imbalance=cfg.imbalance,
            columns=columns_of(cfg),
            partition_id=partition_id if has_placeholder(cfg.dataset) else None,
            expect_kind=expected_kind(cfg.method),
        )
        check_kind(data, cfg)
        return data
    return RegisteredData.of(cfg).load()


def check_kind(data: Dataset, cfg: RunConfig) -> None:
    """An own file of a kind the method cannot read is the file's error (one line naming it)."""
    expected = expected_kind(cfg.method)
    accepted = method_spec(cfg.method).modalities
    vertical_ok = data.kind == "vectors" and "multiview" in accepted
    if data.kind not in accepted and not vertical_ok:
        hint = f"; set text-column (now '{cfg.text_column}')" if expected == "texts" else ""
        raise DatasetError(
            f"{data.name}: method '{cfg.method}' needs {' or '.join(accepted)}, "
            f"this file gives {data.kind}{hint}"
        )


def owns_file(cfg: RunConfig) -> bool:
    """Whether a client reads a whole file of its own instead of a partition of a shared dataset: its node
    config named one, or the spec has a `{partition-id}`."""
    return cfg.node.own_file or (cfg.own_data and has_placeholder(cfg.dataset))


def own_file(cfg: RunConfig, partition_id: int, cache_root: Path | None = None) -> LocalData:
    """Every row of this client's own file, scaled per `cfg.scaling`; with a `cache_root` (the node's
    private cache, `fedapp.datasets.node_cache`) a vector file is parsed once and memory-mapped after."""
    if cache_root is None or cfg.max_samples or cfg.imbalance:
        data = load_run_dataset(cfg, partition_id)
    else:
        spec = cfg.dataset
        pid = partition_id if has_placeholder(spec) else None
        path = source_path(spec, pid)
        state = (path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else ()
        data = _node_cached(spec, columns_of(cfg), pid, state, expected_kind(cfg.method), cache_root)
        check_kind(data, cfg)
    return LocalData(data, np.arange(data.n_samples), cfg.scaling)


@lru_cache(maxsize=16)  # in one process (in-process engine, a Ray actor) a file is hashed once
def _node_cached(
    spec: str,
    columns: Columns,
    pid: int | None,
    state: tuple[int, ...],
    expect_kind: str | None,
    root: Path,
) -> Dataset:
    def read() -> Dataset:  # what `load_run_dataset` reads for an own file (the registry's cache first)
        return load_dataset(spec, columns=columns, partition_id=pid, expect_kind=expect_kind)

    def stream(features: Path) -> Dataset:  # a large vector file, batch by batch into the entry
        return stream_source(spec, columns, pid, features, expect_kind)

    if not state:  # not a file (an image folder, or missing: reading gives the error)
        return read()
    stem, name = entry_stem(spec, columns, pid, expect_kind), substituted(spec, pid)
    return cached_source(root, stem, name, read, stream if streams(spec, columns, pid, expect_kind) else None)


def local_partition(cfg: RunConfig, partition_id: int, num_partitions: int) -> LocalData:
    """This client's horizontal partition (vector features: a multi-view set's views concatenated),
    scaled by the client on its own rows per `cfg.scaling` ("none" keeps the dataset's arrays as they are)."""
    scheme = PartitionScheme.of(cfg, num_partitions)
    if cfg.own_data:
        data = load_run_dataset(cfg)
        return LocalData(data, _parts_of(data, scheme)[partition_id], cfg.scaling)
    return _local_partition(RegisteredData.of(cfg), scheme, cfg.scaling, partition_id)


@dataclass(frozen=True)
class RegisteredData:
    """Which registered dataset a run loads (hashable: the key of the per-process caches below)."""

    dataset: str
    data_dir: str
    seed: int
    max_samples: int
    imbalance: float

    @classmethod
    def of(cls, cfg: RunConfig) -> RegisteredData:
        return cls(cfg.dataset, cfg.data_dir, cfg.seed, cfg.max_samples, cfg.imbalance)

    def load(self) -> Dataset:
        return load_dataset(
            self.dataset,
            resolve_data_dir(self.data_dir or None),
            seed=self.seed,
            max_samples=self.max_samples,
            imbalance=self.imbalance,
        )


@dataclass(frozen=True)
class PartitionScheme:
    """How a run splits a dataset's rows over its clients (hashable, like `RegisteredData`)."""

    scheme: str
    num_partitions: int
    seed: int
    p: float
    ratio: str
    alpha: float

    @classmethod
    def of(cls, cfg: RunConfig, num_partitions: int) -> PartitionScheme:
        return cls(cfg.partition, num_partitions, cfg.seed, cfg.p, cfg.ratio, cfg.alpha)

    def split(self, labels: np.ndarray | None) -> tuple[np.ndarray, ...]:
        """Every client's row indices."""
        return tuple(
            partition_indices(
                labels,
                self.num_partitions,
                self.scheme,
                seed=self.seed,
                p=self.p,
                ratio=self.ratio,
                alpha=self.alpha,
            )
        )


@lru_cache(maxsize=4096)  # a Ray actor hosts many virtual clients (100+ in the scale runs)
def _local_partition(
    source: RegisteredData, scheme: PartitionScheme, scaling: str, partition_id: int
) -> LocalData:
    # Cached: Flower rebuilds the client every round, and a Ray actor may host several virtual clients.
    return LocalData(source.load(), _partition(source, scheme)[partition_id], scaling)


@lru_cache(maxsize=8)  # keyed by the loaded file (a cached Dataset): Flower rebuilds clients every round
def _parts_of(data: Dataset, scheme: PartitionScheme) -> tuple[np.ndarray, ...]:
    """Every client's indices into one own file, computed once per process and file."""
    return scheme.split(data.y)


@lru_cache(maxsize=8)
def _partition(source: RegisteredData, scheme: PartitionScheme) -> tuple[np.ndarray, ...]:
    """Every client's indices, computed once per process (each client takes its own part)."""
    return scheme.split(source.load().y)


def local_view(cfg: RunConfig, partition_id: int, num_partitions: int) -> LocalData:
    """Vertical federation: view `partition_id` of every sample, scaled per `cfg.scaling`.

    Labels come along only for evaluation by the label holder (partition 0); they never leave the client.
    """
    return _local_view(RegisteredData.of(cfg), cfg.scaling, partition_id, num_partitions)


@lru_cache(maxsize=64)
def _local_view(source: RegisteredData, scaling: str, partition_id: int, num_partitions: int) -> LocalData:
    data = source.load()
    vertical_view(views_of(data), partition_id, num_partitions)  # checks the view count
    return LocalData(data, np.arange(data.n_samples), scaling, view=partition_id)


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
