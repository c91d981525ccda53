"""The registry: every family's entries under one name space, the data directory, and cached loading.

Flower rebuilds its clients every round, so `load_dataset` is cached per process and hands out read-only
arrays that clients may share but not mutate. A new family module plugs in by exposing a ``DATASETS``
dict of `Embedded` / `OnDisk` entries and being listed in `FAMILIES`. A user's own file (a source spec
such as ``csv:PATH``, see `sources`) is read by `sources.read_source` and cached the same way, keyed also
by the file's modification time and size.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

from fedapp.datasets import corpora, embedded, images, multiview, synthetic, texts
from fedapp.datasets.common import Dataset, DatasetError, Embedded, OnDisk, Source, long_tail, subsample
from fedapp.datasets.multiview import MAT_DESCRIPTION, MAT_PREFIX
from fedapp.datasets.sources import (
    DEFAULT_COLUMNS,
    SOURCE_DESCRIPTIONS,
    Columns,
    has_placeholder,
    is_source_spec,
    read_source,
    source_kind,
    source_path,
)

FAMILIES = (embedded, multiview, images, texts, corpora, synthetic)
DATA_DIR_ENV = "FEDAPP_DATA_DIR"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _gather() -> dict[str, Source]:
    entries: dict[str, Source] = {}
    for family in FAMILIES:
        clash = entries.keys() & family.DATASETS.keys()
        if clash:
            raise DatasetError(f"{family.__name__} registers dataset names already taken: {sorted(clash)}")
        entries.update(family.DATASETS)
    return entries


DATASETS = MappingProxyType(_gather())
EMBEDDED = tuple(name for name, source in DATASETS.items() if isinstance(source, Embedded))


@dataclass(frozen=True)
class DatasetInfo:
    """What the registry says about one dataset: for listings and for choosing a method."""

    name: str
    kind: str
    description: str
    files: tuple[str, ...]  # relative to the data directory; empty: embedded, no files needed


def dataset_info(name: str, *, columns: Columns | None = None) -> DatasetInfo:
    """The registry entry for `name` (``mat:<anything>`` gives the generic MATLAB entry).

    A source spec's kind comes from its file (a table's header; partition 0's file for a spec with a
    ``{partition-id}``), so the file must exist; `columns` says which column holds texts.
    """
    if is_source_spec(name):
        prefix = next(p for p in SOURCE_DESCRIPTIONS if name.startswith(p))
        partition_id = 0 if has_placeholder(name) else None
        kind = source_kind(name, columns or DEFAULT_COLUMNS, partition_id)
        files = (name.removeprefix(prefix),)
        return DatasetInfo(name, kind, SOURCE_DESCRIPTIONS[prefix], files)
    if name.startswith(MAT_PREFIX):
        path = name.removeprefix(MAT_PREFIX) or "<path>"
        return DatasetInfo(name, "multiview", MAT_DESCRIPTION, (path,))
    source = DATASETS.get(name)
    if source is None:
        raise _unknown_name_error(name)
    files = source.files if isinstance(source, OnDisk) else ()
    return DatasetInfo(name, source.kind, source.description, files)


def dataset_infos() -> tuple[DatasetInfo, ...]:
    """Every registered dataset, in registry order, then the generic ``mat:<path>`` entry."""
    return tuple(dataset_info(name) for name in (*DATASETS, MAT_PREFIX + "<path>"))


def available_datasets() -> dict[str, str]:
    """Dataset name -> one-line description, for CLI listings (``mat:<path>`` stands for any .mat file)."""
    return {info.name: info.description for info in dataset_infos()}


def _unknown_name_error(name: str) -> DatasetError:
    valid = ", ".join([*DATASETS, MAT_PREFIX + "<path>"])
    return DatasetError(f"unknown dataset {name!r}; valid names: {valid}")


# --------------------------------------------------------------------------- data directory


def _default_data_dirs() -> tuple[Path, ...]:
    """The fallback locations, in search order: beside the working directory, then beside the project."""
    return (Path.cwd().parent / "shared" / "data", PROJECT_ROOT.parent / "shared" / "data")


def resolve_data_dir(configured: str | os.PathLike[str] | None = None) -> Path | None:
    """The data directory: explicit argument, else $FEDAPP_DATA_DIR, else an existing ../shared/data.

    An explicit argument or the environment variable is returned even if it does not exist, so the
    missing-file error names the directory the user asked for. Returns an absolute path or None.
    """
    for chosen in (configured, os.environ.get(DATA_DIR_ENV)):
        if chosen is not None and str(chosen).strip():
            return Path(chosen).expanduser().resolve()
    for candidate in _default_data_dirs():
        if candidate.is_dir():
            return candidate.resolve()
    return None


def _missing_data_dir_error(name: str, expected: Sequence[str]) -> DatasetError:
    searched = ", ".join(str(p) for p in _default_data_dirs())
    return DatasetError(
        f"dataset {name!r} needs files but no data directory was found (no data_dir argument, "
        f"${DATA_DIR_ENV} unset, none of: {searched}); expected files: {', '.join(expected)}"
    )


def _existing_files(name: str, source: OnDisk, data_dir: Path | None) -> tuple[Path, ...]:
    """The entry's files in the data directory; an error naming every expected file if any is missing."""
    if data_dir is None:
        raise _missing_data_dir_error(name, source.files)
    missing = [f for f in source.files if not (data_dir / f).is_file()]
    if missing:
        raise DatasetError(
            f"dataset {name!r}: missing {', '.join(missing)} in data directory {data_dir} "
            f"(expected files: {', '.join(source.files)})"
        )
    return tuple(data_dir / f for f in source.files)


