"""Which label-free criterion tells the better of two clusterings that grew from different starts
(docs/model-selection.md, "Keeping the better model": the 2K start compared with FSBERT k-FED's).

For every pair of finished text runs on the same data and seed, `fk-NAME` (FSBERT k-FED) and `f2k-NAME`
(FSTC trained from 2K local centres a client, `select = final`), both clusterings are scored in the same
space, the frozen sentence embeddings both runs read, exactly as a federated message would: per node
the records in clusters at or above the run's privacy floor, the pooled means from their sums, then
SSB / SSW, the simplified silhouette and Davies–Bouldin around those means (`fedapp.metrics.label_free`;
the simplified silhouette of an FSBERT k-FED run equals its own report's), and the neighbours'
agreement beyond chance (`neighbour_agreement`: each node's records among its own nearest records; no
mean needed). Labels only score (the runs' own NMI). Any FSTC run may stand as `f2k-NAME`: its
clustering is the one it labelled its records with (the weighted start's runs, `select = best`, are
scored the same way; so is a run from FSBERT k-FED's own start with `select = final`, whose start is
FSBERT k-FED's clustering). Each rule "keep the final
where its criterion is not more than m below FSBERT k-FED's" is then fitted leaving one setting out (a
setting: NAME without its `-s<seed>`):

    python -m simulation.bench.keep_criteria results/crit [--json results/crit/criteria.json]

The loss a margin is fitted to is `select_table.kept_loss`: a kept clustering more than 1 NMI below the
better one costs 100, each NMI point below it 1.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedapp.datasets.registry import load_dataset
from fedapp.features.embeddings import EmbeddingCache, default_cache_dir
from fedapp.features.texts import dataset_embeddings
from fedapp.maths.chunks import as_float, row_chunks
from fedapp.maths.clustering import squared_distances
from fedapp.metrics.label_free import (
    cluster_sums,
    distance_sums,
    label_free_metrics,
    merge_cluster_sums,
    merge_distance_sums,
)
from fedapp.report.keep import COLLAPSE_FRACTION, scatter
from simulation.bench.select_table import kept_loss

PAIR = ("fk", "f2k")  # FSBERT k-FED, FSTC from the 2K start (select = final)
# each the higher the better (Davies–Bouldin negated); all but the last from the two passes a federated
# message needs, the neighbours' agreement beyond chance from one (`neighbour_agreement`, per node)
CRITERIA = ("ssb_ssw", "simplified_silhouette", "negated_davies_bouldin", "neighbour_kappa")
# relative; a negative margin asks the final to score that much above FSBERT k-FED's clustering
MARGINS = (-0.05, -0.02, -0.01, 0.0, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1)
# FSTC's lead over FSBERT k-FED, NMI x 100, in the skew table (docs/methods/fstc.md; 3-seed means)
LEADS = {"ag-dir03": 2.86, "ag-dir1": 6.41, "so-lt50": 1.31, "bio-lt50": 1.89, "bio-lt10": 0.59}


@dataclass(frozen=True)
class Pair:
    """One data and seed: per clustering (fk, f2k) NMI x 100, clusters used and each criterion."""

    name: str
    setting: str
    nmi: dict[str, float]
    used: dict[str, int]
    score: dict[str, dict[str, float]]  # criterion -> clustering -> value

    def kept(self, criterion: str, margin: float) -> str:
        """The final (f2k) unless it collapsed or its criterion is more than `margin` (relative) below."""
        if self.used["f2k"] < COLLAPSE_FRACTION * self.used["fk"]:
            return "fk"
        values = self.score[criterion]
        return "f2k" if values["f2k"] >= values["fk"] - margin * abs(values["fk"]) else "fk"

    def loss(self, criterion: str, margin: float) -> float:
        return kept_loss(self.nmi, self.kept(criterion, margin))


def _assignments(run: Path, n: int) -> list[np.ndarray]:
    """Per node: (ids, clusters) of its records (ids = rows of the dataset the run read)."""
    nodes = []
    for path in sorted((run / "nodes").glob("*/assignments.csv")):
        table = np.loadtxt(path, delimiter=",", skiprows=1, usecols=(0, 1), dtype=np.int64, ndmin=2)
        if table.size and table[:, 0].max() >= n:
            raise ValueError(f"{path}: id {table[:, 0].max()} beyond the dataset's {n} rows")
        nodes.append(table)
    if not nodes:
        raise ValueError(f"{run}: no nodes/*/assignments.csv")
    return nodes


def _finished(run: Path) -> bool:
    """A run that wrote its summary and every node's assignments (a run still going has neither yet)."""
    return (run / "summary.json").exists() and any((run / "nodes").glob("*/assignments.csv"))


