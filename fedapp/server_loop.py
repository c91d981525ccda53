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

from flwr.common import log
from flwr.server import Server
from flwr.server.history import History


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


class FedappServer(Server):
    """`Server` whose `fit` stops when the strategy is done and reports the end of the run to it."""

    def fit(self, num_rounds: int, timeout: float | None) -> tuple[History, float]:
        strategy = self.strategy
        if not isinstance(strategy, FinalizingStrategy):
            raise TypeError(f"{type(strategy).__name__} lacks `done` and `finalize` (see FinalizingStrategy)")
        history = History()
        start = timeit.default_timer()
        try:
            self.parameters = self._get_initial_parameters(server_round=0, timeout=timeout)
            for server_round in range(1, num_rounds + 1):
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
                if strategy.done:
                    log(INFO, "the strategy is done after round %d of %d", server_round, num_rounds)
                    break
        except BaseException as exc:  # KeyboardInterrupt and SystemExit too: the summary must say so
            strategy.finalize(failure=f"{type(exc).__name__}: {exc}")
            raise
        strategy.finalize()
        return history, timeit.default_timer() - start
