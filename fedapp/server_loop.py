"""Flower's legacy server loop, ended honestly.

Flower's `Server.fit` runs every configured round even after a method has stopped, and never tells the
strategy how the run ended, so a crash mid-run left a summary that looked finished. `FedappServer` runs
the same rounds (`fit_round`, `evaluate_round`), stops as soon as the strategy is done, and always calls
`strategy.finalize(...)` — with the failure when an exception ends the run — so summary.json carries an
honest `status`.
"""

from __future__ import annotations

import re
import time
import timeit
from collections.abc import Sequence
from logging import INFO
from typing import Protocol, runtime_checkable

import flwr.compat.common.recorddict_compat as compat
from flwr.common import (
    Code,
    ConfigRecord,
    Context,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Message,
    MessageType,
    Parameters,
    log,
)
from flwr.server import Server, ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat import LegacyContext
from flwr.server.compat.app_utils import start_update_client_manager_thread
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.history import History
from flwr.server.server import evaluate_clients, fit_clients
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.server.workflow.default_workflows import default_evaluate_workflow, default_init_params_workflow
from flwr.serverapp import Grid

from fedapp.config import RunConfig
from fedapp.report import STAGES

REPORT_GROUP = 0  # message group id of the final report (Flower's rounds start at 1)


@runtime_checkable
class FinalizingStrategy(Protocol):
    """What the loop needs from a strategy beyond Flower's `Strategy` interface."""

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

    def configure_report(
        self, stage: str, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """The final report's instructions for `stage` ([] : nothing to do)."""
        ...

    def aggregate_report(
        self, stage: str, results: list[tuple[ClientProxy, EvaluateRes]], failures: list[BaseException]
    ) -> bool:
        """Take a report stage's replies; False: the report cannot go on."""
        ...

    def resume_point(self) -> tuple[int, Parameters | None]:
        """(rounds already done, global model) to continue from; (0, None) for a fresh run."""
        ...


class FedappServer(Server):
    """`Server` whose `fit` stops when the strategy is done and reports the end of the run to it, and
    whose rounds exchange their messages in one batch when the clients live behind a Grid."""

    def fit_round(self, server_round: int, timeout: float | None):  # type: ignore[no-untyped-def]
        instructions = self.strategy.configure_fit(
            server_round=server_round, parameters=self.parameters, client_manager=self._client_manager
        )
        if not instructions:
            return None
        if _on_grid(instructions):
            results, failures = exchange(instructions, server_round, timeout)
        else:  # in-process proxies: Flower's threaded calls
            results, failures = fit_clients(instructions, self.max_workers, timeout, server_round)
        parameters, metrics = self.strategy.aggregate_fit(server_round, results, failures)  # type: ignore[arg-type]
        return parameters, metrics, (results, failures)

    def evaluate_round(self, server_round: int, timeout: float | None):  # type: ignore[no-untyped-def]
        instructions = self.strategy.configure_evaluate(
            server_round=server_round, parameters=self.parameters, client_manager=self._client_manager
        )
        if not instructions:
            return None
        if _on_grid(instructions):
            results, failures = exchange(instructions, server_round, timeout)
        else:
            results, failures = evaluate_clients(instructions, self.max_workers, timeout, server_round)
        loss, metrics = self.strategy.aggregate_evaluate(server_round, results, failures)  # type: ignore[arg-type]
        return loss, metrics, (results, failures)

    def fit(self, num_rounds: int, timeout: float | None) -> tuple[History, float]:
        strategy = self.strategy
        if not isinstance(strategy, FinalizingStrategy):
            raise TypeError(f"{type(strategy).__name__} lacks `done` and `finalize` (see FinalizingStrategy)")
        history = History()
        start = timeit.default_timer()
        try:
            done, parameters = strategy.resume_point()
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


def run_report(
    strategy: FinalizingStrategy,
    client_manager: ClientManager,
    timeout: float | None,
    max_workers: int | None,
) -> None:
    """The final report (`fedapp.report`): each stage's messages out, replies to the strategy."""
    for stage in STAGES:
        instructions = strategy.configure_report(stage, client_manager)
        if not instructions:
            return
        if _on_grid(instructions):
            results, failures = exchange(instructions, REPORT_GROUP, timeout)
        else:
            results, failures = evaluate_clients(instructions, max_workers, timeout, REPORT_GROUP)  # type: ignore[arg-type]
        if not strategy.aggregate_report(stage, results, failures):  # type: ignore[arg-type]
            return


_FLOWER_REASON = re.compile(r"^<class '(?:[\w.]*\.)?(\w+)'>:<['\"](.*)['\"]>$", re.DOTALL)


def readable_reason(reason: str) -> str:
    """Flower's "<class 'pkg.mod.Error'>:<'message'>" as "Error: message" (anything else unchanged)."""
    match = _FLOWER_REASON.match(reason.strip())
    return f"{match.group(1)}: {match.group(2)}" if match else reason


def _on_grid(instructions: Sequence[tuple[ClientProxy, object]]) -> bool:
    """True when every client is reached through one Flower Grid (simulation or deployment)."""
    grids = {id(getattr(proxy, "grid", None)) for proxy, _ in instructions}
    return all(isinstance(proxy, GridClientProxy) for proxy, _ in instructions) and len(grids) == 1


def run_secure(grid: Grid, context: Context, server: Server, config: ServerConfig, cfg: RunConfig) -> None:
    """The same rounds with every fit aggregated by Flower's SecAgg+ (run-config `secagg`).

    Flower's SecAgg+ workflow masks each client's upload so that the server learns only the weighted
    average of all of them; it then hands the strategy that average in place of every reply. The loop
    around it is DefaultWorkflow's, plus what `FedappServer` adds: resume, checkpoints, an early stop and
    an honest end of the run.
    """
    strategy = server.strategy
    if not isinstance(strategy, FinalizingStrategy):
        raise TypeError(f"{type(strategy).__name__} lacks `done` and `finalize` (see FinalizingStrategy)")
    legacy = LegacyContext(context, config=config, strategy=strategy, client_manager=server.client_manager())
    fit = SecAggPlusWorkflow(
        num_shares=1.0,  # every sampled client holds a share of every other's mask
        reconstruction_threshold=0.5,  # masks of clients lost mid-protocol are recovered from half the shares
        clipping_range=cfg.secagg_clip,
        max_weight=cfg.secagg_max_weight,
        timeout=config.round_timeout,
    )
    thread, stop, registered = start_update_client_manager_thread(grid, legacy.client_manager)
    registered.wait()
    try:
        done, parameters = strategy.resume_point()
        if parameters is None:
            default_init_params_workflow(grid, legacy)
        else:
            legacy.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
                parameters, True
            )
        round_config = ConfigRecord({Key.START_TIME: timeit.default_timer()})
        legacy.state.config_records[MAIN_CONFIGS_RECORD] = round_config
        for server_round in range(done + 1, config.num_rounds + 1):
            round_config[Key.CURRENT_ROUND] = server_round
            fit(grid, legacy)
            default_evaluate_workflow(grid, legacy)
            strategy.round_done(server_round)
            if strategy.done:
                break
        run_report(strategy, legacy.client_manager, config.round_timeout, None)
    except BaseException as exc:
        strategy.finalize(failure=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        stop.set()
        thread.join()
    strategy.finalize()


# ------------------------------------------------------------------------------------ batched exchange
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
    pending, replies = set(ids), {}
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    while pending and (deadline is None or time.monotonic() < deadline):
        for reply in grid.pull_messages(pending):
            message_id = reply.metadata.reply_to_message_id
            if message_id in pending:
                pending.discard(message_id)
                replies[message_id] = reply
        if pending:
            waited = time.monotonic() - started
            time.sleep(min(max(PULL_INTERVAL_FRACTION * waited, MIN_PULL_INTERVAL_S), MAX_PULL_INTERVAL_S))
    results: list[tuple[ClientProxy, FitRes | EvaluateRes]] = []
    failures: list[BaseException] = [TimeoutError(f"no reply within {timeout} s") for _ in pending]
    for message_id, reply in replies.items():
        if reply.has_error():
            cid = proxy_of[message_id].cid
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
            failures.append(RuntimeError(f"client status {res.status.code.name}: {res.status.message}"))
    return results, failures
