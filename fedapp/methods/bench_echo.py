"""`bench-echo`: the round-cost floor. Clients echo a fixed payload and the server does no maths, so a
round costs what Flower's runtime and our glue cost for that many bytes (simulation/bench/rounds.py)."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.config.keys import ConfigSection, config_key


@dataclass(frozen=True)
class EchoConfig(ConfigSection):
    up_floats: int = config_key(1000, ge=1, doc="float64 values each client sends per fit round")
    down_floats: int = config_key(1000, ge=1, doc="float64 values the server sends to each client per round")
