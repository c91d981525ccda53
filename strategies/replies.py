"""Reply intake: what the server accepts from a client before any maths sees it.

Plain functions, no strategy state. A fit reply is decoded and checked against the round's `ArraySpec`s
(`decode_reply`, with a byte bound checked before decoding); replies whose shape the server cannot know
in advance are kept by majority (`keep_modal`). An evaluation reply is a contingency table or, without
labels, the cluster sizes; `contingency_evaluation` merges them into the round's metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

import numpy as np
from flwr.common import EvaluateRes, FitRes, Scalar, log, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy

from fedapp.metrics.contingency import clustering_metrics
from fedapp.report.ledger import parameters_nbytes
from fedapp.report.stages import SIZES_KEY
from fedapp.wire import ArraySpec, ReplyError, check_arrays, decode_array, decode_counts

MAX_REPLY_BYTES = 1 << 31  # a reply whose arrays have open dimensions is still never allowed past 2 GiB
_NPY_OVERHEAD = 256  # bytes of the .npy header Flower's serialisation adds per array (at most)


@dataclass
class ClientReply:
    """A validated fit reply."""

    cid: str
    partition_id: int
    arrays: list[np.ndarray]
    num_examples: int
    metrics: dict[str, Scalar] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ fit replies
def max_reply_bytes(specs: Sequence[ArraySpec]) -> int:
    """A bound on the serialised size of a reply matching `specs`, with room to spare (twice 8 bytes an
    element): far larger replies are refused undecoded, nearer misses get the exact shape error."""
    if any(dim is None for spec in specs for dim in spec.shape):
        return MAX_REPLY_BYTES
    return 2 * sum(8 * math.prod(spec.shape) + _NPY_OVERHEAD for spec in specs)  # type: ignore[arg-type]


def decode_reply(cid: str, res: FitRes, specs: Sequence[ArraySpec], k: int | None) -> ClientReply:
    """The reply's arrays checked against `specs`, its partition id and its k; ReplyError otherwise."""
    size, limit = parameters_nbytes(res.parameters), max_reply_bytes(specs)
    if size > limit:  # checked on the raw bytes: an oversized reply is never decoded
        raise ReplyError(f"oversized reply: {size} bytes, at most {limit} expected")
    try:
        arrays = parameters_to_ndarrays(res.parameters)
    except Exception as exc:  # malformed bytes from a client must not crash the server
        raise ReplyError(f"undecodable parameters: {exc}") from exc
    check_arrays(arrays, specs)
    partition_id = res.metrics.get("partition-id")
    if not isinstance(partition_id, int):
        raise ReplyError("metrics lack an integer 'partition-id'")
    reported_k = res.metrics.get("k")
    if k is None:
        raise ReplyError("the number of clusters is unknown: run-config k=0 and no client reported 'k'")
    if reported_k is not None and reported_k != k:
        raise ReplyError(f"client uses k={reported_k!r}, the federation uses k={k}")
    return ClientReply(cid, partition_id, arrays, int(res.num_examples), dict(res.metrics))


