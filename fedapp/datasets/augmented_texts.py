"""SCCL's two contextual-augmentation views (``sccl-augmented/``) of StackOverflow and AgNews, aligned row
by row with those datasets (FSTC's and FSCCL's augmented pairs).

It sits above the registry: checking a file against its dataset needs the full dataset, which it loads
through `fedapp.datasets.registry`; neither the registry nor the family modules import this one.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedapp.datasets.common import Dataset, DatasetError
from fedapp.datasets.registry import load_dataset

AUGMENTED_FILES = {
    "stackoverflow": "sccl-augmented/stackoverflow_trans_subst_10.csv.gz",
    "agnews": "sccl-augmented/agnewsdataraw-8000_trans_subst_10.csv.gz",
}
AUGMENTED_COLUMNS = ("label", "text", "text1", "text2")
MIN_ALIGNED = 0.999  # rows whose text must equal the dataset's (after `_comparable`): one SO row differs


def _comparable(text: str) -> str:
    """Letters and digits only, lowercased: the SCCL copies differ from ours in quotes and spacing."""
    return re.sub(r"[^0-9a-z]+", "", text.lower())


def augmented_views(data: Dataset, data_dir: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """SCCL's two augmented views (nlpaug word substitution, 10 %) of every text of `data`, in its order.

    Works for the full dataset and its `max-samples` subsets. Raises DatasetError for a dataset without
    an augmented file, a missing file, or a file whose rows do not line up with the dataset (labels must
    agree everywhere, texts in at least 99.9 % of rows).
    """
    if data.texts is None or data.name not in AUGMENTED_FILES:
        raise DatasetError(
            f"no augmented views for dataset {data.name!r}; available for {sorted(AUGMENTED_FILES)}"
        )
    full_texts, view1, view2 = _aligned_views(data.name, data_dir / AUGMENTED_FILES[data.name])
    row_of: dict[str, int] = {}
    for row, text in enumerate(full_texts):
        row_of.setdefault(text, row)
    missing = [text for text in data.texts if text not in row_of]
    if missing:
        raise DatasetError(f"{len(missing)} texts of {data.name!r} are not in {data.name}'s full text list")
    rows = [row_of[text] for text in data.texts]
    return tuple(view1[r] for r in rows), tuple(view2[r] for r in rows)


@lru_cache(maxsize=4)
def _aligned_views(name: str, path: Path) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(dataset texts, view 1, view 2) of the full dataset, after checking the file lines up with it."""
    if not path.is_file():
        raise DatasetError(f"augmented views of {name!r}: missing {path}")
    try:
        with gzip.open(path, "rb") as raw:
            rows = list(csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline="")))
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise DatasetError(f"{path}: cannot read as gzipped CSV: {exc}") from exc
    if rows and not set(AUGMENTED_COLUMNS) <= set(rows[0]):
        raise DatasetError(f"{path}: needs columns {AUGMENTED_COLUMNS}, has {sorted(rows[0])}")
    full = load_dataset(name, path.parents[1])
    if len(rows) != full.n_samples:
        raise DatasetError(f"{path}: {len(rows)} rows, dataset {name!r} has {full.n_samples}")
    try:
        _, labels = np.unique([int(row["label"]) for row in rows], return_inverse=True)
    except ValueError as exc:
        raise DatasetError(f"{path}: non-integer label: {exc}") from exc
    if not np.array_equal(labels, full.y):
        raise DatasetError(f"{path}: labels do not line up with dataset {name!r} row by row")
    assert full.texts is not None
    same = np.mean(
        [_comparable(row["text"]) == _comparable(t) for row, t in zip(rows, full.texts, strict=True)]
    )
    if same < MIN_ALIGNED:
        raise DatasetError(f"{path}: only {100 * same:.2f} % of texts line up with dataset {name!r}")
    return full.texts, tuple(row["text1"] for row in rows), tuple(row["text2"] for row in rows)
