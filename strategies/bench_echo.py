"""`bench-echo` server: no maths; answers every round with a fixed-size model (the round-cost floor)."""

from __future__ import annotations

import numpy as np
from flwr.common import Parameters, ndarrays_to_parameters

from fedapp.config.run import RunConfig
from fedapp.methods.bench_echo import EchoConfig
from fedapp.wire import ArraySpec
from strategies.base import ClusteringStrategy
from strategies.replies import ClientReply


class EchoStrategy(ClusteringStrategy):
    method = "bench-echo"
    clusters = False  # no maths: its "result" is a cost, never a clustering

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.params = cfg.params(EchoConfig)

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        return [ArraySpec("payload", (self.params.up_floats,))]

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        return ndarrays_to_parameters([np.zeros(self.params.down_floats)])