def modal(values: list[Any]) -> Any:
    """Most common value; ties go to the smallest, so the result never depends on arrival order."""
    counts: dict[Any, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return min(counts, key=lambda value: (-counts[value], value))


def keep_modal(
    replies: list[ClientReply], server_round: int, value_of: Callable[[ClientReply], Any], what: str
) -> list[ClientReply]:
    """Keep the replies whose `value_of` (a dimension, an image shape) is the most common one.

    Used where the server cannot know that value in advance (a first round): one client with a wrong
    shape is rejected instead of breaking the concatenation of everyone's arrays. Ties go to the smallest
    value, so the outcome never depends on the order replies arrived in.
    """
    values = [value_of(reply) for reply in replies]
    most_common = modal(values)
    for reply, value in zip(replies, values, strict=True):
        if value != most_common:
            log(
                WARNING,
                "round %d: rejected client %s: %s %s, others %s",
                server_round,
                reply.cid,
                what,
                value,
                most_common,
            )
    return [reply for reply, value in zip(replies, values, strict=True) if value == most_common]


def consistent_replies(replies: list[ClientReply], server_round: int, axis: int = 1) -> list[ClientReply]:
    """`keep_modal` on the size of the first array along `axis` (the feature dimension)."""
    return keep_modal(replies, server_round, lambda reply: int(reply.arrays[0].shape[axis]), "dimension")


def consensus_k(results: list[tuple[ClientProxy, FitRes]]) -> int | None:
    """k = number of classes as most clients report it (run-config k = 0); None if nobody reports one."""
    reported = [res.metrics.get("k") for _, res in results]
    valid = [k for k in reported if isinstance(k, int) and not isinstance(k, bool) and k > 0]
    return modal(valid) if valid else None


def describe_failure(failure: tuple[ClientProxy, FitRes | EvaluateRes] | BaseException) -> str:
    if isinstance(failure, BaseException):
        return f"{type(failure).__name__}: {failure}"
    client, res = failure
    return f"client {client.cid}: {res.status.code.name} {res.status.message}"


# ----------------------------------------------------------------------------------- evaluation replies
def size_metrics(sizes: np.ndarray) -> dict[str, float]:
    """What an unlabelled evaluation can say: how many clusters hold records, the largest one's share."""
    total = max(int(sizes.sum()), 1)
    return {"clusters_used": float((sizes > 0).sum()), "largest_share": float(sizes.max(initial=0) / total)}


def sizes_from(res: EvaluateRes, k: int | None) -> np.ndarray:
    sizes = decode_array(res.metrics.get(SIZES_KEY), "cluster sizes")
    if sizes.ndim != 1 or (k is not None and sizes.shape != (k,)) or sizes.dtype.kind not in "iu":
        raise ReplyError(f"cluster sizes of shape {sizes.shape} {sizes.dtype}")
    if (sizes < 0).any() or int(sizes.sum()) != res.num_examples:
        raise ReplyError("cluster sizes are negative or do not add up to the client's records")
    return sizes.astype(np.int64)


def table_from(res: EvaluateRes) -> np.ndarray:
    blob = res.metrics.get("table")
    if not isinstance(blob, bytes):
        raise ReplyError("metrics lack a 'table' (bytes)")
    return decode_counts(blob)  # 2-D and non-negative by construction


def contingency_evaluation(
    server_round: int, results: list[tuple[ClientProxy, EvaluateRes]], k: int | None
) -> tuple[dict[str, float], dict[str, Any]] | None:
    """(metrics, details) of the summed contingency tables, exactly those of a centralized evaluation;
    cluster sizes only when no client has labels; None when no reply is usable. Bad replies are logged
    and left out; a table of another shape than most clients' is left out too."""
    tables: list[tuple[str, np.ndarray]] = []
    unlabelled: list[np.ndarray] = []  # cluster sizes of clients without labels
    for client, res in results:
        try:
            if SIZES_KEY in res.metrics and "table" not in res.metrics:
                unlabelled.append(sizes_from(res, k))
            else:
                tables.append((client.cid, table_from(res)))
        except ReplyError as exc:
            log(WARNING, "round %d: rejected evaluation from client %s: %s", server_round, client.cid, exc)
    total: np.ndarray | None = None
    if tables:
        shape = modal([table.shape for _, table in tables])  # one odd client cannot set the shape
        for cid, table in tables:
            if table.shape != shape:
                log(WARNING, "round %d: table shape %s from %s != %s", server_round, table.shape, cid, shape)
                continue
            total = table if total is None else total + table
    if total is None and unlabelled:  # nobody has labels: what the clustering looks like, by size
        sizes = np.sum(unlabelled, axis=0)
        return size_metrics(sizes), {"evaluated": 0, "cluster_sizes": sizes.tolist()}
    if total is None:
        return None
    return clustering_metrics(total), {
        "evaluated": int(total.sum()),
        "clusters_used": int((total.sum(1) > 0).sum()),
    }
