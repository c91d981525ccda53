"""A Ray-free engine: Flower's legacy `Server` loop with in-memory client proxies.

It runs the very same `server_fn`/`client_fn` (strategy and NumPyClient classes, `Parameters` bytes,
per-node `Context` with persistent `state`) as `flwr run`, minus Ray and the network, so that seed sweeps
and tests take seconds instead of minutes. Use `flwr run` (simulation or deployment) for anything that
must exercise Flower's runtime.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from flwr.client import Client
from flwr.common import (
    Context,
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    ReconnectIns,
    RecordDict,
)
from flwr.server import ServerAppComponents
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.history import History

from fedapp.app.server_loop import FedappServer, late
from fedapp.datasets import PARTITION_PLACEHOLDER
from fedapp.report.records import default_out_dir

Reply = TypeVar("Reply", FitRes, EvaluateRes)


class InProcessClientProxy(ClientProxy):
    """Builds the client from `client_fn(context)` for every message, as Flower's runtime does, and
    holds its fit and evaluate calls to the round timeout, as a SuperLink does."""

    def __init__(self, cid: str, client_fn: Callable[[Context], Client], context: Context) -> None:
        super().__init__(cid)
        self.client_fn = client_fn
        self.context = context

    def get_properties(
        self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None
    ) -> GetPropertiesRes:
        return self.client_fn(self.context).get_properties(ins)

    def get_parameters(
        self, ins: GetParametersIns, timeout: float | None, group_id: int | None
    ) -> GetParametersRes:
        return self.client_fn(self.context).get_parameters(ins)

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        return self._within(timeout, lambda: self.client_fn(self.context).fit(ins))

    def evaluate(self, ins: EvaluateIns, timeout: float | None, group_id: int | None) -> EvaluateRes:
        return self._within(timeout, lambda: self.client_fn(self.context).evaluate(ins))

    def _within(self, timeout: float | None, call: Callable[[], Reply]) -> Reply:
        """`call`'s reply, or the round timeout's failure when it takes longer (the call runs on in a
        daemon thread and its late reply is dropped, as a SuperLink drops one)."""
        if timeout is None:
            return call()
        outcome: list[Reply | BaseException] = []

        def run() -> None:
            try:
                outcome.append(call())
            except BaseException as exc:  # handed to the server loop as the client's failure
                outcome.append(exc)

        worker = threading.Thread(target=run, name=f"client-{self.cid}", daemon=True)
        worker.start()
        worker.join(timeout)
        if not outcome:
            raise late(self.cid, timeout)
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def reconnect(self, ins: ReconnectIns, timeout: float | None, group_id: int | None) -> DisconnectRes:
        return DisconnectRes(reason="")


def run_inprocess(
    server_fn: Callable[[Context], ServerAppComponents],
    client_fn: Callable[[Context], Client],
    run_config: Mapping[str, Any],
    num_clients: int,
) -> tuple[Any, History]:
    """Run a whole federation in this process; returns (strategy, history)."""
    server_context = Context(
        run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=dict(run_config)
    )
    components = server_fn(server_context)
    manager = SimpleClientManager()
    out_dir = str(run_config.get("out-dir") or "") or str(
        default_out_dir(
            str(run_config.get("method")), str(run_config.get("dataset")), int(run_config.get("seed", 0))
        )
    )
    node_out = str(run_config.get("node-out-dir") or "") or str(
        Path(out_dir) / "nodes" / PARTITION_PLACEHOLDER
    )
    for pid in range(num_clients):
        context = Context(
            run_id=0,
            node_id=pid + 1,
            node_config={"partition-id": pid, "num-partitions": num_clients, "node-out-dir": node_out},
            state=RecordDict(),
            run_config=dict(run_config),
        )
        manager.register(InProcessClientProxy(f"node-{pid:04d}", client_fn, context))
    # max_workers=1: clients run one after another, like Ray on one CPU; results are order-independent.
    strategy = components.server.strategy if components.server is not None else components.strategy
    server = FedappServer(client_manager=manager, strategy=strategy)
    server.set_max_workers(1)
    history, _ = server.fit(num_rounds=components.config.num_rounds, timeout=components.config.round_timeout)
    return strategy, history