NEIGHBOURS = 10  # `neighbour_agreement`: each query record's nearest records on its own client
NEIGHBOUR_QUERIES = 2_000  # and at most this many query records a client (a seeded sample)


@dataclass(frozen=True)
class NeighbourAgreement:
    """Summable over clients: of the (query, neighbour) pairs counted, how many share a cluster
    (`agree`), and how many would by chance, the neighbour falling in the query's cluster with that
    cluster's share of its client's records (`expected`)."""

    agree: float
    expected: float
    pairs: int

    def __add__(self, other: NeighbourAgreement) -> NeighbourAgreement:
        return NeighbourAgreement(
            self.agree + other.agree, self.expected + other.expected, self.pairs + other.pairs
        )

    @property
    def kappa(self) -> float | None:
        """Agreement beyond chance, (agree - expected) / (pairs - expected), Cohen's form: 1 where every
        neighbour shares its query's cluster, 0 where no more do than cluster sizes alone give. Merging
        clusters raises the raw share; the chance term it raises with it. None where nothing counts."""
        if self.pairs <= self.expected:
            return None
        return (self.agree - self.expected) / (self.pairs - self.expected)


def neighbour_agreement(
    features: np.ndarray,
    labellings: Sequence[np.ndarray],
    k: int,
    floor: int,
    seed: int,
    *,
    neighbours: int = NEIGHBOURS,
    queries: int = NEIGHBOUR_QUERIES,
) -> list[NeighbourAgreement]:
    """One node's share: how often a record's nearest records on this node share its cluster, for each
    labelling of the same records (the neighbours are found once); summed over nodes as a federated
    message would be. A criterion no k-means solution optimises, unlike SSB / SSW, whose start is a
    k-means solution in the very space it is measured in: it asks whether clusters follow the data's
    local neighbourhoods. Queries are a seeded sample of at most `queries` records, their neighbours
    found among all the node's records (Euclidean), a chunk of those at a time; a query in a cluster
    below `floor` on its node sits out (the privacy floor)."""
    features = as_float(np.asarray(features))
    n = features.shape[0]
    checked = [np.asarray(labels, dtype=np.int64) for labels in labellings]
    neighbours = min(neighbours, n - 1)
    if neighbours < 1:
        return [NeighbourAgreement(0.0, 0.0, 0) for _ in checked]
    rng = np.random.default_rng([seed, 0x4E4])
    sample = np.sort(rng.choice(n, min(queries, n), replace=False))
    query = np.asarray(features[sample], dtype=np.float64)
    best = np.full((sample.size, neighbours), np.inf)  # the nearest so far: squared distances, rows
    nearest = np.zeros((sample.size, neighbours), dtype=np.int64)
    for rows in row_chunks(n, max(sample.size, features.shape[1])):
        d2 = squared_distances(features[rows], query).T  # (queries, this chunk's records)
        own = (sample >= rows.start) & (sample < rows.stop)
        d2[np.flatnonzero(own), sample[own] - rows.start] = np.inf  # a record is not its own neighbour
        pool = np.hstack([best, d2])
        index = np.hstack([nearest, np.broadcast_to(np.arange(rows.start, rows.stop), d2.shape)])
        keep = np.argpartition(pool, neighbours - 1, axis=1)[:, :neighbours]
        best, nearest = np.take_along_axis(pool, keep, 1), np.take_along_axis(index, keep, 1)
    out = []
    for labels in checked:
        sizes = np.bincount(labels, minlength=k)
        own = labels[sample]
        counted = sizes[own] >= floor
        agree = float((labels[nearest[counted]] == own[counted, None]).sum())
        expected = float(neighbours * (sizes[own[counted]] / n).sum())
        out.append(NeighbourAgreement(agree, expected, int(neighbours * counted.sum())))
    return out


