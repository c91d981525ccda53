"""What a node keeps of a run on its own machine: every one of its records' cluster, in `assignments.csv`.

The file never crosses the wire: the client writes it in the final report (see `fedapp.report.stages`), in the
node's `node-out-dir` (node config, else run config; a `{partition-id}` in it names the client), by
default `./fedapp-results/<run>/<partition-id>/` relative to where the node runs. Ids are written back
exactly as they were read (strings), with the cluster and a score whose meaning the method gives
(`SCORE_KINDS`): the distance to the assigned centre, a membership or a probability.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

from fedapp.datasets import PARTITION_PLACEHOLDER

ASSIGNMENTS_FILE = "assignments.csv"
ASSIGNMENT_COLUMNS = ("id", "cluster", "score")
DEFAULT_NODE_ROOT = "fedapp-results"
SCORE_KINDS = {
    "distance": "Euclidean distance to the assigned centre (smaller is closer)",
    "membership": "fuzzy membership of the assigned cluster (0..1)",
    "probability": "the model's probability of the assigned cluster (0..1)",
    "similarity": "cosine similarity to the assigned centroid (-1..1)",
    "none": "no per-record score (the consensus label of a vertical federation)",
}


def run_name(out_dir: str, method: str, dataset: str, seed: int) -> str:
    """A file-system-safe name for the run: the server's output folder name, else method-dataset-seed."""
    if out_dir.strip():
        return Path(out_dir).name or "run"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{method}-{dataset}-s{seed}").strip("_")


def node_out_dir(configured: str, partition_id: int, name: str) -> Path:
    """The directory this node writes to (`configured` may hold `{partition-id}`)."""
    if configured.strip():
        return Path(configured.replace(PARTITION_PLACEHOLDER, str(partition_id))).expanduser()
    return Path(DEFAULT_NODE_ROOT) / name / str(partition_id)


def write_assignments(
    path: Path, ids: Sequence[str] | np.ndarray, labels: np.ndarray, scores: np.ndarray
) -> Path:
    """Write an assignments file atomically (a reader never sees half a file); returns its path.

    `ids` as strings, or as an integer array of row numbers (`LocalData.id_values`): Arrow writes those as
    text itself, without 2.5 M Python strings (~150 MB) for a large site.

    Scores are written as the shortest text that reads back as the same float ('' for none: `predict`
    must match exactly). Arrow's CSV writer does it in C++ (0.2 s for 250,000 records, the csv module
    1.4 s); ids that need quoting (a comma, quote or line break) go through the csv module."""
    if not len(ids) == len(labels) == len(scores):
        raise ValueError(f"{len(ids)} ids, {len(labels)} labels and {len(scores)} scores")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.parent / f".{path.name}.{os.getpid()}.part"
    scores = np.asarray(scores, dtype=np.float64)
    table = pa.table(
        {
            "id": _id_array(ids),
            "cluster": pa.array(np.asarray(labels, dtype=np.int64)),
            "score": pa.array(scores, mask=~np.isfinite(scores)),
        }
    )
    header = ",".join(ASSIGNMENT_COLUMNS) + "\r\n"  # the csv module's own line ending
    try:
        with partial.open("wb") as handle:
            handle.write(header.encode("utf-8"))
            options = pa_csv.WriteOptions(include_header=False, quoting_style="none", eol="\r\n")
            pa_csv.write_csv(table, handle, options)
    except pa.ArrowInvalid:  # an id needs quoting
        with partial.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(ASSIGNMENT_COLUMNS)
            texts = ["" if score is None else repr(score) for score in table.column("score").to_pylist()]
            names = table.column("id").to_pylist()
            writer.writerows(zip(names, table.column("cluster").to_pylist(), texts, strict=True))
    partial.replace(path)
    return path


def _id_array(ids: Sequence[str] | np.ndarray) -> pa.Array:
    if isinstance(ids, np.ndarray) and ids.dtype.kind in "iu":
        return pa.array(ids).cast(pa.string())  # row numbers: "0", "1", ... as str(i) writes them
    return pa.array(ids, pa.string())


def read_assignments(path: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(ids, clusters, scores) of an assignments file; an empty score reads as NaN."""
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    if not rows or tuple(rows[0]) != ASSIGNMENT_COLUMNS:
        raise ValueError(f"{path}: not an assignments file (header {rows[0] if rows else None})")
    body = rows[1:]
    ids = [row[0] for row in body]
    clusters = np.array([int(row[1]) for row in body], dtype=np.int64)
    scores = np.array([float(row[2]) if row[2] else np.nan for row in body], dtype=np.float64)
    return ids, clusters, scores
