"""Shared server glue for every clustering strategy.

A subclass supplies the method's maths through three hooks — `fit_instructions` (what each client is
sent), `reply_spec` (what a valid reply looks like) and `aggregate` (the server update) — and this class
does the rest: waiting for clients, rejecting malformed or non-finite replies without losing the others,
the communication ledger, evaluation from summed contingency tables, and the run's output files.
"""

from __future__ import annotations

import math
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    log,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from fedapp.checkpoint import RESUME_KEY, checkpoint_dir, load_strategy, save_strategy
from fedapp.client_runtime import SECONDS_KEY
from fedapp.config import RunConfig
from fedapp.ledger import CommLedger, mapping_nbytes, parameters_nbytes
from fedapp.metrics import clustering_metrics, decode_table
from fedapp.protocol import ArraySpec, ReplyError, check_arrays, decode_array
from fedapp.report import SIZES_KEY
from fedapp.results import PROGRESS_MARKER, default_out_dir, write_run_outputs
from strategies.report import ReportingStrategy

CLIENT_WAIT_S = 300
NODE_POLL_S = (0.01, 0.5)  # first and longest pause between looks at the connected clients


def wait_for_clients(client_manager: ClientManager, wanted: int, timeout: float) -> bool:
    """Wait until `wanted` clients are connected; False after `timeout` seconds.

    Flower's grid client manager registers SuperNodes only when it is asked (`num_available`, `all`,
    `sample`) or every 5 s from a background thread, so `ClientManager.wait_for` slept 5 s at the start
    of every `flwr run` even when all nodes were there from the start (Ray simulation). Asking directly,
    with a pause that grows from 10 ms to 0.5 s, finds them as soon as they are there.
    """
    deadline = time.monotonic() + timeout
    pause = NODE_POLL_S[0]
    while client_manager.num_available() < wanted:
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
        pause = min(2 * pause, NODE_POLL_S[1])
    return True


MAX_EMPTY_ROUNDS = 3  # consecutive rounds without one valid reply end the run (clients are broken)
PLOT_EVERY_S = 30.0  # metrics.png is redrawn at most this often while a run is going


class FederationError(RuntimeError):
    """The federation cannot proceed (e.g. too few clients connected)."""


@dataclass
class ClientReply:
    """A validated fit reply."""

    cid: str
    partition_id: int
    arrays: list[np.ndarray]
    num_examples: int
    metrics: dict[str, Scalar] = field(default_factory=dict)


def keep_modal(
    replies: list[ClientReply], server_round: int, value_of: Callable[[ClientReply], Any], what: str
) -> list[ClientReply]:
    """Keep the replies whose `value_of` (a dimension, an image shape) is the most common one.

    Used where the server cannot know that value in advance (a first round): one client with a wrong
    shape is rejected instead of breaking the concatenation of everyone's arrays. Ties go to the smallest
    value, so the outcome never depends on the order replies arrived in.
    """
    values = [value_of(reply) for reply in replies]
    modal = _modal(values)
    for reply, value in zip(replies, values, strict=True):
        if value != modal:
            log(
                WARNING,
                "round %d: rejected client %s: %s %s, others %s",
                server_round,
                reply.cid,
                what,
                value,
                modal,
            )
    return [reply for reply, value in zip(replies, values, strict=True) if value == modal]


def consistent_replies(replies: list[ClientReply], server_round: int, axis: int = 1) -> list[ClientReply]:
    """`keep_modal` on the size of the first array along `axis` (the feature dimension)."""
    return keep_modal(replies, server_round, lambda reply: int(reply.arrays[0].shape[axis]), "dimension")