def criteria(
    space: np.ndarray, nodes: list[np.ndarray], k: int, floor: int, seed: int = 0
) -> tuple[dict[str, float], int]:
    """SSB / SSW, the simplified silhouette, Davies–Bouldin and the neighbours' agreement beyond chance
    of one clustering, federated: per node only its clusters at or above `floor` count (as `select`'s
    message); pass 1 the sums, pass 2 the distances; each node its own records' neighbours."""
    agreement = sum(
        (
            neighbour_agreement(space[table[:, 0]], [table[:, 1]], k, floor, seed + index)[0]
            for index, table in enumerate(nodes)
        ),
        start=NeighbourAgreement(0.0, 0.0, 0),
    )
    parts = []
    for table in nodes:
        ids, labels = table[:, 0], table[:, 1]
        shared = np.bincount(labels, minlength=k)[labels] >= floor
        parts.append((space[ids[shared]], labels[shared]))
    pooled = merge_cluster_sums(cluster_sums(x, labels, k) for x, labels in parts)
    means = np.divide(pooled.sums, np.maximum(pooled.counts, 1)[:, None])
    distances = merge_distance_sums(distance_sums(x, labels, means, pooled.counts) for x, labels in parts)
    metrics = label_free_metrics(pooled, distances)
    norms = np.bincount(
        np.concatenate([labels for _, labels in parts]),
        weights=np.concatenate([np.einsum("ij,ij->i", x, x) for x, _ in parts]),
        minlength=k,
    )
    spread = scatter(pooled.counts, pooled.sums, norms)
    return {
        "ssb_ssw": float(spread.ratio or 0.0),
        "simplified_silhouette": float(metrics["simplified_silhouette"] or 0.0),
        "negated_davies_bouldin": -float(metrics["davies_bouldin"] or 0.0),
        "neighbour_kappa": float(agreement.kappa or 0.0),
    }, int(metrics["n_clusters_used"])


def score_pair(folder: Path, name: str) -> Pair:
    runs = {tag: folder / f"{tag}-{name}" for tag in PAIR}
    summaries = {tag: json.loads((run / "summary.json").read_text()) for tag, run in runs.items()}
    config = summaries["fk"]["config"]
    for key in ("dataset", "seed", "imbalance"):
        if summaries["f2k"]["config"][key] != config[key]:
            raise ValueError(f"{name}: the two runs differ in {key}")
    data = load_dataset(
        config["dataset"], config["data-dir"], seed=int(config["seed"]), imbalance=float(config["imbalance"])
    )
    length = int(config.get("textkfed.max-length", 32))
    if int(summaries["f2k"]["config"].get("fstc.max-length", 32)) != length:
        raise ValueError(f"{name}: the two runs embed the texts at different lengths")
    space = dataset_embeddings(
        data, config["embedding-model"], length, "cpu", EmbeddingCache(default_cache_dir())
    ).astype(np.float64)
    k, floor = int(summaries["fk"]["k"]), int(config["min-cluster-size"])
    score: dict[str, dict[str, float]] = {c: {} for c in CRITERIA}
    used: dict[str, int] = {}
    for tag, run in runs.items():
        values, used[tag] = criteria(space, _assignments(run, len(space)), k, floor, int(config["seed"]))
        for criterion, value in values.items():
            score[criterion][tag] = value
    nmi = {tag: 100 * float(summaries[tag]["metrics"]["nmi"]) for tag in PAIR}
    return Pair(name, re.sub(r"-s\d+$", "", name), nmi, used, score)


def fit(pairs: list[Pair], criterion: str) -> float:
    """The margin with the smallest total loss on `pairs` (ties: the smaller margin)."""
    return min(MARGINS, key=lambda m: (sum(p.loss(criterion, m) for p in pairs), abs(m)))


def _kept_without(pairs: list[Pair], pair: Pair, criterion: str) -> tuple[float, str]:
    """The margin fitted on the other settings' pairs, and what it keeps on `pair`."""
    margin = fit([p for p in pairs if p.setting != pair.setting], criterion)
    return margin, pair.kept(criterion, margin)


