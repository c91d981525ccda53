"""`nodes/<partition-id>/report.html`: one node's own records by cluster, for that node's eyes only.

Written by the node (the final report's client side, beside its `assignments.csv`) into its own output
folder on its own machine; nothing on it is sent anywhere. It shows the node's cluster sizes, a few of its
records per cluster (texts, image thumbnails or table rows; the closest to their centre first when the
method scores its assignments), its own keywords for texts, a 2-D PCA map of its records (a seeded
sample when there are many) and, once the server has sent the pooled sizes back (the report's second
stage), the node's share of each global cluster.

The page's data is kept beside it in `report.json`, so `fedapp report` redraws the page without the
records' source. Both files hold records: owner-only (0600), like the node's embedding cache.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedapp.private_files import atomic_write
from fedapp.report.pages.charts import colour, scatter
from fedapp.report.pages.html import Raw, number, page, section, table, text

if TYPE_CHECKING:
    from fedapp.datasets.local import LocalData

NODE_PAGE, NODE_DATA = "report.html", "report.json"
FORMAT = 1
EXAMPLES = 5  # records shown per cluster
MAP_POINTS = 2000  # records drawn on the map at most (a seeded sample beyond)
TEXT_CHARS = 300  # an example text is cut after this many characters
SHOWN_COLUMNS = 8  # columns of a table row shown
KEYWORDS = 10
CLOSEST_FIRST = {"distance": 1.0, "membership": -1.0, "probability": -1.0, "similarity": -1.0}


# ------------------------------------------------------------------------------------------ the data
def node_page_data(
    data: LocalData,
    labels: np.ndarray,
    scores: np.ndarray,
    score_kind: str,
    space: np.ndarray | None,
    *,
    k: int,
    header: Mapping[str, Any],
    seed: int = 0,
    keyword_min_docs: int = 5,
    feature_names: Sequence[str] = (),
) -> dict[str, Any]:
    """What the node's page shows, as JSON-ready data: `header` (run, method, dataset, partition id),
    sizes, examples per cluster, this node's keywords (texts) and the map."""
    labels = np.asarray(labels, dtype=np.int64)
    sizes = np.bincount(labels, minlength=k)[:k]
    chosen = example_rows(labels, np.asarray(scores, dtype=np.float64), score_kind, k, seed)
    ids = data.id_values
    examples = {
        str(cluster): [
            {"id": str(ids[row]), "score": _float(scores[row]), **record(data, row, feature_names)}
            for row in rows
        ]
        for cluster, rows in chosen.items()
    }
    return {
        "format": FORMAT,
        **dict(header),
        "records": int(len(labels)),
        "k": int(k),
        "kind": data.dataset.kind,
        "score_kind": score_kind,
        "sizes": sizes.tolist(),
        "examples": examples,
        "keywords": local_keywords(data, labels, k, keyword_min_docs),
        "map": record_map(data, labels, space, seed),
        "pooled_sizes": None,
    }


def example_rows(
    labels: np.ndarray, scores: np.ndarray, kind: str, k: int, seed: int
) -> dict[int, list[int]]:
    """Up to EXAMPLES rows per cluster: the closest to their centre first when the score says so (NaN
    last), else a seeded draw."""
    direction = CLOSEST_FIRST.get(kind)
    if direction is None or not np.isfinite(scores).any():
        key = np.random.default_rng(seed).permutation(len(labels)).astype(np.float64)
    else:
        key = np.where(np.isfinite(scores), direction * scores, np.inf)
    order = np.lexsort((key, labels))  # by cluster, then by key
    starts = np.searchsorted(labels[order], np.arange(k))
    ends = np.searchsorted(labels[order], np.arange(k), side="right")
    return {
        c: order[s : min(e, s + EXAMPLES)].tolist()
        for c, (s, e) in enumerate(zip(starts, ends, strict=True))
        if e > s
    }


def record(data: LocalData, row: int, feature_names: Sequence[str]) -> dict[str, Any]:
    """One record as the page shows it: its text, a thumbnail, its top words or its first values."""
    dataset, index = data.dataset, int(data.indices[row])
    if dataset.texts is not None:
        content = dataset.texts[index]
        cut = content if len(content) <= TEXT_CHARS else content[:TEXT_CHARS] + "…"
        return {"text": cut}
    if dataset.images is not None:
        return {"image": thumbnail(dataset.unit_images(np.array([index]))[0])}
    if dataset.counts is not None and dataset.vocabulary is not None:
        counts = dataset.counts[index].toarray().ravel()
        top = np.argsort(-counts, kind="stable")[:SHOWN_COLUMNS]
        return {"words": [f"{dataset.vocabulary[j]} ×{int(counts[j])}" for j in top if counts[j] > 0]}
    own = dataset.vectors is not None and data.view is None  # the file's own values, before any scaling
    values = np.asarray(dataset.vectors[index] if own else data.features[row], dtype=np.float64)
    names = (
        list(feature_names) if len(feature_names) == len(values) else [f"x{j}" for j in range(len(values))]
    )
    return {
        "values": dict(zip(names[:SHOWN_COLUMNS], (_float(v) for v in values[:SHOWN_COLUMNS]), strict=True))
    }


