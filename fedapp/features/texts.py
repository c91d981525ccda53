"""Sentence embeddings of a client's texts (and of their augmented views), for the short-text methods.

Simulation shortcut (see `fedapp.features.embeddings`): a text's embedding depends on that text alone, so each
client embeds the whole dataset it was given once — a disk-cache hit after the first run for a registered
set — and keeps its own rows; that equals embedding only its own texts up to float rounding, and no
client sees another's rows. A real deployment embeds each SuperNode's own texts. Results are also
memoised per process, because Flower rebuilds clients every round and a cache hit still reads and hashes
the file; the memo is keyed by what makes the vectors, not by where they are cached, so clients of one
process that partition one file encode it once.

Where a node caches them is run-config `embedding-cache` (`embedding_cache`): registered benchmark sets
share the user cache, a node's own records stay in its own directory (docs/privacy.md, "What stays
on a node's disk").
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from fedapp.datasets import PARTITION_PLACEHOLDER, Dataset, resolve_data_dir
from fedapp.datasets.augmented_texts import augmented_views
from fedapp.datasets.local import LocalData
from fedapp.features.embeddings import EmbeddingCache, default_cache_dir, embed_texts

_MEMO_SIZE = 16
_memo: OrderedDict[tuple[object, ...], np.ndarray] = OrderedDict()
_memo_lock = threading.Lock()


def embedding_cache(setting: str, *, own_data: bool, node_dir: Path, partition_id: int) -> EmbeddingCache:
    """A node's embedding cache from run-config `embedding-cache` (a node config's value wins: the
    ClientApp merges it).

    `auto` keeps registered benchmark sets, whose texts are public, in the user cache every run shares (a
    later run, a subsample or another method is a hit), and a node's own records in its own directory,
    beside its `assignments.csv`: derived data of a site's records stay where the site keeps the run's
    other outputs of them, and go when the run's folder goes. `node` puts any set there, `off` writes
    nothing, and a directory (`{partition-id}` allowed) is the site's own choice, e.g. to reuse
    embeddings across runs. Own records' entries are private (`EmbeddingCache.private`) wherever they go.
    """
    if setting == "off":
        return EmbeddingCache(None, private=own_data)
    if setting == "auto" and not own_data:
        return EmbeddingCache(default_cache_dir())
    if setting in ("auto", "node"):
        return EmbeddingCache(node_dir.expanduser().resolve(), private=own_data)
    directory = Path(setting.replace(PARTITION_PLACEHOLDER, str(partition_id))).expanduser()
    return EmbeddingCache(directory.resolve(), private=own_data)


def dataset_embeddings(
    data: Dataset,
    model: str,
    max_length: int | None,
    device: str = "auto",
    cache: EmbeddingCache | None = None,
) -> np.ndarray:
    """Embeddings of every text of `data` (float32, N x D, read-only), in row order; `cache` None: the
    user cache (`default_cache_dir`)."""
    return _embed(data, model, max_length, device, "", "", cache)


def local_embeddings(
    local: LocalData, model: str, max_length: int | None, device: str, cache: EmbeddingCache
) -> np.ndarray:
    """This client's rows of `dataset_embeddings` (a copy), cached in its node's `cache`."""
    return dataset_embeddings(local.dataset, model, max_length, device, cache)[local.indices]


def dataset_augmented_embeddings(
    data: Dataset,
    data_dir: str,
    model: str,
    max_length: int | None,
    device: str = "auto",
    cache: EmbeddingCache | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings of the two SCCL augmented views (see `augmented_views`) of every text, read-only."""
    return tuple(_embed(data, model, max_length, device, view, data_dir, cache) for view in ("1", "2"))  # type: ignore[return-value]


def local_augmented_embeddings(
    local: LocalData, data_dir: str, model: str, max_length: int | None, device: str, cache: EmbeddingCache
) -> tuple[np.ndarray, np.ndarray]:
    """This client's rows of `dataset_augmented_embeddings` (copies)."""
    views = dataset_augmented_embeddings(local.dataset, data_dir, model, max_length, device, cache)
    return tuple(view[local.indices] for view in views)  # type: ignore[return-value]


def local_augmented_texts(local: LocalData, data_dir: str) -> tuple[list[str], list[str]]:
    """This client's two augmented views as texts (fine-tune mode encodes them itself)."""
    views = augmented_views(local.dataset, _data_dir(data_dir))
    return tuple([view[i] for i in local.indices] for view in views)  # type: ignore[return-value]


def _embed(
    data: Dataset,
    model: str,
    max_length: int | None,
    device: str,
    view: str,
    data_dir: str,
    cache: EmbeddingCache | None,
) -> np.ndarray:
    """The memoised vectors of `data` (or of its augmented `view`), embedded through `cache` on a miss."""
    key = (data, model, max_length, device, view, data_dir)
    with _memo_lock:
        if key in _memo:
            _memo.move_to_end(key)
            return _memo[key]
    if data.texts is None:
        raise ValueError(f"dataset '{data.name}' has no texts (kind '{data.kind}')")
    if view:
        texts = augmented_views(data, _data_dir(data_dir))[int(view) - 1]
        label = f"{data.name}-aug"
    else:
        texts, label = data.texts, data.name
    vectors = embed_texts(
        list(texts), model, dataset=label, device=device, max_seq_length=max_length, cache=cache
    )
    vectors.setflags(write=False)
    with _memo_lock:
        _memo[key] = vectors
        while len(_memo) > _MEMO_SIZE:
            _memo.popitem(last=False)
    return vectors


def clear_memo() -> None:
    """Forget the per-process vectors (tests that check what reaches the disk cache)."""
    with _memo_lock:
        _memo.clear()


def _data_dir(configured: str) -> Path:
    resolved = resolve_data_dir(configured or None)
    if resolved is None:
        raise ValueError("augmented views need the data directory (run-config data-dir or $FEDAPP_DATA_DIR)")
    return resolved
