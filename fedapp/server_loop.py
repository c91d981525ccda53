"""Flower's legacy server loop, ended honestly.

Flower's `Server.fit` runs every configured round even after a method has stopped, and never tells the
strategy how the run ended, so a crash mid-run left a summary that looked finished. `FedappServer` runs
the same rounds (`fit_round`, `evaluate_round`), stops as soon as the strategy is done, and always calls
`strategy.finalize(...)` — with the failure when an exception ends the run — so summary.json carries an
honest `status`.
"""

from __future__ import annotations

import timeit
from logging import INFO
from typing import Protocol, runtime_checkable

import flwr.compat.common.recorddict_compat as compat
from flwr.common import ConfigRecord, Context, Parameters, log
from flwr.server import Server, ServerConfig
from flwr.server.compat import LegacyContext
from flwr.server.compat.app_utils import start_update_client_manager_thread
from flwr.server.history import History
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.server.workflow.default_workflows import default_evaluate_workflow, default_init_params_workflow
from flwr.serverapp import Grid

from fedapp.config import RunConfig


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

    def resume_point(self) -> tuple[int, Parameters | None]:
        """(rounds already done, global model) to continue from; (0, None) for a fresh run."""
        ...


class FedappServer(Server):
    """`Server` whose `fit` stops when the strategy is done and reports the end of the run to it."""

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
        except BaseException as exc:  # KeyboardInterrupt and SystemExit too: the summary must say so
            strategy.finalize(failure=f"{type(exc).__name__}: {exc}")
            raise
        strategy.finalize()
        return history, timeit.default_timer() - start


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
    except BaseException as exc:
        strategy.finalize(failure=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        stop.set()
        thread.join()
    strategy.finalize()