def thumbnail(image: np.ndarray) -> str:
    """A C x H x W image in [0, 1] as a PNG data URI (native size; the page scales it up)."""
    from PIL import Image

    pixels = np.clip(np.asarray(image, dtype=np.float64) * 255.0, 0, 255).astype(np.uint8)
    array = pixels[0] if pixels.shape[0] == 1 else np.transpose(pixels[:3], (1, 2, 0))
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def local_keywords(data: LocalData, labels: np.ndarray, k: int, min_docs: int) -> list[list[str]] | None:
    """This node's own keywords per cluster (texts): c-TF-IDF of its documents alone."""
    if data.dataset.texts is None:
        return None
    from fedapp.metrics.label_free import cluster_term_counts, ctfidf_keywords

    counts = cluster_term_counts(data.texts, labels, k, min_documents=max(1, min_docs))
    return ctfidf_keywords(counts, KEYWORDS)


def record_map(
    data: LocalData, labels: np.ndarray, space: np.ndarray | None, seed: int
) -> dict[str, Any] | None:
    """A 2-D PCA of the node's records in the method's space (else its features), on a seeded sample of
    at most MAP_POINTS; None when the records have no vectors."""
    n = len(labels)
    rows = np.arange(n)
    if n > MAP_POINTS:
        rows = np.sort(np.random.default_rng(seed).choice(n, MAP_POINTS, replace=False))
    vectors = _vectors(data, space, rows)
    if vectors is None or len(vectors) < 3:
        return None
    from sklearn.decomposition import PCA

    vectors = np.asarray(vectors, dtype=np.float64)
    components = min(2, vectors.shape[1])
    pca = PCA(
        n_components=components,
        svd_solver="full" if vectors.shape[1] <= 64 else "randomized",
        random_state=seed,
    )
    points = pca.fit_transform(vectors)
    if components == 1:
        points = np.column_stack([points[:, 0], np.zeros(len(points))])
    return {
        "x": np.round(points[:, 0], 4).tolist(),
        "y": np.round(points[:, 1], 4).tolist(),
        "cluster": labels[rows].tolist(),
        "drawn": int(len(rows)),
        "of": int(n),
        "explained": [round(float(v), 4) for v in pca.explained_variance_ratio_],
        "space": "the method's space" if space is not None else "the records' features",
    }


def _vectors(data: LocalData, space: np.ndarray | None, rows: np.ndarray) -> np.ndarray | None:
    if space is not None:
        return np.asarray(space[rows])
    if data.dataset.features is not None or data.view is not None:
        return np.asarray(data.features[rows])
    if data.dataset.counts is not None:
        return np.log1p(data.dataset.counts[data.indices[rows]].toarray())
    return None


def _float(value: Any) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


# ------------------------------------------------------------------------------------------ the page
def build_node_page(data: Mapping[str, Any], folder: Path | None = None) -> str:
    """The node's page from its data (`node_page_data`, maybe with `pooled_sizes`)."""
    pid = data.get("partition_id")
    heading = f"fedapp node report: partition {pid} of {data.get('run', 'this run')}"
    where = f" <code>{text(folder.resolve())}</code>" if folder is not None else ""
    lines = [
        f"{text(data.get('method'))} on {text(data.get('dataset'))}: {number(data.get('records'))} "
        f"records of this node in {number(data.get('k'))} clusters",
        "<strong>Who can see this page:</strong> whoever can read this node's output folder"
        f"{where} on this node's machine (the file is readable by its owner only). It was written here by "
        "this node and is never sent: the server and the other nodes see none of the records on it.",
    ]
    sections = [
        ("clusters", "Clusters", clusters_section(data)),
        ("map", "Map", map_section(data)),
        ("examples", "Examples", examples_section(data)),
    ]
    return page(f"fedapp node {pid}: {data.get('run', '')}", heading, lines, sections)