class ClusteringStrategy(ReportingStrategy, Strategy):
    """Base class: see the module docstring. Subclasses implement `reply_spec` and `aggregate`."""

    method = "base"
    headline_metrics: tuple[str, ...] = ("acc", "nmi")  # shown in the one-line-per-round progress

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.k: int | None = cfg.k or None  # None: clients resolve k = number of classes and report it
        self.ledger = CommLedger()
        self.history: list[dict[str, Any]] = []
        self.out_dir = (
            Path(cfg.out_dir) if cfg.out_dir else default_out_dir(cfg.method, cfg.dataset, cfg.seed)
        )
        self.finished = False  # set by a subclass when its algorithm has converged or is one-shot
        self.stop_reason = ""
        self.final_metrics: dict[str, float] | None = None
        self.rounds_run = 0
        self.clients_seen = 0
        self.partition_of: dict[str, int] = {}  # cid -> partition id, learnt from valid replies
        self._final_evaluated = False
        self._empty_rounds = 0
        self._started = time.perf_counter()
        self._round_started: dict[int, float] = {}  # rounds in which clients were asked to fit
        self._reported: set[int] = set()
        self.participation: dict[int, dict[str, Any]] = {}  # per fit round: sampled / dropped / outcomes
        self.status = "running"  # -> completed | converged | degraded | failed (`finalize`)
        self.status_reason = ""
        self.stopped = False  # the run cannot go on (no valid replies, too few clients): done now
        self.lost_rounds: list[int] = []  # fit rounds that changed nothing
        self.excluded: dict[str, int] = {}  # cid -> the round it failed or timed out in: not asked again
        self.failure_messages: list[str] = []
        self._instructed: dict[int, list[str]] = {}
        self._waited = False
        self._unbooked_wait = 0.0  # seconds spent waiting for clients, not yet taken out of a stopwatch
        self.latest_parameters: Parameters | None = None  # the global model the next round starts from
        self.timing: dict[int, dict[str, float]] = {}  # per round: server, client and remaining seconds
        self._plotted = -PLOT_EVERY_S
        self.resumed_from: int | None = None  # the checkpointed round this run continued after
        self._init_report()

    # ----------------------------------------------------------------------------------------- hooks
    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        """Config sent with every FitIns; subclasses add their phase keys."""
        config: dict[str, Scalar] = {"server-round": server_round}
        if self.k is not None:
            config["k"] = self.k
        if self.resumed_from is not None:  # clients reload the state they had after that round
            config[RESUME_KEY] = self.resumed_from
        return config

    def fit_instructions(
        self, server_round: int, parameters: Parameters, clients: list[ClientProxy]
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Default: the same FitIns for every client (override for per-client content)."""
        ins = FitIns(parameters, self.fit_config(server_round))
        return [(client, ins) for client in clients]

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        raise NotImplementedError

    def expected_arrays(self, server_round: int) -> list[ArraySpec]:
        """What a valid reply of this round holds (the method's `reply_spec`, unless a shared phase such
        as the vertical id alignment takes the round)."""
        return self.reply_spec(server_round)

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        """Cross-reply consistency (e.g. one feature dimension); default: keep all. Dropped = rejected."""
        return replies

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        """Method-specific consistency checks beyond `reply_spec`; raise ReplyError to reject."""

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        raise NotImplementedError

    def evaluation_clients(self, clients: list[ClientProxy]) -> list[ClientProxy]:
        """Who scores the model (default: every client, each on its own samples)."""
        return clients

    def needs_every_client(self, server_round: int) -> bool:
        """Rounds that cannot do without anyone (a vertical initialisation): no simulated dropout there."""
        return False

    def extra_summary(self) -> dict[str, Any]:
        """Method-specific fields for summary.json."""
        return {}

    # ------------------------------------------------------------------------------ Strategy API
    # Flower calls these four; each is timed (summary.json `timing`), the work is in the `_` versions.
    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        with self._stopwatch(server_round, "server_configure_s"):
            return self._configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        self._client_seconds(server_round, "fit", [res.metrics for _, res in results])
        with self._stopwatch(server_round, "server_aggregate_s"):
            return self._aggregate_fit(server_round, results, failures)

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        with self._stopwatch(server_round, "server_configure_s"):
            return self._configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        self._client_seconds(server_round, "evaluate", [res.metrics for _, res in results])
        with self._stopwatch(server_round, "server_aggregate_s"):
            return self._aggregate_evaluate(server_round, results, failures)

    @contextmanager
    def _stopwatch(self, server_round: int, key: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            record = self.timing.setdefault(server_round, {})
            elapsed = time.perf_counter() - started
            if self._unbooked_wait:  # waiting for the clients to connect is start-up, not the round's work
                record["node_wait_s"] = record.get("node_wait_s", 0.0) + self._unbooked_wait
                elapsed -= self._unbooked_wait
                self._unbooked_wait = 0.0
            record[key] = record.get(key, 0.0) + elapsed

    def _client_seconds(self, server_round: int, phase: str, metrics: list[dict[str, Scalar]]) -> None:
        """The compute time the clients report for their own fit / evaluate (slowest and median)."""
        seconds = [float(m[SECONDS_KEY]) for m in metrics if isinstance(m.get(SECONDS_KEY), int | float)]
        if seconds:
            record = self.timing.setdefault(server_round, {})
            record[f"client_{phase}_max_s"] = max(seconds)
            record[f"client_{phase}_median_s"] = float(np.median(seconds))

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        # An empty model: clients must not be asked for initial parameters (the server owns the init).
        return ndarrays_to_parameters([])

    def simulate_dropout(self, server_round: int, clients: list[ClientProxy]) -> list[ClientProxy]:
        """Run-config `dropout-rate`: round(rate * n) clients, drawn from (seed, round), sit this round out.

        They get no fit instruction, as if disconnected (the CCFC paper's Fig. 6); at least one client
        always stays. The draw depends only on the seed, the round and the sorted client ids.
        """
        rate = self.cfg.dropout_rate
        if rate <= 0 or len(clients) <= 1 or self.needs_every_client(server_round):
            return clients
        n_drop = min(round(rate * len(clients)), len(clients) - 1)
        rng = np.random.default_rng([self.cfg.seed, server_round, 0xD20])  # its own stream
        dropped = set(rng.choice(len(clients), size=n_drop, replace=False).tolist())
        kept = [client for index, client in enumerate(clients) if index not in dropped]
        log(
            INFO,
            "round %d: dropout-rate %.2f: %d of %d clients sit out",
            server_round,
            rate,
            n_drop,
            len(clients),
        )
        return kept

    def should_evaluate(self, server_round: int) -> bool:
        """Run-config `eval-every`, plus the last round and the round the method stops in."""
        return (
            self.finished
            or server_round >= self.cfg.num_rounds
            or server_round % self.cfg.evaluation_interval == 0
        )

    def min_fit(self) -> int:
        """Valid replies a fit round needs to count (run-config min-fit-clients / min-fit-fraction)."""
        return max(self.cfg.min_fit_clients, math.ceil(self.cfg.min_fit_fraction * self.clients_seen))

    def _clients(self, client_manager: ClientManager) -> list[ClientProxy]:
        """The connected clients that have not failed in this run, sorted by id.

        Only the first call waits (up to CLIENT_WAIT_S) for `num-clients` SuperNodes; later rounds go on
        with whoever is connected, so a dead SuperNode costs at most one round-timeout.
        """
        if not self._waited:
            wanted = self.cfg.num_clients or 1  # 0: every SuperNode connected when the round starts
            started = time.perf_counter()
            if not wait_for_clients(client_manager, wanted, CLIENT_WAIT_S):
                raise FederationError(
                    f"run-config num-clients={wanted} but only {client_manager.num_available()} client(s) "
                    f"connected after {CLIENT_WAIT_S} s: start the simulation with num-supernodes={wanted} "
                    f"or start {wanted} SuperNodes"
                )
            self._unbooked_wait += time.perf_counter() - started
            self._waited = True
        clients = sorted(client_manager.all().values(), key=lambda proxy: proxy.cid)
        self.clients_seen = max(self.clients_seen, len(clients))
        if self.cfg.num_clients and len(clients) > self.cfg.num_clients:
            log(
                WARNING,
                "%d clients connected but num-clients=%d; using all",
                len(clients),
                self.cfg.num_clients,
            )
        return [client for client in clients if client.cid not in self.excluded]

    def _stop(self, reason: str) -> None:
        """The run cannot go on: stop now and say why (status `failed`)."""
        log(WARNING, "stopping: %s", reason)
        self.finished = self.stopped = True
        self.stop_reason = reason
        self.finalize()

    def _configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        if self.finished:
            return []
        clients = self._clients(client_manager)
        if len(clients) < self.min_fit():
            lost = ", ".join(f"{cid} (round {r})" for cid, r in sorted(self.excluded.items())) or "none"
            detail = f"; first error: {self.failure_messages[0]}" if self.failure_messages else ""
            self._stop(
                f"only {len(clients)} usable client(s) before round {server_round}, {self.min_fit()} needed "
                f"(failed or timed out: {lost}){detail}"
            )
            return []
        available = self.simulate_dropout(server_round, clients)
        self.participation[server_round] = {
            "sampled": [client.cid for client in clients],
            "dropped": sorted(set(client.cid for client in clients) - {c.cid for c in available}),
            "excluded": sorted(self.excluded),
        }
        instructions = self.fit_instructions(server_round, parameters, available)
        self._instructed[server_round] = [client.cid for client, _ in instructions]
        if instructions:
            self._round_started[server_round] = time.perf_counter()
        for client, ins in instructions:
            down = parameters_nbytes(ins.parameters) + mapping_nbytes(ins.config)
            self.ledger.record(server_round, client.cid, "fit", down=down)
        return instructions

    def _aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        self.rounds_run = server_round
        replied = {client.cid for client, _ in results}
        failed = sorted(set(self._instructed.get(server_round, [])) - replied)  # errors and timeouts
        for failure in failures:
            message = _describe_failure(failure)
            self.failure_messages.append(message)
            log(WARNING, "round %d: client failure: %s", server_round, message)
        for cid in failed:
            self.excluded.setdefault(cid, server_round)
            log(WARNING, "round %d: client %s failed or timed out; it is not asked again", server_round, cid)
        if self.k is None:
            self.k = _consensus_k(results)
        replies, rejected = [], 0
        for client, res in results:
            up = parameters_nbytes(res.parameters) + mapping_nbytes(res.metrics)
            self.ledger.record(server_round, client.cid, "fit", up=up)
            try:
                replies.append(self._validated(server_round, client, res))
            except ReplyError as exc:
                rejected += 1
                log(WARNING, "round %d: rejected reply from client %s: %s", server_round, client.cid, exc)
        replies.sort(key=lambda reply: (reply.partition_id, reply.cid))  # arrival order is not deterministic
        consistent = self.consistent(server_round, replies) if replies else []
        rejected += len(replies) - len(consistent)
        stats: dict[str, Scalar] = {
            "accepted": len(consistent),
            "rejected": rejected,
            "failures": len(failures),
        }
        accepted = {reply.cid for reply in consistent}
        self.participation.setdefault(server_round, {}).update(
            accepted=sorted(accepted), rejected=sorted(replied - accepted), failed=failed
        )
        if len(consistent) < self.min_fit():
            log(
                WARNING,
                "round %d: %d valid repl(y/ies), %d needed; the global model is unchanged",
                server_round,
                len(consistent),
                self.min_fit(),
            )
            return self._lost_round(server_round, stats)
        self._empty_rounds = 0
        try:
            parameters = self.aggregate(server_round, consistent)
            if parameters is not None:
                self.latest_parameters = parameters
            return parameters, stats
        except ValueError as exc:
            # e.g. too few valid replies left for k clusters: skip the round, keep the run
            log(
                WARNING,
                "round %d: aggregation skipped (%s); the global model is unchanged",
                server_round,
                exc,
            )
            return self._lost_round(server_round, {**stats, "accepted": 0})

    def _lost_round(
        self, server_round: int, stats: dict[str, Scalar]
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """A fit round that changed nothing; MAX_EMPTY_ROUNDS of them in a row end the run."""
        self.lost_rounds.append(server_round)
        self._empty_rounds += 1
        if self._empty_rounds >= MAX_EMPTY_ROUNDS:
            self._stop(f"no usable client replies in {MAX_EMPTY_ROUNDS} consecutive rounds")
        return None, stats

    def _validated(self, server_round: int, client: ClientProxy, res: FitRes) -> ClientReply:
        specs = self.expected_arrays(server_round)
        size, limit = parameters_nbytes(res.parameters), _max_bytes(specs)
        if size > limit:  # checked on the raw bytes: an oversized reply is never decoded
            raise ReplyError(f"oversized reply: {size} bytes, at most {limit} expected")
        try:
            arrays = parameters_to_ndarrays(res.parameters)
        except Exception as exc:  # malformed bytes from a client must not crash the server
            raise ReplyError(f"undecodable parameters: {exc}") from exc
        check_arrays(arrays, specs)
        partition_id = res.metrics.get("partition-id")
        if not isinstance(partition_id, int):
            raise ReplyError("metrics lack an integer 'partition-id'")
        reported_k = res.metrics.get("k")
        if self.k is None:
            raise ReplyError("the number of clusters is unknown: run-config k=0 and no client reported 'k'")
        if reported_k is not None and reported_k != self.k:
            raise ReplyError(f"client uses k={reported_k!r}, the federation uses k={self.k}")
        reply = ClientReply(client.cid, partition_id, arrays, int(res.num_examples), dict(res.metrics))
        self.check_reply(server_round, reply)
        self.partition_of[client.cid] = partition_id
        return reply

    def _configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if self._final_evaluated or not parameters.tensors or not self.should_evaluate(server_round):
            self.report_round(server_round)
            return []
        ins = EvaluateIns(parameters, {"server-round": server_round})
        instructions = [(client, ins) for client in self.evaluation_clients(self._clients(client_manager))]
        for client, _ in instructions:
            down = parameters_nbytes(ins.parameters) + mapping_nbytes(ins.config)
            self.ledger.record(server_round, client.cid, "evaluate", down=down)
        return instructions

    def _aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        for failure in failures:
            log(WARNING, "round %d: evaluation failure: %s", server_round, _describe_failure(failure))
        tables: list[tuple[str, np.ndarray]] = []
        unlabelled: list[np.ndarray] = []  # cluster sizes of clients without labels
        for client, res in sorted(results, key=lambda item: item[0].cid):
            self.ledger.record(server_round, client.cid, "evaluate", up=mapping_nbytes(res.metrics))
            try:
                if SIZES_KEY in res.metrics and "table" not in res.metrics:
                    unlabelled.append(_sizes_from(res, self.k))
                else:
                    tables.append((client.cid, _table_from(res)))
            except ValueError as exc:
                log(
                    WARNING, "round %d: rejected evaluation from client %s: %s", server_round, client.cid, exc
                )
        total: np.ndarray | None = None
        if tables:
            shape = _modal([table.shape for _, table in tables])  # one odd client cannot set the shape
            for cid, table in tables:
                if table.shape != shape:
                    log(
                        WARNING,
                        "round %d: table shape %s from %s != %s",
                        server_round,
                        table.shape,
                        cid,
                        shape,
                    )
                    continue
                total = table if total is None else total + table
        if total is None and unlabelled:  # nobody has labels: what the clustering looks like, by size
            sizes = np.sum(unlabelled, axis=0)
            metrics = size_metrics(sizes)
            self.record_evaluation(server_round, metrics, evaluated=0, cluster_sizes=sizes.tolist())
            return None, dict(metrics)
        if total is None:
            log(WARNING, "round %d: no valid evaluation reply", server_round)
            self.report_round(server_round)
            return None, {}
        metrics = clustering_metrics(total)
        self.record_evaluation(server_round, metrics, evaluated=int(total.sum()))
        return None, dict(metrics)

    def record_evaluation(self, server_round: int, metrics: dict[str, float], **details: Any) -> None:
        """Keep one round's evaluation (history, progress line, output files); strategies with their own
        metrics (topic models) call this from their `aggregate_evaluate` too."""
        self.final_metrics = metrics
        self.history.append(
            {
                "round": server_round,
                "metrics": metrics,
                **details,
                "elapsed_s": time.perf_counter() - self._started,
            }
        )
        log(
            INFO,
            "round %d: %s",
            server_round,
            "  ".join(f"{key}={value:.4g}" for key, value in metrics.items()),
        )
        self.report_round(server_round, metrics)
        if self.finished:
            self._final_evaluated = True
        self.write_outputs()

    def report_round(self, server_round: int, metrics: dict[str, float] | None = None) -> None:
        """One progress line per round that did work: round, seconds, headline metrics, bytes, clients."""
        if server_round in self._reported or server_round not in self._round_started:
            return
        self._reported.add(server_round)
        seconds = time.perf_counter() - self._round_started[server_round]
        record = self.timing.setdefault(server_round, {})
        record["round_s"] = seconds
        spent = sum(record.get(key, 0.0) for key in ("server_configure_s", "server_aggregate_s"))
        spent += record.get("client_fit_max_s", 0.0) + record.get("client_evaluate_max_s", 0.0)
        record["rest_s"] = max(seconds - spent, 0.0)  # transport, scheduling, waiting
        traffic = self.ledger.round_totals().get(server_round, {"up": 0, "down": 0})
        parts = [f"round {server_round}/{self.cfg.num_rounds}", f"{seconds:6.2f} s"]
        if metrics:
            parts.append(self.headline_text(metrics))
        parts.append(f"up {_human_bytes(traffic['up'])} down {_human_bytes(traffic['down'])}")
        record = self.participation.get(server_round, {})
        if "accepted" in record:
            clients = f"{len(record['accepted'])}/{len(record['sampled'])} clients"
            problems = [
                f"{len(record[key])} {word}"
                for key, word in (("dropped", "sat out"), ("rejected", "rejected"), ("failed", "failed"))
                if record[key]
            ]
            parts.append(clients + (f" ({', '.join(problems)})" if problems else ""))
        log(INFO, "%s %s", PROGRESS_MARKER, " | ".join(parts))

    def headline_text(self, metrics: dict[str, float]) -> str:
        """The headline metrics in the progress line (percentages; methods with other scales override)."""
        if not any(key in metrics for key in self.headline_metrics):  # unlabelled: sizes only
            used, largest = metrics.get("clusters_used", 0.0), metrics.get("largest_share", 0.0)
            return f"clusters used {used:.0f} largest {100 * largest:.1f}%"
        return " ".join(f"{key} {100 * metrics[key]:.2f}" for key in self.headline_metrics if key in metrics)

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None  # no server-side data: evaluation is federated (contingency tables)

    # ----------------------------------------------------------------------------- checkpoints
    def round_done(self, server_round: int) -> None:
        """End of a round (fit and evaluation): checkpoint when `checkpoint-every` says so."""
        every = self.cfg.checkpoint_every
        if not every or server_round % every or self.done:
            return
        state = {key: value for key, value in self.__dict__.items() if key != "cfg"}
        state["_elapsed"] = time.perf_counter() - self._started
        try:
            save_strategy(checkpoint_dir(self.cfg, self.out_dir), server_round, state)
        except (pickle.PicklingError, TypeError, AttributeError, OSError) as exc:
            log(
                WARNING,
                "round %d: checkpoint failed (%s); checkpointing is off for this run",
                server_round,
                exc,
            )
            self.cfg = replace(self.cfg, checkpoint_every=0)

    def restore(self) -> int:
        """Load the last checkpoint (run-config `resume`); returns the round to continue after."""
        server_round, state = load_strategy(checkpoint_dir(self.cfg, self.out_dir))
        elapsed = state.pop("_elapsed", 0.0)
        self.__dict__.update(state)  # everything but the configuration, which this run may change
        self._started = time.perf_counter() - elapsed
        self.status, self.resumed_from = "running", server_round
        log(INFO, "%s resumed after round %d of %d", PROGRESS_MARKER, server_round, self.cfg.num_rounds)
        return server_round

    def resume_point(self) -> tuple[int, Parameters | None]:
        """(rounds already done, the global model to continue from): (0, None) for a fresh run."""
        return (self.resumed_from or 0), self.latest_parameters

    # ------------------------------------------------------------------------------ end of the run
    @property
    def done(self) -> bool:
        """The server loop may stop: the run broke off, or the method stopped and was evaluated."""
        return self.stopped or (self.finished and self._final_evaluated)

    def finalize(self, failure: str | None = None) -> None:
        """Decide the run's status honestly and write the final outputs (`fedapp.server_loop` calls it).

        failed: an exception, a stop for lack of usable clients or replies, or no evaluation at all.
        degraded: it finished, but lost clients (sat out, failed, timed out, rejected) or rounds on the way.
        converged: the method stopped by its own rule (one-shot, a convergence threshold).
        completed: every configured round ran with every client.
        """
        if self.status != "running" and failure is None:  # already decided (a stop), the loop confirms
            self.write_model()
            self.write_outputs()
            return
        if failure is not None:
            self.status, self.status_reason = "failed", f"{failure} (in round {self.rounds_run})"
            self.stop_reason = self.stop_reason or self.status_reason
        elif self.stopped:
            self.status, self.status_reason = "failed", self.stop_reason
        elif not self.final_metrics:
            self.status, self.status_reason = "failed", "no evaluation succeeded"
        else:
            problems = self._losses()
            if not self.finished:
                self.stop_reason = f"max rounds ({self.cfg.num_rounds})"
            if problems:
                self.status, self.status_reason = "degraded", "; ".join(problems)
            elif self.finished:
                self.status, self.status_reason = "converged", self.stop_reason
            else:
                self.status, self.status_reason = "completed", self.stop_reason
        log(INFO, "%s status: %s (%s)", PROGRESS_MARKER, self.status, self.status_reason)
        self.write_model()
        self.write_outputs()

    def _losses(self) -> list[str]:
        """What the run lost: rounds that changed nothing, clients that missed rounds, a stale evaluation."""
        problems = []
        if self.lost_rounds:
            problems.append(f"{len(self.lost_rounds)} of {self.rounds_run} fit rounds changed nothing")
        for key, words in (
            ("dropped", "sat out"),
            ("failed", "failed or timed out"),
            ("rejected", "rejected"),
        ):
            missed = sum(len(record.get(key, [])) for record in self.participation.values())
            if missed:
                problems.append(f"{missed} client-rounds {words}")
        if self.failure_messages:  # why, in the clients' own words (a node's bad file names itself)
            problems.append("first client error: " + self.failure_messages[0][:300])
        for stage, cids in self.report.get("problems", {}).items():
            problems.append(
                f"{len(cids)} client(s) missing from the final report ({stage}): {', '.join(cids)}"
            )
        last_evaluated = self.history[-1]["round"] if self.history else 0
        if self.finished is False and last_evaluated < self.rounds_run:
            problems.append(f"the last evaluation is from round {last_evaluated} of {self.rounds_run}")
        return problems

    # ---------------------------------------------------------------------------------- outputs
    def summary(self) -> dict[str, Any]:
        return {
            "method": self.cfg.method,
            "dataset": self.cfg.dataset,
            "num_clients": self.cfg.num_clients or self.clients_seen,
            "rounds": self.rounds_run,
            "seed": self.cfg.seed,
            "k": self.k,
            "metrics": self.final_metrics or {},
            "comm_bytes": self.ledger.summary(),
            "wall_seconds": time.perf_counter() - self._started,
            "status": self.status,
            "status_reason": self.status_reason,
            "stop_reason": self.stop_reason,
            "num_rounds": self.cfg.num_rounds,
            "excluded_clients": dict(sorted(self.excluded.items())),
            "failure_messages": self.failure_messages,
            "config": self.cfg.to_dict(),
            "participation": {str(r): record for r, record in sorted(self.participation.items())},
            "timing": {str(r): record for r, record in sorted(self.timing.items())},
            "report": self.report,
            **self.extra_summary(),
        }

    def write_outputs(self) -> None:
        """The JSON files after every evaluation; the plot at most every PLOT_EVERY_S and at the end
        (redrawing it each round cost ~0.3 s of a 0.2 s round)."""
        now = time.perf_counter()
        plot = self.status != "running" or now - self._plotted >= PLOT_EVERY_S
        write_run_outputs(self.out_dir, self.summary(), self.history, plot=plot)
        if plot:
            self._plotted = now


MAX_REPLY_BYTES = 1 << 31  # a reply whose arrays have open dimensions is still never allowed past 2 GiB
_NPY_OVERHEAD = 256  # bytes of the .npy header Flower's serialisation adds per array (at most)


def _max_bytes(specs: Sequence[ArraySpec]) -> int:
    """A bound on the serialised size of a reply matching `specs`, with room to spare (twice 8 bytes an
    element): far larger replies are refused undecoded, nearer misses get the exact shape error."""
    if any(dim is None for spec in specs for dim in spec.shape):
        return MAX_REPLY_BYTES
    return 2 * sum(8 * math.prod(spec.shape) + _NPY_OVERHEAD for spec in specs)  # type: ignore[arg-type]


def _human_bytes(count: int) -> str:
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def _modal(values: list[Any]) -> Any:
    """Most common value; ties go to the smallest, so the result never depends on arrival order."""
    counts: dict[Any, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return min(counts, key=lambda value: (-counts[value], value))


def _consensus_k(results: list[tuple[ClientProxy, FitRes]]) -> int | None:
    """k = number of classes as most clients report it (run-config k = 0); None if nobody reports one."""
    reported = [res.metrics.get("k") for _, res in results]
    valid = [k for k in reported if isinstance(k, int) and not isinstance(k, bool) and k > 0]
    return _modal(valid) if valid else None


def size_metrics(sizes: np.ndarray) -> dict[str, float]:
    """What an unlabelled evaluation can say: how many clusters hold records, the largest one's share."""
    total = max(int(sizes.sum()), 1)
    return {"clusters_used": float((sizes > 0).sum()), "largest_share": float(sizes.max(initial=0) / total)}


def _sizes_from(res: EvaluateRes, k: int | None) -> np.ndarray:
    sizes = decode_array(res.metrics.get(SIZES_KEY))  # type: ignore[arg-type]
    if sizes.ndim != 1 or (k is not None and sizes.shape != (k,)) or sizes.dtype.kind not in "iu":
        raise ValueError(f"cluster sizes of shape {sizes.shape} {sizes.dtype}")
    if (sizes < 0).any() or int(sizes.sum()) != res.num_examples:
        raise ValueError("cluster sizes are negative or do not add up to the client's records")
    return sizes.astype(np.int64)


def _table_from(res: EvaluateRes) -> np.ndarray:
    blob = res.metrics.get("table")
    if not isinstance(blob, bytes):
        raise ValueError("metrics lack a 'table' (bytes)")
    table = decode_table(blob)
    if table.ndim != 2 or (table < 0).any():
        raise ValueError(f"invalid contingency table of shape {table.shape}")
    return table


def _describe_failure(failure: tuple[ClientProxy, FitRes | EvaluateRes] | BaseException) -> str:
    if isinstance(failure, BaseException):
        return f"{type(failure).__name__}: {failure}"
    client, res = failure
    return f"client {client.cid}: {res.status.code.name} {res.status.message}"
