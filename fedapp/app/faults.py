"""Faults injected into a client's messages on purpose: how the tests and the fault table (docs/faults.md,
`simulation/bench/faults.py`) make one client of a real run broken or hostile, on any engine.

`FEDAPP_FAULTS` in the environment (every process of a run inherits it: Ray's workers, a SuperNode's
ClientApps) lists `KIND@PARTITION:ROUND`, comma-separated, e.g. `nan@1:2,raise-evaluate@0:*`: the client
of that partition id misbehaves in that round's fit (or evaluation) message (`*`: in every round's).
`ManagedClient`, which every method's client runs in, applies it around the method, so the method's code
never knows:

- `nan`: a value of the reply becomes NaN (the first float array's; an integer array is sent as floats);
- `shape`: the first array loses its last row (a single row gains an axis);
- `double`: every array is sent twice, twice the bytes the server expects;
- `late`: the reply comes `LATE_BY_S` after the round timeout;
- `raise-fit` / `raise-evaluate`: the client raises instead of answering.

Unset, nothing is injected: a deployment's users never meet this.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from flwr.common import NDArrays, Scalar

FAULTS_ENV = "FEDAPP_FAULTS"
KINDS = ("nan", "shape", "double", "late", "raise-fit", "raise-evaluate")
LATE_BY_S = 2.0  # a late reply comes this long after the round timeout


class InjectedFaultError(RuntimeError):
    """A client told to fail (`raise-fit`, `raise-evaluate`)."""


@dataclass(frozen=True)
class Fault:
    kind: str
    partition: int
    round: int | None  # None: every round

    def __str__(self) -> str:
        return f"{self.kind}@{self.partition}:{'*' if self.round is None else self.round}"


@lru_cache(maxsize=4)
def parse_faults(text: str) -> tuple[Fault, ...]:
    """`KIND@PARTITION:ROUND[,...]` as Faults; ValueError naming the item that is not one."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, _, where = item.partition("@")
        partition, _, server_round = where.partition(":")
        if (
            kind not in KINDS
            or not partition.isdigit()
            or not (server_round.isdigit() or server_round == "*")
        ):
            raise ValueError(f"{FAULTS_ENV}: {item!r} is not KIND@PARTITION:ROUND with KIND one of {KINDS}")
        faults.append(Fault(kind, int(partition), None if server_round == "*" else int(server_round)))
    return tuple(faults)


def planned_fault(partition_id: int, config: dict[str, Scalar], kinds: tuple[str, ...]) -> Fault | None:
    """The fault of one of `kinds` this client must commit in the message that `config` came with."""
    server_round = config.get("server-round")
    if not isinstance(server_round, int):  # the final report, choosing k: not a round's message
        return None
    for fault in parse_faults(os.environ.get(FAULTS_ENV, "")):
        if fault.kind in kinds and fault.partition == partition_id and fault.round in (None, server_round):
            return fault
    return None


def before_fit(partition_id: int, config: dict[str, Scalar], round_timeout: float) -> Fault | None:
    """Raise or wait as a `raise-fit` / `late` fault says; returns a fault that corrupts the reply."""
    fault = planned_fault(partition_id, config, KINDS)
    if fault is None or fault.kind == "raise-evaluate":
        return None
    if fault.kind == "raise-fit":
        raise InjectedFaultError(f"injected fault {fault}: fit raises")
    if fault.kind == "late":
        time.sleep(round_timeout + LATE_BY_S)
        return None
    return fault


def before_evaluate(partition_id: int, config: dict[str, Scalar]) -> None:
    fault = planned_fault(partition_id, config, ("raise-evaluate",))
    if fault is not None:
        raise InjectedFaultError(f"injected fault {fault}: evaluate raises")


def corrupted(arrays: NDArrays, fault: Fault | None) -> NDArrays:
    """The reply's arrays as `fault` (nan, shape, double) spoils them."""
    if fault is None:
        return arrays
    arrays = [np.array(array) for array in arrays] or [np.zeros(1)]
    if fault.kind == "double":
        return arrays + [array.copy() for array in arrays]
    if fault.kind == "shape":
        first = arrays[0]
        arrays[0] = first[:-1] if first.ndim and first.shape[0] > 1 else first[..., None]
        return arrays
    floats = [i for i, array in enumerate(arrays) if array.dtype.kind == "f" and array.size]
    integers = [i for i, array in enumerate(arrays) if array.dtype.kind in "iub" and array.size]
    index = (floats or integers or [0])[0]
    kind = arrays[index].dtype if floats else np.float64  # integers: sent as floats, to hold a NaN
    spoilt = np.array(arrays[index], dtype=kind) if floats or integers else np.zeros(1)
    spoilt.reshape(-1)[0] = np.nan
    arrays[index] = spoilt
    return arrays
