"""How the final report's statistics reach the server, turned into one shape (`strategies.report`).

The three kinds of run differ only in how a stage's statistics arrive: a plain run has every client's
own sizes, sums and distance sums in its evaluate reply (`plain_assignments`, `plain_distances`); under
SecAgg+ the server gets only their totals (`secure_assignments`, `secure_distances`); under differential
privacy each client sends a noisy release of them (`noisy_assignments`, `noisy_distances`). Stage 1
arrives as `Assignments`, stage 2 as the pooled `DistanceSums` (None when it cannot give metrics), which
`FinalReport` merges the same way whichever way they came. Plain functions, no state; a malformed reply
is a `ReplyError`, logged and left out (inside a secure sum it cannot be left out: it is raised).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common import FitRes, log, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy

from fedapp.metrics.label_free import (
    ClusterSums,
    DistanceSums,
    approximate_cluster_sums,
    approximate_distance_sums,
    merge_distance_sums,
)
from fedapp.privacy.secagg import CLIPPED_KEY
from fedapp.report.stages import (
    DISTANCES_KEY,
    NOISY_ASSIGN,
    NOISY_DISTANCES,
    NOISY_KEY,
    NOISY_SIZES,
    ROWS_KEY,
    SCORE_KIND_KEY,
    SIZES_KEY,
    SUMS_KEY,
    TERMS_KEY,
    assign_from_totals,
    decode_cluster_sums,
    decode_distance_sums,
    decode_noisy,
    decode_term_counts,
    distances_from_totals,
)
from fedapp.wire import ReplyError, decode_array

POOLED = -1  # key of the one pooled part when only totals reach the server (SecAgg+, DP)
Replies = list[tuple[ClientProxy, Any]]  # (client, EvaluateRes or FitRes)


@dataclass
class Assignments:
    """Stage 1 as it arrived, in the one shape `FinalReport.merge_assignments` takes."""

    sizes: np.ndarray | None = None  # (k,) records per cluster in the federation; None: none arrived
    rows: dict[int, int] = field(default_factory=dict)  # partition -> records it assigned ({}: private)
    sums: dict[int, ClusterSums] = field(default_factory=dict)  # per partition, or {POOLED: the totals}
    reporters: dict[int, str] = field(default_factory=dict)  # partition -> client asked for distances
    terms: list[list[dict[str, int]]] = field(default_factory=list)  # each client's term counts
    score_kinds: set[str] = field(default_factory=set)  # what the clients' score columns mean
    withheld: int | None = None  # records the clients' privacy floors kept out of the sums (None: n/a)
    rejected: list[str] = field(default_factory=list)  # clients whose reply was malformed
    exact: bool = False  # every client's own counts: a cluster left empty is real, not rounding or noise
    noisy: bool = False  # differentially private totals, clamped and rounded


def by_client(results: Replies) -> Replies:
    """Replies in client id order: arrival order is not deterministic."""
    return sorted(results, key=lambda item: item[0].cid)


def score_kinds(results: Replies) -> set[str]:
    return {str(res.metrics.get(SCORE_KIND_KEY, "none")) for _, res in results}


# -------------------------------------------------------------------------------------- plain
def plain_assignments(results: Replies, k: int, vertical: bool, views: int | None) -> Assignments:
    """Every client's own sizes, sums and term counts. Vertical parties label the same records, so the
    sizes are one party's, and the sums need every view (`views`, when known)."""
    arrived = Assignments(exact=True)
    total, party_sizes, withheld = np.zeros(k, dtype=np.int64), None, 0
    for client, res in by_client(results):
        try:
            partition, sizes, sums, terms = _plain_part(res.metrics, k)
        except ReplyError as exc:
            arrived.rejected.append(client.cid)
            log(WARNING, "final report: rejected client %s: %s", client.cid, exc)
            continue
        arrived.rows[partition] = int(sizes.sum())
        arrived.score_kinds.add(str(res.metrics.get(SCORE_KIND_KEY, "none")))
        if vertical:
            if party_sizes is not None and not np.array_equal(party_sizes, sizes):
                log(WARNING, "final report: party %d labels other rows than the first party", partition)
            party_sizes = sizes
        else:
            total += sizes
        if sums is not None:  # clusters below the privacy floor at this client: not in the metrics
            withheld += int(sizes[sums.counts == 0].sum())
            arrived.sums[partition], arrived.reporters[partition] = sums, client.cid
        if terms is not None:
            arrived.terms.append(terms)
    arrived.sizes, arrived.withheld = (party_sizes if party_sizes is not None else total), withheld
    if vertical and len(arrived.sums) != (views or len(arrived.sums)):
        log(WARNING, "final report: not every view reported; no label-free metrics")
        arrived.sums, arrived.reporters = {}, {}
    return arrived


