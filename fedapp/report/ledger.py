"""Communication ledger: bytes that cross the wire, per round, per client and direction.

Sizes are those of the serialized payloads Flower actually ships: the tensors of `Parameters` plus any
`bytes`/`str` values in config/metrics dictionaries (scalars are counted at 8 bytes). Training traffic
(the algorithm's own messages) and evaluation traffic (contingency tables) are kept apart so a paper's
communication table can be compared with the algorithm's traffic alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.common import Parameters

PHASES = ("fit", "evaluate", "report")  # report: the final report after the last round


def parameters_nbytes(parameters: Parameters | None) -> int:
    """Bytes of the serialized tensors in `parameters`."""
    if parameters is None:
        return 0
    return sum(len(tensor) for tensor in parameters.tensors)


def mapping_nbytes(values: Mapping[str, Any] | None) -> int:
    """Bytes of a Flower config/metrics dict: payload of bytes/str values, 8 bytes per scalar."""
    total = 0
    for value in (values or {}).values():
        if isinstance(value, bytes):
            total += len(value)
        elif isinstance(value, str):
            total += len(value.encode())
        else:
            total += 8
    return total


@dataclass
class CommLedger:
    """Accumulates traffic; `rounds[r][client][phase] = {"up": bytes, "down": bytes}`."""

    rounds: dict[int, dict[str, dict[str, dict[str, int]]]] = field(default_factory=dict)

    def record(self, server_round: int, client: str, phase: str, *, up: int = 0, down: int = 0) -> None:
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        per_client = self.rounds.setdefault(server_round, {}).setdefault(client, {})
        entry = per_client.setdefault(phase, {"up": 0, "down": 0})
        entry["up"] += int(up)
        entry["down"] += int(down)

    def totals(self, phase: str = "fit") -> dict[str, int]:
        up = down = 0
        for per_client in self.rounds.values():
            for phases in per_client.values():
                entry = phases.get(phase, {})
                up += entry.get("up", 0)
                down += entry.get("down", 0)
        return {"up": up, "down": down}

    def round_totals(self) -> dict[int, dict[str, int]]:
        """Per round, fit + evaluate traffic summed over clients."""
        out: dict[int, dict[str, int]] = defaultdict(lambda: {"up": 0, "down": 0})
        for server_round, per_client in self.rounds.items():
            for phases in per_client.values():
                for entry in phases.values():
                    out[server_round]["up"] += entry["up"]
                    out[server_round]["down"] += entry["down"]
        return dict(out)

    def summary(self) -> dict[str, Any]:
        """The `comm_bytes` block of summary.json."""
        fit, evaluate, report = self.totals("fit"), self.totals("evaluate"), self.totals("report")
        return {
            "up": fit["up"],
            "down": fit["down"],
            "total_mb": (fit["up"] + fit["down"]) / 1e6,
            "eval_up": evaluate["up"],
            "eval_down": evaluate["down"],
            "report_up": report["up"],
            "report_down": report["down"],
            "per_round": {str(r): v for r, v in sorted(self.round_totals().items())},
        }
