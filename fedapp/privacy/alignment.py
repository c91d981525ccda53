"""Vertical parties line up their records by id without showing the server an id.

Each party holds its own view of the records, keyed by an `id-column`, in any order, and may hold ids the
others lack. Every party replaces each id by HMAC-SHA256(key, id) — a keyed hash with a secret the
parties share (`id-key` in each node's config) — and sends the set of hashes. The server intersects the
sets and sends the intersection back in sorted-hash order; each party keeps exactly those rows, in that
order, so row i is the same record on every party. Rows outside the intersection get no assignment.

What this hides: the ids themselves, from the server, as long as the key is secret from it (a keyed hash
cannot be inverted or checked against guessed ids without the key). What it does not hide: the size of
every party's set and of every overlap, and which of its own records each party shares with the others
(every party learns the intersection). Without a node `id-key`, a key derived from the run config is
used, which the server knows: it can then hash guessed ids (phone numbers, record numbers) and test them.
Private set intersection with RSA blind signatures (as FATE does) hides even the non-shared ids' hashes;
this is the weaker, simpler scheme.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence

import numpy as np

HASH_DTYPE = np.dtype("<U64")  # hex SHA-256
ALIGN_KEY = "align"  # fit config: this round collects the parties' id hashes
ALIGNED_KEY = "aligned-ids"  # fit config: the first array is the intersection of the hashes
ALIGNMENT_STATE = "fedapp.alignment"  # context.state: this party's aligned row order
MIN_OVERLAP_FRACTION = 0.1  # an intersection below this share of the smallest party's rows stops the run


class AlignmentError(ValueError):
    """The parties' records cannot be lined up (an empty or tiny intersection, duplicate ids)."""


def run_key(id_key: str, run: str) -> bytes:
    """The hashing secret: a node's (or the run config's) `id-key`, else one derived from the run name —
    known to the server, so weaker (module docstring)."""
    if id_key:
        return id_key.encode("utf-8")
    return hashlib.sha256(f"fedapp-id-key|{run}".encode()).digest()


def hash_ids(ids: Sequence[str], key: bytes) -> np.ndarray:
    """HMAC-SHA256 of every id, hex, as a fixed-width unicode array (what crosses the wire)."""
    hashed = [hmac.new(key, record.encode("utf-8"), hashlib.sha256).hexdigest() for record in ids]
    if len(set(hashed)) != len(hashed):
        raise AlignmentError(f"{len(hashed) - len(set(hashed))} duplicate ids among this party's records")
    return np.array(hashed, dtype=HASH_DTYPE)


def intersect(hashes: Mapping[int, np.ndarray], k: int) -> np.ndarray:
    """The hashes every party holds, sorted; AlignmentError naming the parties' counts when it is empty,
    smaller than k, or below MIN_OVERLAP_FRACTION of the smallest party's rows."""
    parties = sorted(hashes)
    common = hashes[parties[0]]
    for party in parties[1:]:
        common = np.intersect1d(common, hashes[party], assume_unique=True)
    common = np.sort(common)
    smallest = min(len(hashes[p]) for p in parties)
    if len(common) < max(k, 1) or len(common) < MIN_OVERLAP_FRACTION * smallest:
        counts = ", ".join(f"party {p}: {len(hashes[p])} ids" for p in parties)
        raise AlignmentError(
            f"the parties share only {len(common)} record ids ({counts}); need at least k={k} and "
            f"{MIN_OVERLAP_FRACTION:.0%} of the smallest party's: check id-column and that every party uses "
            "the same id-key"
        )
    return common


def aligned_rows(own_hashes: np.ndarray, intersection: np.ndarray) -> np.ndarray:
    """Indices of this party's rows in intersection order (every hash of the intersection must be here)."""
    order = np.argsort(own_hashes)
    positions = np.searchsorted(own_hashes, intersection, sorter=order)
    positions = np.minimum(positions, len(own_hashes) - 1)
    rows = order[positions]
    if not np.array_equal(own_hashes[rows], intersection):
        raise AlignmentError("the server's intersection holds ids this party does not have")
    return rows.astype(np.int64)
