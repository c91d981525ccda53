"""A node's cache of its own file, parsed: a SuperNode reads and validates its file once per run.

In a deployment Flower starts a fresh ClientApp process for every message, so without this every round
re-reads and re-parses the site's file (2-4 s for a million records). The first process that reads a
vector file (a table's numeric columns, `npy:`, `npz:`) writes the parsed, validated arrays beside the
embedding cache, in ``<root>/parsed/own/``, and later processes memory-map them.

Key: the SHA-256 of the file's bytes (hashing costs a fraction of parsing), the column settings and the
kind expected, so an edited file or other columns are a miss; the entry's name is a digest of that key
(no file name, no value). An entry is the features ``.npy`` (float32 or float64 as read), the labels
``.npy`` (0..C-1), the record ids ``.npy`` when the file has its own, and a JSON sidecar with the shapes
and dtypes, written last. Folders 0700, files 0600, atomic writes (`fedapp.private_files`): a crash leaves
no entry or arrays without a sidecar; an entry that fails a check (missing, truncated, another shape or
dtype than its sidecar says) is parsed again and rewritten. A root that cannot be written costs one
warning and the run goes on without a cache. Texts and images are not cached here (texts have the
embedding cache).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedapp.datasets.common import Dataset
from fedapp.datasets.sources import Columns, source_path
from fedapp.private_files import atomic_write, owner_only_folder

CACHE_FORMAT = 1
FOLDER = ("parsed", "own")
_HASH_BLOCK = 1 << 22  # 4 MiB reads while hashing the file


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in blocks (bounded memory for any size)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def entry_stem(spec: str, columns: Columns, partition_id: int | None, expect_kind: str | None) -> str:
    """The entry's name: a digest of (format, reader, file content, columns, expected kind)."""
    path = source_path(spec, partition_id)
    key = {
        "format": CACHE_FORMAT,
        "reader": spec.split(":", 1)[0],
        "content": file_sha256(path),
        "columns": [columns.text, columns.label, columns.id, list(columns.features)],
        "expect": expect_kind,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:32]


def cached_source(
    root: Path,
    stem: str,
    name: str,
    read: Callable[[], Dataset],
    stream: Callable[[Path], Dataset] | None = None,
) -> Dataset:
    """The dataset of entry `stem` under `root` (memory-mapped), else `read()` and, for vectors, write it.

    `stream` (a file larger than memory may be, `fedapp.datasets.streaming`): parses the file batch by
    batch into the features path it is given, so the entry is written without the file ever being held;
    a root that cannot be written falls back to `read()`."""
    folder = root.joinpath(*FOLDER)
    try:
        return _load(folder, stem, name)
    except _UnusableEntryError:
        pass
    if stream is not None:
        try:
            _make_folder(folder)
        except OSError as exc:
            log(WARNING, "parsed-data cache %s cannot be written (%s): reading the file whole", folder, exc)
            return read()
        data = stream(_paths(folder, stem)["features.npy"])
        try:
            _write(folder, stem, data, features_written=True)
        except OSError as exc:
            log(WARNING, "parsed-data cache %s cannot be written (%s): going on without it", folder, exc)
        return data
    data = read()
    if data.kind == "vectors":
        try:
            _write(folder, stem, data)
        except OSError as exc:
            log(WARNING, "parsed-data cache %s cannot be written (%s): going on without it", folder, exc)
    return data


class _UnusableEntryError(Exception):
    """An entry that is absent or fails a check (internal: the file is parsed again)."""


def _paths(folder: Path, stem: str) -> dict[str, Path]:
    return {part: folder / f"{stem}.{part}" for part in ("features.npy", "labels.npy", "ids.npy", "json")}


def _load(folder: Path, stem: str, name: str) -> Dataset:
    paths = _paths(folder, stem)
    try:
        meta = json.loads(paths["json"].read_text(encoding="utf-8"))
        vectors = np.load(paths["features.npy"], mmap_mode="r", allow_pickle=False)
        labels = np.load(paths["labels.npy"], mmap_mode="r", allow_pickle=False)
        ids = np.load(paths["ids.npy"], allow_pickle=False) if meta["own_ids"] else None
    except (OSError, ValueError, EOFError, KeyError, TypeError) as exc:
        raise _UnusableEntryError(str(exc)) from None
    n, dim = meta.get("n"), meta.get("dim")
    if (
        vectors.shape != (n, dim)
        or str(vectors.dtype) != meta.get("dtype")
        or labels.shape != (n,)
        or labels.dtype != np.int64
        or (ids is not None and ids.shape != (n,))
    ):
        log(WARNING, "parsed-data cache entry %s does not match its sidecar: reading the file again", stem)
        raise _UnusableEntryError("shape or dtype")
    return Dataset(
        name=name,
        kind="vectors",
        y=np.asarray(labels),
        n_classes=int(meta["n_classes"]),
        vectors=vectors,
        class_names=tuple(meta["class_names"]) if meta["class_names"] is not None else None,
        ids=tuple(ids.tolist()) if ids is not None else None,  # row numbers: `LocalData.ids` makes them
        labelled=bool(meta["labelled"]),
    )


def _make_folder(folder: Path) -> None:
    folder.parent.parent.mkdir(parents=True, exist_ok=True)
    owner_only_folder(folder.parent)
    owner_only_folder(folder)


def _write(folder: Path, stem: str, data: Dataset, features_written: bool = False) -> None:
    """The entry's files, the sidecar last; `features_written`: the features ``.npy`` is there already
    (streamed, `data.vectors` maps it)."""
    _make_folder(folder)
    paths = _paths(folder, stem)
    vectors = data.vectors
    assert vectors is not None
    own_ids = data.ids is not None and any(record != str(i) for i, record in enumerate(data.ids))
    if not features_written:
        contiguous = np.ascontiguousarray(vectors)
        atomic_write(paths["features.npy"], lambda stream: np.save(stream, contiguous, allow_pickle=False))
    labels = np.ascontiguousarray(data.y, dtype=np.int64)
    atomic_write(paths["labels.npy"], lambda stream: np.save(stream, labels, allow_pickle=False))
    if own_ids:
        ids = np.array(data.ids, dtype=str)
        atomic_write(paths["ids.npy"], lambda stream: np.save(stream, ids, allow_pickle=False))
    meta: dict[str, Any] = {
        "format": CACHE_FORMAT,
        "n": int(vectors.shape[0]),
        "dim": int(vectors.shape[1]),
        "dtype": str(vectors.dtype),
        "n_classes": data.n_classes,
        "class_names": list(data.class_names) if data.class_names is not None else None,
        "labelled": data.labelled,
        "own_ids": own_ids,
    }
    atomic_write(paths["json"], lambda stream: stream.write(json.dumps(meta).encode("utf-8")))
