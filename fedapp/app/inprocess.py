"""A Ray-free engine: Flower's legacy `Server` loop with in-memory client proxies.

It runs the very same `server_fn`/`client_fn` (strategy and NumPyClient classes, `Parameters` bytes,
per-node `Context` with persistent `state`) as `flwr run`, minus Ray and the network, so that seed sweeps
and tests take seconds instead of minutes. Under SecAgg+ (`secagg`), whose protocol lives in Flower's
message layer (a server workflow and a client mod), it runs the ServerApp and the ClientApp themselves over
`DirectGrid`. Use `flwr run` (simulation or deployment) for anything that must exercise Flower's runtime.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from flwr.app import Error, Message
from flwr.client import Client
from flwr.clientapp import ClientApp
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
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.server import ServerAppComponents
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.history import History
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedapp.app.server_loop import FedappServer, late
from fedapp.datasets import PARTITION_PLACEHOLDER
from fedapp.launch.processes import INTERRUPTED
from fedapp.report.records import default_out_dir

Reply = TypeVar("Reply", FitRes, EvaluateRes)
Result = TypeVar("Result")
STOP_POLL_S = 0.2  # how often a wait for a client's reply looks for an interrupt


def run_within(call: Callable[[], Result], timeout: float | None, name: str) -> list[Result | BaseException]:
    """Run `call` on a daemon thread and wait at most `timeout` seconds (None: no limit): [its result or
    its exception], or [] when it overran (it runs on; what it returns is dropped). An interrupt of the
    entry point (`INTERRUPTED`) ends the wait at once, so the exit does not wait for a round's training."""
    outcome: list[Result | BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the caller as the client's failure
            outcome.append(exc)

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    while worker.is_alive() and not INTERRUPTED.is_set():
        left = STOP_POLL_S if deadline is None else min(STOP_POLL_S, deadline - time.monotonic())
        if left <= 0:
            break
        worker.join(left)
    if not outcome and INTERRUPTED.is_set():
        raise RuntimeError(f"{name}: the run was interrupted")
    return outcome


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
        """`call`'s reply, or the round timeout's failure when it takes longer (its late reply is
        dropped, as a SuperLink drops one)."""
        outcome = run_within(call, timeout, f"client {self.cid}")
        if not outcome:
            raise late(self.cid, timeout)
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def reconnect(self, ins: ReconnectIns, timeout: float | None, group_id: int | None) -> DisconnectRes:
        return DisconnectRes(reason="")


class DirectGrid(Grid):
    """A Grid that hands each message to its node's ClientApp in this process, one node after another,
    through Flower's wire format both ways (protobuf, as the SuperLink stores a message); a ClientApp that
    raises answers with an error reply, as in Flower's runtime, and one that takes longer than `timeout`
    seconds (the run's `round-timeout`; None: no limit) gets no reply, as a lost SuperNode."""

    def __init__(
        self, client_app: ClientApp, contexts: Mapping[int, Context], timeout: float | None = None
    ) -> None:
        self.timeout = timeout
        # the identity the runtime gives a ServerApp process (a Message takes its sender from it)
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 0, SUPERLINK_NODE_ID
        self.client_app = client_app
        self.contexts = dict(contexts)  # node id -> the node's Context, its `state` kept across messages
        self._run = Run.create_empty(run_id=0)
        self.replies: dict[str, Message] = {}  # instruction id -> its reply, until pulled

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(  # type: ignore[override]
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            delivered = message_from_proto(message_to_proto(message))
            node = message.metadata.dst_node_id
            ids.append(message.metadata.message_id)
            # bound now: a call that overruns the timeout outlives this loop iteration
            call = partial(self.client_app, delivered, self.contexts[node])
            outcome = run_within(call, self.timeout, f"node {node}")
            if not outcome:  # overran the round timeout: the server sees no reply
                continue
            reply = outcome[0]
            if isinstance(reply, BaseException):  # the runtime's error reply (flwr's vce_api worker)
                reason = f"{type(reply)}:<'{reply}'>"
                reply = Message(
                    Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=delivered
                )
            reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            self.replies[message.metadata.message_id] = message_from_proto(message_to_proto(reply))
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.replies.pop(i) for i in message_ids if i in self.replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(list(self.push_messages(messages)))


def _node_contexts(run_config: Mapping[str, Any], num_clients: int) -> dict[int, Context]:
    """Each node's Context (node id = partition id + 1), as a SuperNode's `--node-config` gives it."""
    out_dir = str(run_config.get("out-dir") or "") or str(
        default_out_dir(
            str(run_config.get("method")), str(run_config.get("dataset")), int(run_config.get("seed", 0))
        )
    )
    node_out = str(run_config.get("node-out-dir") or "") or str(
        Path(out_dir) / "nodes" / PARTITION_PLACEHOLDER
    )
    return {
        pid + 1: Context(
            run_id=0,
            node_id=pid + 1,
            node_config={"partition-id": pid, "num-partitions": num_clients, "node-out-dir": node_out},
            state=RecordDict(),
            run_config=dict(run_config),
        )
        for pid in range(num_clients)
    }


def run_messages_inprocess(
    server_main: Callable[[Grid, Context], None],
    client_app: ClientApp,
    run_config: Mapping[str, Any],
    num_clients: int,
) -> None:
    """Run the ServerApp's `main` against the ClientApp over a `DirectGrid`: Flower's message layer (the
    SecAgg+ workflow and client mod) without Ray or a network."""
    server_context = Context(
        run_id=0, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(), run_config=dict(run_config)
    )
    timeout = float(run_config.get("round-timeout") or 0.0) or None
    server_main(DirectGrid(client_app, _node_contexts(run_config, num_clients), timeout), server_context)


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
    for node_id, context in _node_contexts(run_config, num_clients).items():
        manager.register(InProcessClientProxy(f"node-{node_id - 1:04d}", client_fn, context))
    # max_workers=1: clients run one after another, like Ray on one CPU; results are order-independent.
    strategy = components.server.strategy if components.server is not None else components.strategy
    server = FedappServer(client_manager=manager, strategy=strategy)
    server.set_max_workers(1)
    history, _ = server.fit(num_rounds=components.config.num_rounds, timeout=components.config.round_timeout)
    return strategy, history