def _plain_part(
    metrics: dict[str, Any], k: int
) -> tuple[int, np.ndarray, ClusterSums | None, list[dict[str, int]] | None]:
    """(partition, cluster sizes, cluster sums or None, term counts or None) of one plain reply."""
    partition = metrics.get("partition-id")
    if not isinstance(partition, int):
        raise ReplyError("no integer partition-id")
    sizes = decode_array(metrics.get(SIZES_KEY), "cluster sizes")
    if sizes.shape != (k,) or sizes.dtype.kind not in "iu" or (sizes < 0).any():
        raise ReplyError(f"cluster sizes of shape {sizes.shape}, expected ({k},)")
    if int(sizes.sum()) != metrics.get(ROWS_KEY):
        raise ReplyError("cluster sizes do not add up to the assigned rows")
    sums = None
    if SUMS_KEY in metrics:
        sums = decode_cluster_sums(metrics[SUMS_KEY])
        sent = sums.counts
        if sent.shape != (k,) or not np.all((sent == sizes) | (sent == 0)):
            raise ReplyError("cluster sums disagree with the cluster sizes")
    terms = decode_term_counts(metrics[TERMS_KEY], k) if TERMS_KEY in metrics else None
    return partition, sizes, sums, terms


def plain_distances(results: Replies, reporters: dict[int, str], vertical: bool) -> DistanceSums | None:
    """The pooled distance sums of every client asked (`reporters`); None unless all of them sent theirs.
    Vertical parties hold one view each of the same records: squared distances add up over the views,
    distances (and the silhouette) do not, so they are left at 0 (`FinalReport.merge_distances`)."""
    partition_of = {cid: partition for partition, cid in reporters.items()}
    parts: dict[int, DistanceSums] = {}
    for client, res in results:
        partition = partition_of.get(client.cid)
        if partition is None:
            log(WARNING, "final report: distances from client %s, which was not asked", client.cid)
            continue
        try:
            parts[partition] = decode_distance_sums(res.metrics.get(DISTANCES_KEY))
        except ReplyError as exc:
            log(WARNING, "final report: rejected distances of client %s: %s", client.cid, exc)
    if set(parts) != set(reporters):
        log(
            WARNING,
            "final report: distances of %d of %d clients; no label-free metrics",
            len(parts),
            len(reporters),
        )
        return None
    ordered = [parts[partition] for partition in sorted(parts)]
    if not vertical:
        return merge_distance_sums(ordered)
    squared = np.sum([part.squared_sums for part in ordered], axis=0)
    return DistanceSums(np.zeros_like(ordered[0].distance_sums), squared, 0.0, ordered[0].n)


# ------------------------------------------------------------------------------------ SecAgg+
def clipped_or_retry(
    results: list[tuple[ClientProxy, FitRes]], what: str, scale: float, last_try: bool
) -> int | None:
    """How many values SecAgg+ clipped in a secure exchange of sums; None (and a log line) when they
    should rather be asked again at a smaller public scale (`fedapp.app.secure_loop.secure_tries`)."""
    clipped = sum(int(res.metrics.get(CLIPPED_KEY, 0)) for _, res in results)  # type: ignore[call-overload]
    if clipped and not last_try:
        log(INFO, "%s: SecAgg+ would clip %d values at scale %g; again", what, clipped, scale)
        return None
    return clipped


def secure_totals(results: list[tuple[ClientProxy, FitRes]]) -> list[np.ndarray]:
    """The sums SecAgg+ hands every reply as one weighted average, times the total weight."""
    weight = sum(int(res.num_examples) for _, res in results)
    return [np.asarray(a, np.float64) * weight for a in parameters_to_ndarrays(results[0][1].parameters)]


def largest_rounding(totals: list[np.ndarray]) -> float:
    """How far stage 1's secure counts (sizes, then the floor's counts) were from integers; above 0.5 a
    count may be off by one."""
    return max(float(np.abs(t - np.rint(t)).max()) for t in totals[:2])


