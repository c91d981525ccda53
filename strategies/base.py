"""Shared server glue for every clustering strategy: Flower's Strategy flow around a method's hooks.

A subclass supplies the method's maths through hooks — `fit_instructions` (what each client is sent),
`reply_spec` (what a valid reply looks like), `aggregate` (the server update) and, for an evaluation other
than summed contingency tables, `evaluation_instructions` / `evaluation_metrics` — and this class runs
configure_fit -> aggregate_fit -> configure_evaluate -> aggregate_evaluate around them. What it relies on
lives beside it: who is asked (`strategies.roster`), what a valid reply is (`strategies.replies`), what
the run records (`strategies.records`) and the final report (`strategies.report.FinalReport`, composed
in as `final_report`, which the server loop drives after the last round) and the checkpoint
(`strategies.checkpoints`: the records, the roster, the report and the attributes each class names in
`state_fields`).
"""

from __future__ import annotations

from functools import partial
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    log,
    ndarrays_to_parameters,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from fedapp.config.run import RunConfig
from fedapp.report.records import PROGRESS_MARKER, REPORT_PHASE, default_out_dir
from fedapp.wire import ReplyError
from strategies.checkpoints import Checkpointed
from strategies.failures import partition_file
from strategies.hooks import StrategyHooks
from strategies.k_choice import KChoice
from strategies.privacy import PrivacyLayer
from strategies.records import RunRecord, run_status
from strategies.replies import (
    ClientReply,
    consensus_k,
    decode_reply,
)
from strategies.replies import consistent_replies as consistent_replies  # re-exported for fstc, fsccl
from strategies.report import FinalReport
from strategies.roster import ClientRoster

MAX_EMPTY_ROUNDS = 3  # consecutive rounds without one valid reply end the run (clients are broken)


