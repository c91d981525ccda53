"""The server loop under SecAgg+ (run-config `secagg`): Flower's SecAggPlusWorkflow around the same rounds
as `fedapp.app.server_loop.FedappServer`, and around the messages of sums outside training (choosing k's
round B, `select = best`'s scoring, the final report's stages), each a secure fit round asked again at a
smaller public scale while SecAgg+ would clip (`secure_tries`).
"""

from __future__ import annotations

import timeit
from collections.abc import Callable
from logging import INFO
from typing import Any

import flwr.compat.common.recorddict_compat as compat
from flwr.common import ConfigRecord, Context, FitIns, FitRes, Parameters, log
from flwr.server import Server, ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat import LegacyContext
from flwr.server.compat.app_utils import start_update_client_manager_thread
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.server.workflow.default_workflows import default_init_params_workflow
from flwr.serverapp import Grid

from fedapp.app.k_selection import PHASE_CENTRES, PHASE_STATISTICS
from fedapp.app.server_loop import (
    REPORT_GROUP,
    SELECT_GROUP,
    FinalizingStrategy,
    KChoiceStages,
    ReportStages,
    exchange,
)
from fedapp.config.run import RunConfig
from fedapp.report.stages import SECURE_DONE, SECURE_RETRY, STAGES


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
    fit = secure_workflow(cfg, config.round_timeout)
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
        if not done:
            run_secure_selection(grid, legacy, strategy.k_choice, cfg, config.round_timeout)
        for server_round in range(done + 1, config.num_rounds + 1):
            round_config[Key.CURRENT_ROUND] = server_round
            if getattr(strategy, "secure_round", lambda _: True)(server_round):
                fit(grid, legacy)
            else:  # a message that is not a sum (e.g. gFedNTM's term lists): the plain exchange
                plain_fit(legacy, server_round, config.round_timeout)
            # evaluation is not SecAgg+'s: our batched exchange, where a client's error is a failure
            # (Flower's default evaluate workflow stops the run on the first error reply)
            server.parameters = compat.arrayrecord_to_parameters(
                legacy.state.array_records[MAIN_PARAMS_RECORD], True
            )
            server.evaluate_round(server_round, config.round_timeout)
            strategy.round_done(server_round)
            if strategy.done:
                log(INFO, "the strategy is done after round %d of %d", server_round, config.num_rounds)
                break
        run_secure_report(grid, legacy, strategy.final_report, cfg, config.round_timeout)
    except BaseException as exc:
        strategy.finalize(failure=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        stop.set()
        thread.join()
    strategy.finalize()


SECURE_REPORT_TRIES = 4  # SecAgg+ attempts per report stage; each after clipping divides the scale by 16
SECURE_REPORT_SHRINK = 16.0


class SecureStage:
    """One secure exchange in the shape SecAggPlusWorkflow drives (`configure_fit` / `aggregate_fit`), so
    Flower's SecAgg+ aggregates a report stage's or k selection's statistics as it does a training round."""

    def __init__(
        self,
        configure: Callable[[ClientManager], list[tuple[ClientProxy, FitIns]]],
        aggregate: Callable[[list[tuple[ClientProxy, FitRes]], list[Any]], str],
    ) -> None:
        self.configure, self.aggregate = configure, aggregate
        self.outcome: str | None = None  # None: SecAgg+ never got to aggregate (too few clients, a failure)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        return self.configure(client_manager)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[None, dict]:
        self.outcome = self.aggregate(results, failures)
        return None, {}  # the global model stays as it is


def secure_tries(
    grid: Grid,
    legacy: LegacyContext,
    cfg: RunConfig,
    timeout: float | None,
    stage: Callable[[float, bool], SecureStage],
) -> str | None:
    """One secure exchange (`stage(scale, last_try)`), asked again with the sums scaled down (a public
    factor) while SecAgg+ would clip them; the last outcome."""
    scale, outcome = 1.0, None
    for attempt in range(SECURE_REPORT_TRIES):
        adapter = stage(scale, attempt == SECURE_REPORT_TRIES - 1)
        context = LegacyContext(
            legacy, config=legacy.config, strategy=adapter, client_manager=legacy.client_manager
        )  # type: ignore[arg-type]
        secure_workflow(cfg, timeout)(grid, context)
        outcome = adapter.outcome
        if outcome != SECURE_RETRY:
            break
        scale /= SECURE_REPORT_SHRINK
    return outcome


def run_secure_selection(
    grid: Grid, legacy: LegacyContext, choice: KChoiceStages, cfg: RunConfig, timeout: float | None
) -> None:
    """Choose k before round 1 (`run_selection`) with round B's sums aggregated by SecAgg+; round A's
    floored local centres are no sum and go plainly (`fedapp.app.k_selection`)."""

    def stage(scale: float, last_try: bool) -> SecureStage:
        return SecureStage(
            lambda manager: choice.configure_secure(manager, scale),
            lambda results, failures: choice.aggregate_secure(results, failures, scale, last_try),
        )

    while True:  # again while a choice on the top of the range extends it (`choice.again`)
        instructions = choice.configure(PHASE_CENTRES, legacy.client_manager)
        if not instructions:
            return
        if not choice.aggregate(PHASE_CENTRES, *exchange(instructions, SELECT_GROUP, timeout)):  # type: ignore[arg-type]
            return
        round_config = legacy.state.config_records[MAIN_CONFIGS_RECORD]
        round_config[Key.CURRENT_ROUND] = SELECT_GROUP
        if secure_tries(grid, legacy, cfg, timeout, stage) != SECURE_DONE:
            raise RuntimeError(f"k selection ({PHASE_STATISTICS}, SecAgg+): nothing aggregated")
        if not choice.again:
            return


def run_secure_report(
    grid: Grid, legacy: LegacyContext, report: ReportStages, cfg: RunConfig, timeout: float | None
) -> None:
    """The final report with its statistics aggregated by SecAgg+ (each stage a secure fit round,
    message group `REPORT_GROUP`): the server learns the totals, not a client's sizes or sums. A stage
    whose values SecAgg+ would clip is asked again with the sums scaled down (a public factor)."""
    round_config = legacy.state.config_records[MAIN_CONFIGS_RECORD]
    round_config[Key.CURRENT_ROUND] = REPORT_GROUP
    choice = report.choice  # `select = best`: score start and final first, the sums through SecAgg+

    def choice_stage(scale: float, last_try: bool) -> SecureStage:
        return SecureStage(
            lambda manager: choice.configure_secure(manager, scale),
            lambda results, failures: choice.aggregate_secure(results, failures, scale, last_try),
        )

    if secure_tries(grid, legacy, cfg, timeout, choice_stage) is None:
        choice.abandon("SecAgg+ aggregated nothing (run stopped, or under 2 clients)")
    for stage in STAGES:

        def secure_stage(scale: float, last_try: bool, stage: str = stage) -> SecureStage:
            return SecureStage(
                lambda manager: report.configure_secure(stage, manager, scale),
                lambda results, failures: report.aggregate_secure(stage, results, failures, scale, last_try),
            )

        outcome = secure_tries(grid, legacy, cfg, timeout, secure_stage)
        if outcome != SECURE_DONE:
            if outcome is None:  # a stopped run asks nobody; else every client's stage failed
                report.lost(stage, "SecAgg+ aggregated nothing: fewer than 2 clients completed its stages")
            return


def secure_workflow(cfg: RunConfig, timeout: float | None) -> SecAggPlusWorkflow:
    """Flower's SecAgg+ with this project's settings (`secagg-clip`, `secagg-max-weight`)."""
    return SecAggPlusWorkflow(
        num_shares=1.0,  # every sampled client holds a share of every other's mask
        reconstruction_threshold=0.5,  # masks of clients lost mid-protocol are recovered from half the shares
        clipping_range=cfg.secagg_clip,
        max_weight=cfg.secagg_max_weight,
        timeout=timeout,
    )


def plain_fit(legacy: LegacyContext, server_round: int, timeout: float | None) -> None:
    """One fit round without SecAgg+ inside a secure run, for a strategy whose `secure_round` says its
    message cannot be a sum; the global parameters live in the workflow's state, as SecAgg+'s do."""
    strategy = legacy.strategy
    parameters = compat.arrayrecord_to_parameters(legacy.state.array_records[MAIN_PARAMS_RECORD], True)
    instructions = strategy.configure_fit(server_round, parameters, legacy.client_manager)
    if not instructions:
        return
    results, failures = exchange(instructions, server_round, timeout)
    aggregated, _ = strategy.aggregate_fit(server_round, results, failures)  # type: ignore[arg-type]
    if aggregated is not None:
        legacy.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(aggregated, True)
