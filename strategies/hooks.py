"""The hooks a method overrides: what each client is sent, what a valid reply is, the server update, and
how the model is evaluated. `ClusteringStrategy` calls them from Flower's Strategy flow.

Every hook has a default except `reply_spec` and `aggregate`. In the order a round calls them:
`fit_config` / `fit_instructions` -> `expected_arrays` (`reply_spec`) -> `check_reply` -> `consistent`
-> `aggregate` -> `should_evaluate` -> `evaluation_instructions` (`evaluation_clients`) ->
`evaluation_metrics` -> `headline_text`; `extra_summary` adds a method's fields to summary.json. After the
last round the final report (`strategies.report`) asks `report_parameters`, `report_views` and
`model_description`.
"""

from __future__ import annotations

from typing import Any

from flwr.common import EvaluateIns, EvaluateRes, FitIns, Parameters, Scalar
from flwr.server.client_proxy import ClientProxy

from fedapp.app.checkpoint import RESUME_KEY
from fedapp.config.run import RunConfig
from fedapp.report.keep import StartCandidate
from fedapp.wire import ArraySpec
from strategies.replies import ClientReply, contingency_evaluation


class StrategyHooks:
    """The method interface of `ClusteringStrategy` (see the module docstring)."""

    method = "base"
    headline_metrics: tuple[str, ...] = ("acc", "nmi")  # shown in the one-line-per-round progress
    clusters = True  # its result is a clustering: one using fewer than k / 2 clusters is a fault
    cfg: RunConfig  # the attributes below are set by `ClusteringStrategy.__init__`
    k: int | None
    finished: bool
    resumed_from: int | None
    latest_parameters: Parameters | None

    # ------------------------------------------------------------------------------------------- fit
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

    def needs_every_client(self, server_round: int) -> bool:
        """Rounds that cannot do without anyone (a vertical initialisation): no simulated dropout there."""
        return False

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        """The arrays a valid fit reply of this round holds."""
        raise NotImplementedError

    def expected_arrays(self, server_round: int) -> list[ArraySpec]:
        """What a valid reply of this round holds (the method's `reply_spec`, unless a shared phase such
        as the vertical id alignment takes the round)."""
        return self.reply_spec(server_round)

    def sends_releases(self, server_round: int) -> bool:
        """Whether this round's fit replies are DP releases under DP (default: every fit reply is; a
        setup or vocabulary round that no noise covers says no, and summary.json names it)."""
        return True

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        """Method-specific consistency checks beyond `reply_spec`; raise ReplyError to reject."""

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        """Cross-reply consistency (e.g. one feature dimension); default: keep all. Dropped = rejected."""
        return replies

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        """The server update from the round's valid replies; the new global model (None: unchanged).
        A ValueError skips the round and keeps the run."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------ evaluation
    def should_evaluate(self, server_round: int) -> bool:
        """Run-config `eval-every`, plus the last round and the round the method stops in."""
        return (
            self.finished
            or server_round >= self.total_rounds
            or server_round % self.cfg.evaluation_interval == 0
        )

    def evaluation_clients(self, clients: list[ClientProxy]) -> list[ClientProxy]:
        """Who scores the model (default: every client, each on its own samples)."""
        return clients

    def evaluation_instructions(
        self, server_round: int, parameters: Parameters, clients: list[ClientProxy]
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Default: the global model to each of `evaluation_clients`, scored on the client's own samples."""
        ins = EvaluateIns(parameters, {"server-round": server_round})
        return [(client, ins) for client in self.evaluation_clients(clients)]

    def evaluation_metrics(
        self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]]
    ) -> tuple[dict[str, float], dict[str, Any]] | None:
        """(metrics, details for the history) from the evaluation replies, sorted by client id; None when
        nothing usable came back. Default: the summed contingency tables (or cluster sizes)."""
        return contingency_evaluation(server_round, results, self.k)

    def headline_text(self, metrics: dict[str, float]) -> str:
        """The headline metrics in the progress line (percentages; methods with other scales override)."""
        if not any(key in metrics for key in self.headline_metrics):  # unlabelled: sizes only
            used, largest = metrics.get("clusters_used", 0.0), metrics.get("largest_share", 0.0)
            return f"clusters used {used:.0f} largest {100 * largest:.1f}%"
        return " ".join(f"{key} {100 * metrics[key]:.2f}" for key in self.headline_metrics if key in metrics)

    def effective_config(self) -> dict[str, Any]:
        """summary.json's and model.json's `config`: the run config, with the value a method actually used
        where it overrode one (e.g. the moments init that SecAgg+ or DP forces)."""
        return self.cfg.to_dict()

    def extra_summary(self) -> dict[str, Any]:
        """Method-specific fields for summary.json."""
        return {}

    # -------------------------------------------------------------------------------- final report
    def report_parameters(self) -> Parameters | None:
        """The global model the clients label their records with (and `predict` reloads)."""
        return self.latest_parameters

    def start_candidate(self) -> StartCandidate | None:
        """The starting clustering `select = best` compares the final one with (None: the method has
        none, e.g. a one-shot method)."""
        return None

    def report_views(self) -> int | None:
        """How many parties' views make up a record (vertical federations: the report needs every view's
        sums); None when that is not known or the federation is horizontal."""
        return None

    def model_description(self) -> dict[str, Any]:
        """Method-specific fields of model.json (vocabulary, topic words, ...)."""
        return {}
