"""What a run records about itself for `summary.json` and `rounds.json`.

`RunRecord` is owned by `ClusteringStrategy` (`strategy.record`) and knows nothing of any method: the
communication ledger, the evaluations (history), who took part in each fit round, where each round's
time went (server, clients, the rest), the one progress line per round, and what the run lost on the
way (the `degraded` status). Its `state_dict` is part of the strategy's checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import EvaluateRes, FitRes, Scalar, log
from flwr.server.client_proxy import ClientProxy

from fedapp.app.managed_client import RAY_NODE_KEY, SECONDS_KEY
from fedapp.report.ledger import CommLedger, mapping_nbytes, parameters_nbytes
from fedapp.report.records import PROGRESS_MARKER, write_run_outputs
from strategies.failures import failure_line
from strategies.replies import describe_failure

PLOT_EVERY_S = 30.0  # metrics.png is redrawn at most this often while a run is going
MISSED = (("dropped", "sat out"), ("rejected", "rejected"), ("failed", "failed"))  # participation keys


class RunRecord:
    """A run's records (see the module docstring)."""

    def __init__(self) -> None:
        self.ledger = CommLedger()
        self.history: list[dict[str, Any]] = []  # one entry per evaluated round
        self.participation: dict[int, dict[str, Any]] = {}  # per fit round: sampled / dropped / outcomes
        self.timing: dict[int, dict[str, float]] = {}  # per round: server, client and remaining seconds
        self.lost_rounds: list[int] = []  # fit rounds that changed nothing
        self.failure_messages: list[str] = []  # the clients' own words, in the order they came
        self.ray_nodes: dict[str, set[int]] = {}  # Ray simulation: node id -> the partitions it ran fits of
        self.rejections: list[str] = []  # fit replies refused, each naming its client and why
        self.evaluation_failures: list[str] = []  # evaluations that failed, in the clients' words
        self.round_started: dict[int, float] = {}  # rounds in which clients were asked to fit
        self.started = time.perf_counter()
        self._reported: set[int] = set()
        self._unbooked_wait = 0.0  # seconds spent waiting for clients, not yet taken out of a stopwatch
        self._plotted = -PLOT_EVERY_S

    @property
    def elapsed(self) -> float:
        """Seconds since the run started (a resumed run counts the time before its checkpoint too)."""
        return time.perf_counter() - self.started

    # ------------------------------------------------------------------------------------------ timing
    @contextmanager
    def stopwatch(self, server_round: int, key: str) -> Iterator[None]:
        """Add the seconds of the `with` block to `timing[server_round][key]`."""
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

    def book_wait(self, seconds: float) -> None:
        """Seconds spent inside the running stopwatch waiting for clients to connect."""
        self._unbooked_wait += seconds

    def client_seconds(self, server_round: int, phase: str, metrics: list[dict[str, Scalar]]) -> None:
        """The compute time the clients report for their own fit / evaluate (slowest and median)."""
        seconds = [float(m[SECONDS_KEY]) for m in metrics if isinstance(m.get(SECONDS_KEY), int | float)]
        if seconds:
            record = self.timing.setdefault(server_round, {})
            record[f"client_{phase}_max_s"] = max(seconds)
            record[f"client_{phase}_median_s"] = float(np.median(seconds))

    def placement(self, metrics: list[dict[str, Scalar]]) -> None:
        """Which Ray node ran each client's fit (the `ray-node` its reply carries in a Ray simulation)."""
        for reply in metrics:
            node, partition = reply.get(RAY_NODE_KEY), reply.get("partition-id")
            if isinstance(node, str) and isinstance(partition, int):
                self.ray_nodes.setdefault(node, set()).add(partition)

    # ------------------------------------------------------------------------------- communication
    def sent(self, server_round: int, phase: str, instructions: Sequence[tuple[ClientProxy, Any]]) -> None:
        """Book each instruction's bytes (parameters and config) in the ledger, as `phase` traffic."""
        for client, ins in instructions:
            down = parameters_nbytes(ins.parameters) + mapping_nbytes(ins.config)
            self.ledger.record(server_round, client.cid, phase, down=down)

    def received(self, server_round: int, phase: str, results: Sequence[tuple[ClientProxy, Any]]) -> None:
        """Book each reply's bytes (parameters of a fit reply, metrics) in the ledger."""
        for client, res in results:  # `ray-node` is the simulation's bookkeeping: a deployment sends none
            up = mapping_nbytes({key: value for key, value in res.metrics.items() if key != RAY_NODE_KEY})
            if isinstance(res, FitRes):
                up += parameters_nbytes(res.parameters)
            self.ledger.record(server_round, client.cid, phase, up=up)

    # ------------------------------------------------------------------------------------ the rounds
    def sampled(self, server_round: int, sampled: list[str], kept: list[str], excluded: list[str]) -> None:
        """Who could take part in a fit round, who sat it out (dropout) and who had been excluded."""
        self.participation[server_round] = {
            "sampled": sampled,
            "dropped": sorted(set(sampled) - set(kept)),
            "excluded": excluded,
        }

    def start_round(self, server_round: int) -> None:
        """Clients were asked to fit: the round's clock (`round_s`) starts."""
        self.round_started[server_round] = time.perf_counter()

    def failures(
        self,
        server_round: int,
        failures: list[tuple[ClientProxy, FitRes | EvaluateRes] | BaseException],
        partition_of: Mapping[str, int] | None = None,
        file_of: Callable[[int], str | None] | None = None,
        *,
        stage: str = "fit",
    ) -> None:
        """Show why clients failed a round on the console, one line each (partition id, file, the client's
        own cause: `strategies.failures`), and keep a fit round's; the full text is in flower.log."""
        for failure in failures:
            line = failure_line(describe_failure(failure), partition_of, file_of)
            (self.failure_messages if stage == "fit" else self.evaluation_failures).append(line)
            kind = "client" if stage == "fit" else "evaluation"
            log(WARNING, "%s %s failure in round %d: %s", PROGRESS_MARKER, kind, server_round, line)

    def rejected(
        self,
        server_round: int,
        cid: str,
        why: str,
        partition_of: Mapping[str, int],
        file_of: Callable[[int], str | None] | None = None,
        claimed: object = None,
    ) -> None:
        """A fit reply that failed validation, on the console and kept, naming its client: the partition
        id learnt from its earlier valid replies, else its node id and the partition id it `claimed` in
        this reply (unchecked: a client may claim another's)."""
        line = failure_line(f"client {cid}: reply rejected: {why}", partition_of, file_of)
        if cid not in partition_of and isinstance(claimed, int) and not isinstance(claimed, bool):
            line = line.replace("(partition-id unknown)", f"(claims partition-id {claimed})", 1)
        self.rejections.append(line)
        log(WARNING, "%s rejected reply in round %d: %s", PROGRESS_MARKER, server_round, line)

    def outcome(self, server_round: int, accepted: list[str], rejected: list[str], failed: list[str]) -> None:
        self.participation.setdefault(server_round, {}).update(
            accepted=accepted, rejected=rejected, failed=failed
        )

    def evaluation(self, server_round: int, metrics: dict[str, float], details: dict[str, Any]) -> None:
        """One evaluated round in the history (rounds.json)."""
        self.history.append({"round": server_round, "metrics": metrics, **details, "elapsed_s": self.elapsed})
        log(
            INFO,
            "round %d: %s",
            server_round,
            "  ".join(f"{key}={value:.4g}" for key, value in metrics.items()),
        )

    def progress(self, server_round: int, num_rounds: int, headline: str | None) -> None:
        """One progress line per round that did work: round, seconds, headline metrics, bytes, clients."""
        if server_round in self._reported or server_round not in self.round_started:
            return
        self._reported.add(server_round)
        seconds = time.perf_counter() - self.round_started[server_round]
        record = self.timing.setdefault(server_round, {})
        record["round_s"] = seconds
        spent = sum(record.get(key, 0.0) for key in ("server_configure_s", "server_aggregate_s"))
        spent += record.get("client_fit_max_s", 0.0) + record.get("client_evaluate_max_s", 0.0)
        record["rest_s"] = max(seconds - spent, 0.0)  # transport, scheduling, waiting
        traffic = self.ledger.round_totals().get(server_round, {"up": 0, "down": 0})
        parts = [f"round {server_round}/{num_rounds}", f"{seconds:6.2f} s"]
        if headline:
            parts.append(headline)
        parts.append(f"up {human_bytes(traffic['up'])} down {human_bytes(traffic['down'])}")
        taken = self.participation.get(server_round, {})
        if "accepted" in taken:
            clients = f"{len(taken['accepted'])}/{len(taken['sampled'])} clients"
            problems = [f"{len(taken[key])} {word}" for key, word in MISSED if taken[key]]
            parts.append(clients + (f" ({', '.join(problems)})" if problems else ""))
        log(INFO, "%s %s", PROGRESS_MARKER, " | ".join(parts))

    # ---------------------------------------------------------------------------------- end of the run
    def losses(self, rounds_run: int, finished: bool, report_problems: dict[str, list[str]]) -> list[str]:
        """What the run lost: rounds that changed nothing, clients that missed rounds, a stale evaluation."""
        problems = []
        if self.lost_rounds:
            problems.append(f"{len(self.lost_rounds)} of {rounds_run} fit rounds changed nothing")
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
        if self.rejections:
            problems.append("first rejected reply: " + self.rejections[0][:300])
        if self.evaluation_failures:
            first = self.evaluation_failures[0][:300]
            problems.append(f"{len(self.evaluation_failures)} client evaluation(s) failed; first: {first}")
        for stage, cids in report_problems.items():
            problems.append(
                f"{len(cids)} client(s) missing from the final report ({stage}): {', '.join(cids)}"
            )
        last_evaluated = self.history[-1]["round"] if self.history else 0
        if finished is False and last_evaluated < rounds_run:
            problems.append(f"the last evaluation is from round {last_evaluated} of {rounds_run}")
        return problems

    def collapse(self, k: int | None, cause: str) -> str | None:
        """A result that collapsed: the last evaluation used fewer than half of the k clusters (every
        record in a few clusters is no clustering, however the run ended); None otherwise or unknown."""
        if not k or not self.history:
            return None
        last = self.history[-1]
        used = last.get("clusters_used", last["metrics"].get("clusters_used"))
        if used is None or used >= k / 2:
            return None
        return f"the result collapsed: {int(used)} of {k} clusters hold records ({cause})"

    def summary(self) -> dict[str, Any]:
        """The records' part of summary.json."""
        return {
            "comm_bytes": self.ledger.summary(),
            "wall_seconds": self.elapsed,
            "failure_messages": self.failure_messages,
            "rejections": self.rejections,
            "evaluation_failures": self.evaluation_failures,
            "participation": {str(r): taken for r, taken in sorted(self.participation.items())},
            "timing": {str(r): seconds for r, seconds in sorted(self.timing.items())},
            **(
                {"ray_nodes": {node: sorted(ids) for node, ids in sorted(self.ray_nodes.items())}}
                if self.ray_nodes
                else {}
            ),
        }

    def write(self, out_dir: Path, summary: dict[str, Any], final: bool) -> None:
        """The JSON files after every evaluation, on one line until the final, indented write; the plot at
        most every PLOT_EVERY_S and at the end (redrawing it each round cost ~0.3 s of a 0.2 s round)."""
        now = time.perf_counter()
        plot = final or now - self._plotted >= PLOT_EVERY_S
        write_run_outputs(out_dir, summary, self.history, plot=plot, compact=not final)
        if plot:
            self._plotted = now

    # ------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "ledger": self.ledger.rounds,
            "history": self.history,
            "participation": self.participation,
            "timing": self.timing,
            "lost_rounds": self.lost_rounds,
            "failure_messages": self.failure_messages,
            "ray_nodes": {node: sorted(ids) for node, ids in self.ray_nodes.items()},
            "rejections": self.rejections,
            "evaluation_failures": self.evaluation_failures,
            "elapsed": self.elapsed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ledger = CommLedger(state["ledger"])
        self.history, self.participation = state["history"], state["participation"]
        self.timing, self.lost_rounds = state["timing"], state["lost_rounds"]
        self.failure_messages = state["failure_messages"]
        self.ray_nodes = {node: set(ids) for node, ids in state.get("ray_nodes", {}).items()}
        self.rejections = state.get("rejections", [])  # checkpoints from before they were kept: none
        self.evaluation_failures = state.get("evaluation_failures", [])
        self.started = time.perf_counter() - state["elapsed"]


def run_status(
    failure: str | None, stopped: bool, finished: bool, evaluated: bool, stop_reason: str, problems: list[str]
) -> tuple[str, str]:
    """(status, reason) of a run that ended.

    failed: an exception, a stop for lack of usable clients or replies, or no evaluation at all.
    degraded: it finished, but lost clients (sat out, failed, timed out, rejected) or rounds on the way.
    converged: the method stopped by its own rule (one-shot, a convergence threshold).
    completed: every configured round ran with every client.
    """
    if failure is not None:
        return "failed", failure
    if stopped:
        return "failed", stop_reason
    if not evaluated:
        return "failed", "no evaluation succeeded"
    if problems:
        return "degraded", "; ".join(problems)
    return ("converged" if finished else "completed"), stop_reason


def human_bytes(count: int) -> str:
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"