class ClusteringStrategy(StrategyHooks, Checkpointed, Strategy):
    """Base class: see the module docstring. Subclasses implement `reply_spec` and `aggregate`."""

    refuse_duplicate_partitions = True  # a second client claiming a held partition-id is refused
    # a checkpoint keeps these parts' `state_dict`s and the `state_fields` (a subclass names only its own)
    state_parts = ("record", "roster", "privacy", "final_report", "k_choice")
    state_fields: tuple[str, ...] = (
        "k",
        "finished",
        "stop_reason",
        "final_metrics",
        "rounds_run",
        "partition_of",
        "latest_parameters",
        "_final_evaluated",
        "_empty_rounds",
    )

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.total_rounds = cfg.num_rounds  # Flower's: plus any a protocol adds (FSTC's secure Lloyd steps)
        self.data_file = partial(partition_file, cfg.dataset)  # a partition's own file, if the spec names one
        self.k: int | None = cfg.k or None  # None: clients resolve k = number of classes and report it
        self.out_dir = (
            Path(cfg.out_dir) if cfg.out_dir else default_out_dir(cfg.method, cfg.dataset, cfg.seed)
        )
        self.record = RunRecord()  # ledger, history, participation, timing: summary.json
        self.roster = ClientRoster(cfg)  # who is asked each round
        self.finished = False  # set by a subclass when its algorithm has converged or is one-shot
        self.stop_reason = ""
        self.stopped = False  # the run cannot go on (no valid replies, too few clients): done now
        self.status = "running"  # -> completed | converged | degraded | failed (`finalize`)
        self.status_reason = ""
        self.final_metrics: dict[str, float] | None = None
        self.rounds_run = 0
        self.partition_of: dict[str, int] = {}  # cid -> partition id, learnt from valid replies
        self.latest_parameters: Parameters | None = None  # the global model the next round starts from
        self.resumed_from: int | None = None  # the checkpointed round this run continued after
        self._final_evaluated = False
        self._empty_rounds = 0
        self._instructed: dict[int, list[str]] = {}
        self.warnings: list[str] = []  # what degraded without failing (summary.json `warnings`)
        self.privacy = PrivacyLayer(cfg)  # SecAgg+ and DP around the method (`strategies.privacy`)
        self.final_report = FinalReport(self)
        self.k_choice = KChoice(self)  # k = 0 on own files: choose k before round 1 (`strategies.k_choice`)

    # ------------------------------------------------------------------------------ Strategy API
    # Flower calls these; each of the four round steps is timed (summary.json `timing`).
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        # An empty model: clients must not be asked for initial parameters (the server owns the init).
        return ndarrays_to_parameters([])

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        with self.record.stopwatch(server_round, "server_configure_s"):
            if self.finished:
                return []
            clients = self.roster.usable(client_manager, self.record)
            too_few = self.roster.too_few(len(clients), server_round, self.record.failure_messages)
            if too_few:
                self._stop(too_few)
                return []
            every = self.needs_every_client(server_round)
            available = clients if every else self.roster.simulate_dropout(server_round, clients)
            kept, excluded = [c.cid for c in available], sorted(self.roster.excluded)
            self.record.sampled(server_round, [c.cid for c in clients], kept, excluded)
            instructions = self.fit_instructions(server_round, parameters, available)
            self._instructed[server_round] = [client.cid for client, _ in instructions]
            if instructions:
                self.record.start_round(server_round)
            self.record.sent(server_round, "fit", instructions)
            return self.k_choice.stamp(instructions)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        self.record.client_seconds(server_round, "fit", [res.metrics for _, res in results])
        self.record.placement([res.metrics for _, res in results])
        with self.record.stopwatch(server_round, "server_aggregate_s"):
            self.rounds_run = server_round
            replied = {client.cid for client, _ in results}
            self.record.failures(server_round, failures, self.partition_of, self.data_file)
            self.privacy.arrived(results)
            failed = sorted(set(self._instructed.get(server_round, [])) - replied)  # errors and timeouts
            self.roster.exclude(failed, server_round)
            if self.k is None:
                self.k = consensus_k(results)
            self.record.received(server_round, "fit", results)
            valid = [reply for reply in (self._validated(server_round, c, r) for c, r in results) if reply]
            # arrival order is not deterministic
            replies = sorted(valid, key=lambda reply: (reply.partition_id, reply.cid))
            consistent = self.consistent(server_round, replies) if replies else []
            for dropped in sorted({reply.cid for reply in replies} - {reply.cid for reply in consistent}):
                why = "it does not match the other clients' replies"
                self.record.rejected(server_round, dropped, why, self.partition_of, self.data_file)
            if self.refuse_duplicate_partitions:
                consistent, wait = self.roster.admit(server_round, consistent, self.record.failure_messages)
                if wait:  # a refused duplicate left a partition missing: wait for it, not run without
                    self.record.outcome(server_round, [], sorted(replied), failed)
                    stats = {"accepted": 0, "rejected": len(results), "failures": len(failures)}
                    return self._lost_round(server_round, stats)
            accepted = {reply.cid for reply in consistent}
            self.record.outcome(server_round, sorted(accepted), sorted(replied - accepted), failed)
            stats: dict[str, Scalar] = {
                "accepted": len(consistent),
                "rejected": len(results) - len(consistent),
                "failures": len(failures),
            }
            if len(consistent) < self.roster.min_fit():
                why = f"{len(consistent)} valid repl(y/ies), {self.roster.min_fit()} needed"
                return self._lost_round(server_round, stats, why)
            self._empty_rounds = 0
            try:
                parameters = self.aggregate(server_round, consistent)
            except ValueError as exc:  # e.g. too few valid replies left for k clusters: skip the round
                return self._lost_round(
                    server_round, {**stats, "accepted": 0}, f"aggregation skipped ({exc})"
                )
            if parameters is not None:
                self.latest_parameters = parameters
            return parameters, stats

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        with self.record.stopwatch(server_round, "server_configure_s"):
            if self._final_evaluated or not parameters.tensors or not self.should_evaluate(server_round):
                self.report_round(server_round)
                return []
            clients = self.roster.usable(client_manager, self.record)
            instructions = self.evaluation_instructions(server_round, parameters, clients)
            if not instructions:  # nobody can score this model yet (e.g. gFedNTM before its vocabulary)
                self.report_round(server_round)
            self.record.sent(server_round, "evaluate", instructions)
            return self.k_choice.stamp(instructions)

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        self.record.client_seconds(server_round, "evaluate", [res.metrics for _, res in results])
        with self.record.stopwatch(server_round, "server_aggregate_s"):
            self.record.failures(server_round, failures, self.partition_of, self.data_file, stage="evaluate")
            results = sorted(results, key=lambda item: item[0].cid)
            self.record.received(server_round, "evaluate", results)
            evaluated = self.evaluation_metrics(server_round, results)
            if evaluated is None:
                log(WARNING, "round %d: no valid evaluation reply", server_round)
                self.report_round(server_round)
                return None, {}
            self.final_metrics, details = evaluated
            self.record.evaluation(server_round, self.final_metrics, details)
            self.report_round(server_round, self.final_metrics)
            self._final_evaluated = self._final_evaluated or self.finished
            self.write_outputs()
            return None, dict(self.final_metrics)

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None  # no server-side data: evaluation is federated (contingency tables)

    # ------------------------------------------------------------------------- within a round
    def _validated(self, server_round: int, client: ClientProxy, res: FitRes) -> ClientReply | None:
        """The decoded reply if it passes `expected_arrays` and `check_reply`; None (logged) otherwise."""
        try:
            reply = decode_reply(client.cid, res, self.expected_arrays(server_round), self.k)
            if self.sends_releases(server_round):
                self.privacy.check(reply)
            self.check_reply(server_round, reply)
        except ReplyError as exc:
            claimed = res.metrics.get("partition-id")  # unchecked, but the best name there is for it
            self.record.rejected(
                server_round, client.cid, str(exc), self.partition_of, self.data_file, claimed
            )
            return None
        self.partition_of[client.cid] = reply.partition_id
        return reply

    def _lost_round(
        self, server_round: int, stats: dict[str, Scalar], why: str = ""
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """A fit round that changed nothing (`why`, logged); MAX_EMPTY_ROUNDS of them in a row end the run."""
        if why:
            log(WARNING, "round %d: %s; the global model is unchanged", server_round, why)
        self.record.lost_rounds.append(server_round)
        self._empty_rounds += 1
        if self._empty_rounds >= MAX_EMPTY_ROUNDS:
            self._stop(f"no usable client replies in {MAX_EMPTY_ROUNDS} consecutive rounds")
        return None, stats

    def _stop(self, reason: str) -> None:
        """The run cannot go on: stop now and say why (status `failed`)."""
        log(WARNING, "stopping: %s", reason)
        self.finished = self.stopped = True
        self.stop_reason = reason
        self.finalize()

    def report_round(self, server_round: int, metrics: dict[str, float] | None = None) -> None:
        """The round's progress line (once per round that did work), with its headline metrics."""
        headline = self.headline_text(metrics) if metrics else None
        self.record.progress(server_round, self.total_rounds, headline)

    def round_done(self, server_round: int) -> None:
        """End of a round (fit and evaluation): summary.json says how far the run got (an entry point that
        is stopped marks it), and a checkpoint when `checkpoint-every` says so (`strategies.checkpoints`)."""
        if self.status == "running":
            self.write_outputs()
        if not self.done:
            self.checkpoint(server_round)

    # ------------------------------------------------------------------------------ end of the run
    @property
    def done(self) -> bool:
        """The server loop may stop: the run broke off, or the method stopped and was evaluated."""
        return self.stopped or (self.finished and self._final_evaluated)

    @property
    def where(self) -> str:
        """Where a running run is (its `phase` in summary.json): an entry point that is stopped names it,
        and its own view (the console's progress lines) lags behind the rounds."""
        if self.done or self.rounds_run >= self.total_rounds:
            return REPORT_PHASE
        return f"in round {self.rounds_run + 1}"

    def finalize(self, failure: str | None = None) -> None:
        """Decide the run's status (`records.run_status`) once and write the final outputs; the server
        loop calls it at the end of the run, with the exception that ended it as `failure`."""
        if self.status == "running" or failure is not None:  # else decided already (a stop)
            if failure is not None:
                failure = f"{failure} (in round {self.rounds_run})"
                self.stop_reason = self.stop_reason or failure
            elif not (self.finished or self.stopped) and self.final_metrics:
                self.stop_reason = f"max rounds ({self.total_rounds})"
            problems = self.record.losses(self.rounds_run, self.finished, self.final_report.problems)
            clipped = self.privacy.secagg_clipped  # a console line each round; the summary says it once
            if clipped:
                self.warn(
                    f"SecAgg+ clipped {clipped} uploaded values to +-{self.cfg.secagg_clip:g} over the run "
                    "(those sums are wrong, not noisy): raise secagg-clip"
                )
            collapsed = self.record.collapse(self.k, self.privacy.collapse_cause()) if self.clusters else None
            if collapsed:  # however the method stopped, a collapsed result is not a clean run
                self.warn(collapsed)
                problems.append(collapsed)
            self.status, self.status_reason = run_status(
                failure, self.stopped, self.finished, bool(self.final_metrics), self.stop_reason, problems
            )
            log(INFO, "%s status: %s (%s)", PROGRESS_MARKER, self.status, self.status_reason)
        self.final_report.write_model()
        self.write_outputs()

    def warn(self, message: str) -> None:
        """Something degraded without failing the run: logged once and listed in summary.json `warnings`."""
        if message not in self.warnings:
            self.warnings.append(message)
            log(WARNING, "%s warning: %s", PROGRESS_MARKER, message)

    def summary(self) -> dict[str, Any]:
        """summary.json: the run's configuration, outcome and records, and the method's own fields."""
        return {
            "method": self.cfg.method,
            "dataset": self.cfg.dataset,
            "num_clients": self.cfg.num_clients or self.roster.clients_seen,
            "rounds": self.rounds_run,
            "seed": self.cfg.seed,
            "k": self.k,
            "metrics": self.final_metrics or {},
            "status": self.status,
            "status_reason": self.status_reason,
            **({"phase": self.where} if self.status == "running" else {}),
            "stop_reason": self.stop_reason,
            "num_rounds": self.cfg.num_rounds,
            "evaluated_rounds": len(self.record.history),
            "excluded_clients": dict(sorted(self.roster.excluded.items())),
            "config": self.effective_config(),
            **self.record.summary(),
            "report": self.final_report.summary,
            **({"k_selection": self.k_choice.summary} if self.k_choice.summary else {}),
            "warnings": self.warnings,
            **self.privacy.summary(),
            **self.extra_summary(),
        }

    def write_outputs(self) -> None:
        """summary.json and rounds.json after every evaluation (the plot: see `RunRecord.write`)."""
        self.record.write(self.out_dir, self.summary(), final=self.status != "running")
