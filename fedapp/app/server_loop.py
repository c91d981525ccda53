"""Flower's legacy server loop, ended honestly.

Flower's `Server.fit` runs every configured round even after a method has stopped, and never tells the
strategy how the run ended, so a crash mid-run left a summary that looked finished. `FedappServer` runs
the same rounds (`fit_round`, `evaluate_round`), stops as soon as the strategy is done, and always calls
`strategy.finalize(...)` — with the failure when an exception ends the run — so summary.json carries an
honest `status`.
"""

from __future__ import annotations

import json
import re
import time
import timeit
from collections import Counter
from collections.abc import Iterable, Sequence
from logging import INFO
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import flwr.compat.common.recorddict_compat as compat
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Message,
    MessageType,
    Parameters,
    log,
)
from flwr.common.constant import ErrorCode
from flwr.common.serde import recorddict_to_proto
from flwr.server import Server
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.history import History
from flwr.server.server import evaluate_clients, fit_clients
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from fedapp.app.k_selection import PHASE_CENTRES, PHASE_STATISTICS
from fedapp.report.stages import STAGES

REPORT_GROUP = 0  # message group id of the final report (Flower's rounds start at 1)
SELECT_GROUP = -1  # message group id of choosing k (before round 1)


class ReportStages(Protocol):
    """The final report's stages (`fedapp.report.stages`), as a strategy's report object runs them."""

    choice: ChoiceStage

    def configure(self, stage: str, client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        """The instructions for `stage` ([]: nothing to do)."""
        ...

    def aggregate(
        self,
        stage: str,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> bool:
        """Take a stage's replies; False: the report cannot go on."""
        ...

    def configure_secure(
        self, stage: str, client_manager: ClientManager, scale: float
    ) -> list[tuple[ClientProxy, FitIns]]:
        """The instructions for `stage` as SecAgg+ fit messages, the sums times `scale`."""
        ...

    def lost(self, stage: str, why: str) -> None:
        """`stage` reached the server from no client (e.g. SecAgg+ aggregated nothing)."""
        ...

    def aggregate_secure(
        self,
        stage: str,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
        scale: float,
        last_try: bool,
    ) -> str:
        """Take a stage's secure totals: SECURE_DONE, SECURE_RETRY (smaller scale) or SECURE_STOP."""
        ...


class SecureSums(Protocol):
    """A message of sums that can go through SecAgg+ (`secure_tries`): asked at a public `scale`, taken
    as SECURE_DONE, SECURE_RETRY (SecAgg+ would clip: a smaller scale) or SECURE_STOP."""

    def configure_secure(
        self, client_manager: ClientManager, scale: float
    ) -> list[tuple[ClientProxy, FitIns]]: ...

    def aggregate_secure(
        self,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
        scale: float,
        last_try: bool,
    ) -> str: ...


class ChoiceStage(SecureSums, Protocol):
    """`select = best`'s one scoring message before the report (`strategies.keep.ModelChoice`)."""

    def configure(self, client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]: ...

    def aggregate(
        self,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> None: ...

    def abandon(self, why: str) -> None: ...


class KChoiceStages(SecureSums, Protocol):
    """Choosing k before round 1 (`strategies.k_choice.KChoice`): two rounds, the second maybe secure,
    again while the range is extended (`aggregate`'s answer to round B, `again` after a secure one)."""

    again: bool

    def configure(
        self, phase: str, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]: ...

    def aggregate(
        self,
        phase: str,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> bool: ...


@runtime_checkable
class FinalizingStrategy(Protocol):
    """What the loop needs from a strategy beyond Flower's `Strategy` interface."""

    final_report: ReportStages
    k_choice: KChoiceStages

    @property
    def done(self) -> bool:
        """True once the method has stopped and its final evaluation is recorded."""
        ...

    def finalize(self, failure: str | None = None) -> None:
        """Record how the run ended (`failure`: why it broke off) and write the final outputs."""
        ...

    def round_done(self, server_round: int) -> None:
        """A round (fit and evaluation) is over: the moment to checkpoint."""
        ...

    def resume_point(self) -> tuple[int, Parameters | None]:
        """(rounds already done, global model) to continue from; (0, None) for a fresh run."""
        ...


class FedappServer(Server):
    """`Server` whose `fit` stops when the strategy is done and reports the end of the run to it, and
    whose rounds exchange their messages in one batch when the clients live behind a Grid."""

    def fit_round(self, server_round: int, timeout: float | None):  # type: ignore[no-untyped-def]
        return self._round(self.strategy.configure_fit, self.strategy.aggregate_fit, server_round, timeout)

    def evaluate_round(self, server_round: int, timeout: float | None):  # type: ignore[no-untyped-def]
        strategy = self.strategy
        return self._round(strategy.configure_evaluate, strategy.aggregate_evaluate, server_round, timeout)

    def _round(self, configure: Any, aggregate: Any, server_round: int, timeout: float | None) -> Any:
        """One exchange: the strategy's instructions out (`collect`), its aggregation of the replies; None
        when it asks nobody. Returns what Flower's `Server` rounds return: (result, metrics, replies)."""
        instructions = configure(
            server_round=server_round, parameters=self.parameters, client_manager=self._client_manager
        )
        if not instructions:
            return None
        results, failures = collect(instructions, server_round, timeout, self.max_workers)
        return (*aggregate(server_round, results, failures), (results, failures))

    def fit(self, num_rounds: int, timeout: float | None) -> tuple[History, float]:
        strategy = self.strategy
        if not isinstance(strategy, FinalizingStrategy):
            raise TypeError(f"{type(strategy).__name__} lacks `done` and `finalize` (see FinalizingStrategy)")
        history = History()
        start = timeit.default_timer()
        try:
            done, parameters = strategy.resume_point()
            if not done:
                run_selection(strategy.k_choice, self._client_manager, timeout, self.max_workers)
            if parameters is None:
                parameters = self._get_initial_parameters(server_round=0, timeout=timeout)
            self.parameters = parameters
            for server_round in range(done + 1, num_rounds + 1):
                fitted = self.fit_round(server_round=server_round, timeout=timeout)
                if fitted is not None:
                    parameters, fit_metrics, _ = fitted
                    if parameters:
                        self.parameters = parameters
                    history.add_metrics_distributed_fit(server_round=server_round, metrics=fit_metrics)
                evaluated = self.evaluate_round(server_round=server_round, timeout=timeout)
                if evaluated is not None and evaluated[0] is not None:
                    history.add_loss_distributed(server_round=server_round, loss=evaluated[0])
                    history.add_metrics_distributed(server_round=server_round, metrics=evaluated[1])
                strategy.round_done(server_round)
                if strategy.done:
                    log(INFO, "the strategy is done after round %d of %d", server_round, num_rounds)
                    break
            run_report(strategy, self._client_manager, timeout, self.max_workers)
        except BaseException as exc:  # KeyboardInterrupt and SystemExit too: the summary must say so
            strategy.finalize(failure=f"{type(exc).__name__}: {exc}")
            raise
        strategy.finalize()
        return history, timeit.default_timer() - start


def run_selection(
    choice: KChoiceStages, client_manager: ClientManager, timeout: float | None, max_workers: int | None
) -> None:
    """Choose k before round 1 when the run's k is open (`strategies.k_choice`): its two rounds, again
    while a choice on the top of the range extends it (round B's `aggregate` says so)."""
    phase = PHASE_CENTRES
    while True:
        instructions = choice.configure(phase, client_manager)
        if not instructions:
            return
        results, failures = collect(instructions, SELECT_GROUP, timeout, max_workers)
        if not choice.aggregate(phase, results, failures):
            return
        phase = PHASE_STATISTICS if phase == PHASE_CENTRES else PHASE_CENTRES


def run_report(
    strategy: FinalizingStrategy,
    client_manager: ClientManager,
    timeout: float | None,
    max_workers: int | None,
) -> None:
    """The final report (`fedapp.report.stages`): each stage's messages out, replies to the report."""
    report = strategy.final_report
    choosing = report.choice.configure(client_manager)  # `select = best`: score start and final first
    if choosing:
        report.choice.aggregate(*collect(choosing, REPORT_GROUP, timeout, max_workers))
    for stage in STAGES:
        instructions = report.configure(stage, client_manager)
        if not instructions:
            return
        results, failures = collect(instructions, REPORT_GROUP, timeout, max_workers)
        if not report.aggregate(stage, results, failures):  # type: ignore[arg-type]
            return


_FLOWER_REASON = re.compile(r"^<class '(?:[\w.]*\.)?(\w+)'>:<['\"](.*)['\"]>$", re.DOTALL)


def readable_reason(reason: str) -> str:
    """Flower's "<class 'pkg.mod.Error'>:<'message'>" as "Error: message" (anything else unchanged)."""
    match = _FLOWER_REASON.match(reason.strip())
    return f"{match.group(1)}: {match.group(2)}" if match else reason


def collect(
    instructions: Sequence[tuple[ClientProxy, FitIns | EvaluateIns]],
    group: int,
    timeout: float | None,
    max_workers: int | None,
) -> tuple[list[tuple[ClientProxy, Any]], list[BaseException]]:
    """Send a round's (or the report's, `group` 0) instructions and collect the replies: in one batch
    when the clients live behind a Grid (`exchange`), else through Flower's threaded in-process calls."""
    if _on_grid(instructions):
        return exchange(instructions, group, timeout)  # type: ignore[return-value]
    call = fit_clients if isinstance(instructions[0][1], FitIns) else evaluate_clients
    return call(instructions, max_workers, timeout, group)  # type: ignore[arg-type,return-value]


def _on_grid(instructions: Sequence[tuple[ClientProxy, object]]) -> bool:
    """True when every client is reached through one Flower Grid (simulation or deployment)."""
    grids = {id(getattr(proxy, "grid", None)) for proxy, _ in instructions}
    return all(isinstance(proxy, GridClientProxy) for proxy, _ in instructions) and len(grids) == 1


# ------------------------------------------------------------------------------------ batched exchange
EXPIRED = (ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE)  # SuperLink: TTL ran out
MIN_PULL_INTERVAL_S = 0.002  # shortest wait between pulls (the first ones after a push)
MAX_PULL_INTERVAL_S = 0.1  # longest wait between pulls, however long clients compute
PULL_INTERVAL_FRACTION = 0.05  # re-poll after 5 % of the time waited so far: late replies cost <= 5 %


def exchange(
    instructions: Sequence[tuple[ClientProxy, FitIns | EvaluateIns]],
    server_round: int,
    timeout: float | None,
) -> tuple[list[tuple[ClientProxy, FitRes | EvaluateRes]], list[BaseException]]:
    """Send a round's instructions to their SuperNodes at once and collect the replies.

    Flower's legacy proxies send one message per client thread and poll the SuperLink every 3 s in a
    deployment, which sets a floor of seconds per exchange. Here all messages go out in one push and the
    replies are pulled together, re-polling after 5 % of the time waited so far (2 ms to 100 ms), so a
    reply is picked up at most 5 % later than it arrived (a fixed doubling backoff lost up to 100 ms per
    exchange, a third of a CeFMC round in simulation). A reply that carries an error,
    or none before `timeout`, is a failure (and the strategy stops asking that client).
    """
    proxies = [proxy for proxy, _ in instructions]
    grid: Grid = proxies[0].grid  # type: ignore[attr-defined]
    messages = []
    for proxy, ins in instructions:
        if isinstance(ins, FitIns):
            content, kind = compat.fitins_to_recorddict(ins, True), MessageType.TRAIN
        else:
            content, kind = compat.evaluateins_to_recorddict(ins, True), MessageType.EVALUATE
        messages.append(
            Message(
                content=content,
                dst_node_id=proxy.node_id,  # type: ignore[attr-defined]
                message_type=kind,
                group_id=str(server_round),
                ttl=timeout,
            )
        )
    ids = list(grid.push_messages(messages))
    proxy_of = dict(zip(ids, proxies, strict=True))
    replies = pull_replies(grid, ids, timeout)
    pending = set(ids) - set(replies)
    results: list[tuple[ClientProxy, FitRes | EvaluateRes]] = []
    failures: list[BaseException] = [late(proxy_of[message_id].cid, timeout) for message_id in pending]
    for message_id, reply in replies.items():
        if reply.has_error():
            cid = proxy_of[message_id].cid
            if reply.error.code in EXPIRED:  # its TTL is the round timeout: the reply came too late
                failures.append(late(cid, timeout, "the SuperLink let its message expire"))
            else:
                failures.append(RuntimeError(f"client {cid} error: {readable_reason(reply.error.reason)}"))
            continue
        res = (
            compat.recorddict_to_fitres(reply.content, False)
            if reply.metadata.message_type == MessageType.TRAIN
            else compat.recorddict_to_evaluateres(reply.content)
        )
        if res.status.code == Code.OK:
            results.append((proxy_of[message_id], res))
        else:
            cid = proxy_of[message_id].cid
            failures.append(RuntimeError(f"client {cid} status {res.status.code.name}: {res.status.message}"))
    return results, failures


def pull_replies(grid: Grid, ids: Iterable[str], timeout: float | None) -> dict[str, Message]:
    """{instruction id: reply} pulled until every instruction has one or `timeout` passed, re-polling after
    5 % of the time waited so far (2 ms to 100 ms): a reply is picked up at most 5 % later than it came."""
    pending, replies = set(ids), {}
    started = time.monotonic()
    while pending:
        for reply in grid.pull_messages(pending):
            message_id = reply.metadata.reply_to_message_id
            if message_id in pending:
                pending.discard(message_id)
                replies[message_id] = reply
        waited = time.monotonic() - started
        if not pending or (timeout is not None and waited >= timeout):
            break
        time.sleep(min(max(PULL_INTERVAL_FRACTION * waited, MIN_PULL_INTERVAL_S), MAX_PULL_INTERVAL_S))
    return replies


def late(cid: str, timeout: float | None, how: str = "") -> TimeoutError:
    """The failure of a client that did not answer within the round's timeout, naming it."""
    return TimeoutError(
        f"client {cid}: no reply within the round timeout ({timeout:g} s){f'; {how}' if how else ''}"
    )


# ------------------------------------------------------------------------------------------- wire bytes
WIRE_BYTES_FILE = "wire_bytes.json"


class CountingGrid(Grid):
    """A Grid that counts the serialised bytes of every message it carries, per round and message type.

    The strategies' ledger counts the arrays they send and receive; under SecAgg+ the real traffic is
    different (key set-up, shares, masked integer vectors), so both runs are measured here the same way:
    the protobuf size of each message's content, as the SuperLink stores it.
    """

    def __init__(self, inner: Grid) -> None:
        self.inner = inner
        self.down: Counter[tuple[str, str]] = Counter()  # (group id, message type) -> bytes to clients
        self.up: Counter[tuple[str, str]] = Counter()
        self.messages: Counter[tuple[str, str]] = Counter()  # messages sent

    def set_run(self, run: Run) -> None:
        self.inner.set_run(run)

    @property
    def run(self) -> Run:
        return self.inner.run

    def create_message(self, *args, **kwargs) -> Message:  # type: ignore[no-untyped-def]
        return self.inner.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = self._count(self.down, messages, sent=True)
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._count(self.up, self.inner.pull_messages(message_ids))

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push, then pull the replies as `exchange` does (SecAgg+'s stages): the deployment's grid waits a
        fixed 3 s between pulls (flwr 1.42's http_grid)."""
        return list(pull_replies(self, self.push_messages(messages), timeout).values())

    def _count(
        self, counter: Counter[tuple[str, str]], messages: Iterable[Message], sent: bool = False
    ) -> list[Message]:
        messages = list(messages)
        for message in messages:
            key = (message.metadata.group_id, message.metadata.message_type)
            if message.has_content():  # an error reply carries none
                counter[key] += recorddict_to_proto(message.content).ByteSize()
            if sent:
                self.messages[key] += 1
        return messages

    def per_round(self) -> dict[str, dict[str, dict[str, int]]]:
        """{round: {message type: {"up": bytes, "down": bytes, "messages": n}}} (round "0": the report)."""
        table: dict[str, dict[str, dict[str, int]]] = {}
        for key in sorted(set(self.down) | set(self.up)):
            group, kind = key
            table.setdefault(group, {})[kind] = {
                "up": self.up[key],
                "down": self.down[key],
                "messages": self.messages[key],
            }
        return dict(sorted(table.items(), key=lambda item: int(item[0]) if item[0].isdigit() else -1))

    def write(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / WIRE_BYTES_FILE).write_text(json.dumps(self.per_round(), indent=1))