def table(pairs: list[Pair]) -> str:
    header = "| run | NMI FSBERT k-FED | NMI final | final − FSBERT k-FED | clusters used"
    header += " | SSB/SSW final / FSBERT k-FED | simplified silhouette final vs FSBERT k-FED"
    lines = [header + "".join(f" | {c}: margin, kept − FSBERT k-FED" for c in CRITERIA) + " |"]
    lines.append("|---|---|---|---|---|---|---|" + "---|" * len(CRITERIA))
    gained: dict[str, dict[str, list[float]]] = {c: {} for c in CRITERIA}
    for pair in sorted(pairs, key=lambda p: p.name):
        ratio = pair.score["ssb_ssw"]["f2k"] / pair.score["ssb_ssw"]["fk"]
        sil = pair.score["simplified_silhouette"]
        difference = pair.nmi["f2k"] - pair.nmi["fk"]
        cells = []
        for criterion in CRITERIA:
            margin, kept = _kept_without(pairs, pair, criterion)
            gain = pair.nmi[kept] - pair.nmi["fk"]
            gained[criterion].setdefault(pair.setting, []).append(gain)
            cells.append(f"{margin:g}: {'final' if kept == 'f2k' else 'FSBERT k-FED'} {gain:+.2f}")
        lines.append(
            f"| {pair.name} | {pair.nmi['fk']:.2f} | {pair.nmi['f2k']:.2f} | {difference:+.2f}"
            f" | {pair.used['fk']} / {pair.used['f2k']} | {ratio:.3f} | {sil['f2k']:.4f} vs {sil['fk']:.4f}"
            + " | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "| setting | seeds | FSTC's lead (half) | "
        + " | ".join(f"{c}: mean kept − FSBERT k-FED" for c in CRITERIA)
        + " |",
    ]
    lines.append("|---|---|---|" + "---|" * len(CRITERIA))
    for setting in sorted(gained[CRITERIA[0]]):
        lead = LEADS.get(setting)
        shown = "—" if lead is None else f"{lead:+.2f} ({lead / 2:.2f})"
        cells = []
        for criterion in CRITERIA:
            mean = float(np.mean(gained[criterion][setting]))
            mark = "" if lead is None else (" ✓" if mean >= lead / 2 else " ✗")
            cells.append(f"{mean:+.2f}{mark}")
        lines.append(
            f"| {setting} | {len(gained[CRITERIA[0]][setting])} | {shown} | " + " | ".join(cells) + " |"
        )
    lines.append("")
    settings = len({p.setting for p in pairs})
    apart = [p for p in pairs if abs(p.nmi["f2k"] - p.nmi["fk"]) > 1.0]
    for criterion in CRITERIA:
        right = sum(
            (p.score[criterion]["f2k"] > p.score[criterion]["fk"]) == (p.nmi["f2k"] > p.nmi["fk"])
            for p in apart
        )
        lines.append(
            f"{criterion}: ranks {right} of the {len(apart)} pairs more than 1 NMI apart as NMI does"
        )
    for criterion in CRITERIA:
        kept = np.concatenate([values for values in gained[criterion].values()])
        lines.append(
            f"{criterion}: margin fitted on all {settings} settings {fit(pairs, criterion):g};"
            f" leaving one setting out: kept − FSBERT k-FED {kept.mean():+.2f} on average, lowest"
            f" {kept.min():+.2f}, {int((kept < -1).sum())} of {kept.size} runs more than 1 below"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="holds fk-NAME and f2k-NAME run folders")
    parser.add_argument("--json", type=Path, help="write every pair's scores here")
    args = parser.parse_args(argv)
    names = sorted(
        run.name.removeprefix("f2k-")
        for run in args.folder.glob("f2k-*")
        if _finished(run) and _finished(args.folder / f"fk-{run.name[4:]}")
    )
    if not names:
        print(f"no finished fk-NAME / f2k-NAME pairs in {args.folder}", file=sys.stderr)
        return 2
    pairs = []
    for name in names:
        print(f"scoring {name} ...", file=sys.stderr, flush=True)
        pairs.append(score_pair(args.folder, name))
    if args.json:
        args.json.write_text(json.dumps([p.__dict__ for p in pairs], indent=1))
    print(table(pairs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