def _mat_path(name: str, data_dir: Path | None) -> Path:
    """The file a ``mat:<path>`` name points to: absolute, or relative to the data directory."""
    given = name.removeprefix(MAT_PREFIX).strip()
    if not given:
        raise DatasetError(
            f"dataset name {name!r}: give a file after '{MAT_PREFIX}', e.g. 'mat:hw/Handwritten.mat'"
        )
    relative = Path(given).expanduser()
    if relative.is_absolute():
        path = relative
    elif data_dir is None:
        raise _missing_data_dir_error(name, [given])
    else:
        path = data_dir / relative
    if path.is_dir():
        raise DatasetError(f"{path}: is a directory, not a MATLAB .mat file")
    if not path.is_file():
        raise DatasetError(f"dataset {name!r}: missing {path.name} in directory {path.parent}")
    return path.resolve()


# --------------------------------------------------------------------------- loading


def _read(name: str, data_dir: Path | None, seed: int) -> Dataset:
    """Read one dataset from its source (embedded generator, catalogue files or a `mat:` file)."""
    source = DATASETS.get(name)
    if isinstance(source, Embedded):
        return source.read(name, seed)
    if isinstance(source, OnDisk):
        return source.read(name, _existing_files(name, source, data_dir))
    return multiview.read_mat_file(name, _mat_path(name, data_dir))


def require_files(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    columns: Columns | None = None,
    partition_id: int | None = None,
) -> None:
    """Fail now, with the error loading would give, if the dataset's files are missing (nothing is read).

    For entry points: a run must not start processes that will all fail on a missing file. A source spec
    is read whole (and cached), so a corrupt file fails here too.
    """
    if is_source_spec(name):
        _load_source(name, columns or DEFAULT_COLUMNS, partition_id, 0, 0)
        return
    source = DATASETS.get(name)
    if source is None and not name.startswith(MAT_PREFIX):
        raise _unknown_name_error(name)
    if isinstance(source, Embedded):
        return
    resolved_dir = resolve_data_dir(data_dir)
    if isinstance(source, OnDisk):
        _existing_files(name, source, resolved_dir)
    else:
        _mat_path(name, resolved_dir)