def clusters_section(data: Mapping[str, Any]) -> str:
    sizes = data.get("sizes") or []
    pooled = data.get("pooled_sizes")
    keywords = data.get("keywords") or []
    total = sum(sizes) or 1
    headers = ["cluster", "", "records here", "share of this node"]
    if pooled:
        headers += ["pooled size", "this node's share of it"]
    if keywords:
        headers.append("this node's keywords")
    rows = []
    for cluster, size in enumerate(sizes):
        row: list[Any] = [cluster, Raw(f'<span class="swatch" style="background:{colour(cluster)}"></span>')]
        row += [size, f"{100 * size / total:.1f} %"]
        if pooled:
            whole = pooled[cluster] if cluster < len(pooled) else None
            share = f"{100 * size / whole:.1f} %" if whole and whole > 0 else "—"
            row += [whole, share]
        if keywords:
            row.append(", ".join(keywords[cluster]) if cluster < len(keywords) else "")
        rows.append(row)
    numeric = [True, False, True, False] + ([True, False] if pooled else []) + ([False] if keywords else [])
    note = (
        "Pooled sizes: the cluster sizes the server summed and sent back in the final report"
        + (" (differentially private: noisy)" if data.get("pooled_noisy") else "")
        + "; clusters under the privacy floor on a node sent no sums and are not in them."
        if pooled
        else "The server sent no pooled sizes back in this run (its method has no metric space, or the "
        "report stopped after its first stage)."
    )
    return section("clusters", "Clusters", table(headers, rows, numeric), note)


def map_section(data: Mapping[str, Any]) -> str:
    points = data.get("map")
    if not points:
        return ""
    explained = ", ".join(f"{100 * v:.1f} %" for v in points.get("explained", []))
    sampled = (
        f"a seeded sample of {number(points['drawn'])} of {number(points['of'])} records"
        if points["drawn"] < points["of"]
        else f"all {number(points['of'])} records"
    )
    figure = scatter(
        "this node's records, first two principal components", points["x"], points["y"], points["cluster"]
    )
    note = f"PCA of {text(points.get('space', ''))}: {sampled}; variance explained {explained}."
    return section("map", "Map", figure, note)


def examples_section(data: Mapping[str, Any]) -> str:
    examples = data.get("examples") or {}
    if not examples:
        return ""
    order = {"distance": "closest to the centre first", "none": "a seeded draw"}
    kind = str(data.get("score_kind", "none"))
    parts = []
    for cluster in sorted(examples, key=int):
        records = examples[cluster]
        parts.append(
            f'<h3><span class="swatch" style="background:{colour(int(cluster))}"></span>'
            f"cluster {text(cluster)}</h3>"
        )
        parts.append(_examples_table(records, kind))
    note = f"Up to {EXAMPLES} records per cluster, {order.get(kind, 'the highest ' + kind + ' first')}."
    return section("examples", "Examples", "".join(parts), note)


def _examples_table(records: Sequence[Mapping[str, Any]], kind: str) -> str:
    if records and "image" in records[0]:  # thumbnails side by side; hovering one names it
        thumbs = "".join(
            f'<img class="thumb" alt="record {text(r["id"])}" title="{text(r["id"])}: {kind} '
            f'{text(number(r.get("score")))}" src="{r["image"]}">'
            for r in records
        )
        return f"<div>{thumbs}</div>"
    if records and "values" in records[0]:
        names = list(records[0]["values"])
        rows = [[r["id"], r.get("score"), *(r["values"].get(n) for n in names)] for r in records]
        return table(["id", kind, *names], rows, [False, True, *[True] * len(names)])
    rows = []
    for r in records:
        shown: Any = (
            ", ".join(r["words"])
            if "words" in r
            else Raw(f'<div class="example">{text(r.get("text", ""))}</div>')
        )
        rows.append([r["id"], r.get("score"), shown])
    return table(["id", kind, "record"], rows, [False, True, False])


# ------------------------------------------------------------------------------------------ the files
def write_node_page(folder: Path, data: Mapping[str, Any]) -> Path:
    """`report.json` and `report.html` into the node's folder, owner-only; returns the page's path."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / NODE_DATA, lambda handle: handle.write(json.dumps(data).encode("utf-8")))
    document = build_node_page(data, folder).encode("utf-8")
    atomic_write(folder / NODE_PAGE, lambda handle: handle.write(document))
    return folder / NODE_PAGE


def add_pooled_sizes(folder: Path, pooled: np.ndarray, noisy: bool) -> Path | None:
    """The report's second stage brought the pooled sizes: the node's page shows its share of each."""
    try:
        data = json.loads((folder / NODE_DATA).read_text())
    except (OSError, ValueError):
        return None
    data["pooled_sizes"] = [_float(v) if noisy else int(v) for v in np.asarray(pooled).tolist()]
    data["pooled_noisy"] = bool(noisy)
    return write_node_page(folder, data)


def rebuild_node_page(folder: Path) -> Path:
    """Redraw a node's page from its `report.json` (`fedapp report`)."""
    data = json.loads((folder / NODE_DATA).read_text())
    return write_node_page(folder, data)