def secure_assignments(
    results: list[tuple[ClientProxy, FitRes]], totals: list[np.ndarray], k: int, scale: float
) -> Assignments:
    """Stage 1's secure totals, rounded; each client's row count, score kind and term counts are in the
    clear. Every reply inside the secure sum must be valid, since a share cannot be taken out again."""
    arrived = Assignments(score_kinds=score_kinds(results))
    reporters = {}
    for client, res in by_client(results):
        partition = res.metrics.get("partition-id")
        if not isinstance(partition, int) or res.metrics.get(ROWS_KEY) != res.num_examples:
            raise ReplyError(f"client {client.cid}: no partition-id or row count, inside the secure sum")
        if TERMS_KEY in res.metrics:
            arrived.terms.append(decode_term_counts(res.metrics[TERMS_KEY], k))
        arrived.rows[partition], reporters[partition] = int(res.num_examples), client.cid
    arrived.sizes, pooled = assign_from_totals(totals, k, scale)
    if pooled is not None:  # else no metric space: nothing for stage 2
        arrived.withheld = int(arrived.sizes.sum() - pooled.counts.sum())
        arrived.sums, arrived.reporters = {POOLED: pooled}, reporters
    return arrived


def secure_distances(totals: list[np.ndarray], counts: np.ndarray, scale: float) -> DistanceSums:
    """Stage 2's secure totals around the pooled means of `counts`."""
    merged = distances_from_totals(totals, counts, scale)
    if abs(float(totals[3][0]) - merged.n) > 0.5:
        log(WARNING, "final report: secure distances cover %.1f rows, the sums %d", totals[3][0], merged.n)
    return merged


# ---------------------------------------------------------------------- differential privacy
def noisy_assignments(results: Replies, k: int) -> Assignments:
    """Stage 1 under DP: the sum of the clients' noisy releases, clamped and rounded (none with
    `dp.report = withhold`: then only who answered and what their scores mean). A client's record
    count is private, so no rows."""
    arrived = Assignments(score_kinds=score_kinds(results))
    parts, reporters = [], {}
    for client, res in by_client(results):
        partition = res.metrics.get("partition-id")
        if not isinstance(partition, int):
            arrived.rejected.append(client.cid)
            continue
        reporters[partition] = client.cid
        if NOISY_KEY not in res.metrics:
            continue
        try:  # a method without a metric space sends only its sizes
            parts.append(decode_noisy(res.metrics[NOISY_KEY], "noisy statistics", NOISY_ASSIGN, NOISY_SIZES))
        except ReplyError as exc:
            arrived.rejected.append(client.cid)
            log(WARNING, "final report: rejected client %s: %s", client.cid, exc)
    if not parts:
        return arrived
    arrived.noisy = True
    if not _same_layout(parts, k):
        log(WARNING, "final report: noisy statistics of different shapes; no label-free metrics")
        return arrived
    sizes = np.sum([part["sizes"] for part in parts], axis=0)
    if "sums" not in parts[0]:
        arrived.sizes = np.maximum(np.rint(sizes), 0).astype(np.int64)
        return arrived
    pooled = approximate_cluster_sums(sizes, np.sum([part["sums"] for part in parts], axis=0))
    arrived.sizes = pooled.counts
    if (pooled.counts > 0).any():
        arrived.sums, arrived.reporters = {POOLED: pooled}, reporters
    return arrived


def _same_layout(parts: list[dict[str, np.ndarray]], k: int) -> bool:
    """Every release holds the same arrays, k sizes and (if any) k rows of sums of one width."""
    first = parts[0]
    if "sums" in first and (first["sums"].ndim != 2 or first["sums"].shape[0] != k):
        return False
    return all(
        set(part) == set(first)
        and part["sizes"].shape == (k,)
        and all(part[name].shape == first[name].shape for name in part)
        for part in parts
    )


def noisy_distances(results: Replies, expected: int, counts: np.ndarray) -> DistanceSums | None:
    """Stage 2 under DP: the sum of the clients' noisy releases around the pooled means of `counts`,
    clamped; None unless all `expected` clients sent one."""
    parts = []
    for client, res in by_client(results):  # one summation order, whatever the arrival order
        try:
            part = decode_noisy(res.metrics.get(NOISY_KEY), "noisy distances", NOISY_DISTANCES)
            if part["distance_sums"].shape != counts.shape or part["squared_sums"].shape != counts.shape:
                raise ReplyError(f"noisy distances of shape {part['distance_sums'].shape}, k={counts.size}")
            parts.append(part)
        except ReplyError as exc:
            log(WARNING, "final report: rejected distances of client %s: %s", client.cid, exc)
    if len(parts) != expected:
        log(WARNING, "final report: noisy distances of %d of %d clients", len(parts), expected)
        return None
    total = {name: np.sum([part[name] for part in parts], axis=0) for name in NOISY_DISTANCES}
    return approximate_distance_sums(
        total["distance_sums"], total["squared_sums"], float(total["silhouette_sum"]), counts
    )