def load_dataset(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    max_samples: int = 0,
    imbalance: float = 0.0,
    columns: Columns | None = None,
    partition_id: int | None = None,
    expect_kind: str | None = None,
) -> Dataset:
    """Load a dataset by name (see `available_datasets`) or source spec, cached per process, read-only.

    `seed` drives seeded generators (`blobs`) and the subsample; `max_samples` > 0 keeps a
    class-stratified subset of exactly that many samples (every class kept, so it must be at least the
    number of classes; unlabelled data: a plain seeded subset), for quick runs. A source spec's path is
    absolute or relative to the current directory (not `data_dir`); `columns` and `partition_id` apply
    to source specs only, as `expect_kind` (a table must give that kind; see `sources.read_source`).
    `imbalance` > 0 first cuts a seeded long-tailed subset (largest/smallest class = `imbalance`, see
    `common.long_tail`), for evaluating methods on imbalanced clusters; `max_samples` then applies to it.
    """
    if imbalance:
        return _subsampled(
            _long_tailed(
                load_dataset(
                    name,
                    data_dir,
                    seed=seed,
                    columns=columns,
                    partition_id=partition_id,
                    expect_kind=expect_kind,
                ),
                imbalance,
                seed,
            ),
            max_samples,
            seed,
        )
    if max_samples < 0:
        raise DatasetError(f"max_samples must be >= 0 (0 keeps every sample), got {max_samples}")
    if is_source_spec(name):
        columns = columns or DEFAULT_COLUMNS
        full = _load_source(name, columns, partition_id, 0, 0, expect_kind)
        if _keeps_all(full, max_samples):
            return full
        return _load_source(name, columns, partition_id, max_samples, seed, expect_kind)
    source = DATASETS.get(name)
    if source is None and not name.startswith(MAT_PREFIX):
        raise _unknown_name_error(name)
    # Normalise the cache key: embedded datasets ignore the directory, and only seeded ones read the seed.
    is_embedded = isinstance(source, Embedded)
    resolved_dir = None if is_embedded else resolve_data_dir(data_dir)
    data_seed = seed if is_embedded and source.seeded else 0
    full = _load_cached(name, resolved_dir, data_seed, 0, 0)
    if _keeps_all(full, max_samples):
        return full
    return _load_cached(name, resolved_dir, data_seed, max_samples, seed)


@lru_cache(maxsize=16)  # keyed by the cached full dataset (identity), so clients share one subset
def _long_tailed(full: Dataset, imbalance: float, seed: int) -> Dataset:
    return long_tail(full, imbalance, seed)


@lru_cache(maxsize=16)
def _subsampled(full: Dataset, max_samples: int, seed: int) -> Dataset:
    return full if _keeps_all(full, max_samples) else subsample(full, max_samples, seed)


def _keeps_all(full: Dataset, max_samples: int) -> bool:
    """Whether `max_samples` keeps the whole dataset; an error if it cannot hold every class."""
    if max_samples == 0 or max_samples >= full.n_samples:
        return True
    if max_samples < full.n_classes:
        raise DatasetError(
            f"dataset {full.name!r}: max_samples={max_samples} cannot hold all {full.n_classes} classes; "
            f"use 0 (all samples) or at least {full.n_classes}"
        )
    return False


@lru_cache(maxsize=32)
def _load_cached(name: str, data_dir: Path | None, data_seed: int, max_samples: int, seed: int) -> Dataset:
    """Per-process cache: Flower rebuilds clients every round, which must not re-read files.

    Subsamples (`max_samples` > 0) are cut from the cached full dataset, so new seeds read no files.
    """
    if max_samples == 0:
        return _read(name, data_dir, data_seed)
    return subsample(_load_cached(name, data_dir, data_seed, 0, 0), max_samples, seed)


def _load_source(
    spec: str,
    columns: Columns,
    partition_id: int | None,
    max_samples: int,
    seed: int,
    expect_kind: str | None = None,
) -> Dataset:
    """A source spec through the cache, keyed by its file's state so an edited file is read again."""
    partition_id = partition_id if has_placeholder(spec) else None  # one file, one cache entry
    return _load_source_cached(
        spec, columns, partition_id, _file_state(spec, partition_id), max_samples, seed, expect_kind
    )


def _file_state(spec: str, partition_id: int | None) -> tuple[int, ...]:
    """(mtime, size) of the spec's file; for an image folder, of it and its sub-folders, which change
    when images are added, removed or renamed (an image rewritten in place is not seen). () if absent:
    reading then gives the error."""
    path = source_path(spec, partition_id)
    try:
        if path.is_dir():
            with os.scandir(path) as entries:  # is_dir() of a scandir entry costs no stat per image
                paths = [path, *sorted(Path(e.path) for e in entries if e.is_dir())]
        else:
            paths = [path]
        return tuple(v for p in paths for stat in (p.stat(),) for v in (stat.st_mtime_ns, stat.st_size))
    except OSError:
        return ()


@lru_cache(maxsize=128)  # one entry per client file in a simulation process, plus subsamples
def _load_source_cached(
    spec: str,
    columns: Columns,
    partition_id: int | None,
    state: tuple[int, ...],
    max_samples: int,
    seed: int,
    expect_kind: str | None,
) -> Dataset:
    if max_samples == 0:
        return read_source(spec, columns, partition_id, expect_kind)
    full = _load_source_cached(spec, columns, partition_id, state, 0, 0, expect_kind)
    return subsample(full, max_samples, seed)
