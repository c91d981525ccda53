"""Sentence embeddings of a client's texts (and of their augmented views), for the short-text methods.

Simulation shortcut (see `fedapp.features.embeddings`): a text's embedding depends on that text alone, so each
client embeds the whole dataset once — a disk-cache hit after the first run — and keeps its own rows;
that equals embedding only its own texts up to float rounding, and no client sees another's rows. A real
deployment embeds each SuperNode's own texts. Results are also memoised per process, because Flower
rebuilds clients every round and a cache hit still reads and hashes the file.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from fedapp.datasets import Dataset, resolve_data_dir
from fedapp.datasets.augmented_texts import augmented_views
from fedapp.datasets.local import LocalData
from fedapp.features.embeddings import embed_texts


def dataset_embeddings(data: Dataset, model: str, max_length: int | None, device: str = "auto") -> np.ndarray:
    """Embeddings of every text of `data` (float32, N x D, read-only), in row order."""
    return _embed(data, model, max_length, device, "")


def local_embeddings(
    local: LocalData, model: str, max_length: int | None, device: str = "auto"
) -> np.ndarray:
    """This client's rows of `dataset_embeddings` (a copy)."""
    return dataset_embeddings(local.dataset, model, max_length, device)[local.indices]


def dataset_augmented_embeddings(
    data: Dataset, data_dir: str, model: str, max_length: int | None, device: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings of the two SCCL augmented views (see `augmented_views`) of every text, read-only."""
    return tuple(_embed(data, model, max_length, device, view, data_dir) for view in ("1", "2"))  # type: ignore[return-value]


def local_augmented_embeddings(
    local: LocalData, data_dir: str, model: str, max_length: int | None, device: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """This client's rows of `dataset_augmented_embeddings` (copies)."""
    views = dataset_augmented_embeddings(local.dataset, data_dir, model, max_length, device)
    return tuple(view[local.indices] for view in views)  # type: ignore[return-value]


def local_augmented_texts(local: LocalData, data_dir: str) -> tuple[list[str], list[str]]:
    """This client's two augmented views as texts (fine-tune mode encodes them itself)."""
    views = augmented_views(local.dataset, _data_dir(data_dir))
    return tuple([view[i] for i in local.indices] for view in views)  # type: ignore[return-value]


@lru_cache(maxsize=16)
def _embed(
    data: Dataset, model: str, max_length: int | None, device: str, view: str, data_dir: str = ""
) -> np.ndarray:
    if data.texts is None:
        raise ValueError(f"dataset '{data.name}' has no texts (kind '{data.kind}')")
    if view:
        texts = augmented_views(data, _data_dir(data_dir))[int(view) - 1]
        label = f"{data.name}-aug"
    else:
        texts, label = data.texts, data.name
    vectors = embed_texts(list(texts), model, dataset=label, device=device, max_seq_length=max_length)
    vectors.setflags(write=False)
    return vectors


def _data_dir(configured: str) -> Path:
    resolved = resolve_data_dir(configured or None)
    if resolved is None:
        raise ValueError("augmented views need the data directory (run-config data-dir or $FEDAPP_DATA_DIR)")
    return resolved
