"""Server side of choosing k (`fedapp.app.k_selection`, maths in `fedapp.maths.selection`), composed into
every strategy as `k_choice`: the server loop sends its two messages before round 1 when the
run's k is open (k = 0 on own files), and every later message carries the chosen k (`stamp`).

Round A's floored local centres come back in evaluate replies; round B's sums too, or through SecAgg+
(`configure_secure` / `aggregate_secure`, run-config `secagg`), where the server learns only their
totals. A choice on the top of the range asks for both rounds again with k-max doubled
(`fedapp.maths.selection.KSearch`): `aggregate` says so. A client that fails or sends a malformed reply is
left out (and named in the warnings); a round with no usable reply fails the run, which cannot start
without k. The outcome, with how sure it is, goes to summary.json `k_selection` and to tune.json /
tune.png in the run's folder, as `fedapp tune` writes them; a weak choice is one warning line.
"""

from __future__ import annotations

import json
import time
from logging import INFO
from typing import Any, Protocol

import numpy as np
from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, log, ndarrays_to_parameters
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from fedapp.app.floor_rules import run_floor
from fedapp.app.k_selection import (
    CANDIDATE_KS_KEY,
    CENTRES_KEY,
    CHOSEN_K_KEY,
    LABELLED_KEY,
    LOCAL_K_KEY,
    PHASE_CENTRES,
    PHASE_STATISTICS,
    PHASE_VIEW,
    SCALE_KEY,
    SELECT_KEY,
    SIZES_KEY,
    SPLITS_KEY,
    SQUARES_KEY,
    STATISTICS_KEY,
    VIEW_SELECTION_KEY,
    candidates_to_arrays,
    may_select,
    selection_space,
    statistics_from_arrays,
    views_outcome,
)
from fedapp.config.run import RunConfig
from fedapp.maths.selection import (
    CandidateStats,
    KSearch,
    SelectionError,
    merge_statistics,
)
from fedapp.methods import method_spec
from fedapp.report.records import PROGRESS_MARKER
from fedapp.report.selection_files import write_selection
from fedapp.report.stages import SECURE_DONE, SECURE_RETRY, SECURE_STOP
from fedapp.wire import decode_array, decode_arrays
from strategies.records import RunRecord
from strategies.replies import describe_failure
from strategies.report_intake import clipped_or_retry, secure_totals
from strategies.roster import ClientRoster

Failures = list[tuple[ClientProxy, Any] | BaseException]


class KSelectionError(RuntimeError):
    """No k could be chosen: the run cannot start (summary.json says why)."""


class KChoiceHost(Protocol):
    """What the selection needs of its strategy (`strategies.base.ClusteringStrategy`)."""

    cfg: RunConfig
    k: int | None
    roster: ClientRoster
    record: RunRecord
    out_dir: Any

    def warn(self, message: str) -> None: ...


class KChoice:
    """Choosing k before round 1 (module docstring); `summary` is summary.json `k_selection`."""

    def __init__(self, host: KChoiceHost) -> None:
        self.host = host
        self.summary: dict[str, Any] = {}
        self.chosen: int | None = None  # the chosen k, stamped on every later message
        self.search: KSearch | None = None
        self.candidates: dict[int, np.ndarray] = {}  # this pass's candidates and their split pairs
        self.pairs: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.again = False  # the last round B extended the range: rounds A and B once more
        self.secure_scale: float | None = None  # round B under SecAgg+: the scale its sums went at
        self._started = 0.0
        self._bytes = {"up": 0, "down": 0}

    @property
    def vertical(self) -> bool:
        """Every party holds every record, one view each: one round, each party chooses on its view."""
        return method_spec(self.host.cfg.method).vertical

    @property
    def wanted(self) -> bool:
        """The run's k is open and not yet chosen (a resumed run chose it before its checkpoint)."""
        return may_select(self.host.cfg) and not self.summary  # set by a choice, a skip or a checkpoint

    # ------------------------------------------------------------------------------ the two rounds
    def configure(self, phase: str, client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Round A (`PHASE_CENTRES`) or B (`PHASE_STATISTICS`) to every usable client ([]: nothing to do)."""
        if not self.wanted:
            return []
        cfg = self.host.cfg
        clients = self.host.roster.usable(client_manager, self.host.record)
        if phase == PHASE_CENTRES:
            selection_space(cfg)  # a method or setting that cannot choose k fails here, in one line
            if self.search is None:
                self._started = time.perf_counter()
                self.search = KSearch(
                    cfg.k_min, cfg.k_max, cfg.k_rule, floor=run_floor(cfg), extend=cfg.k_extend
                )
            phase_sent = PHASE_VIEW if self.vertical else PHASE_CENTRES
            parameters = ndarrays_to_parameters([])
            config = {SELECT_KEY: phase_sent, LOCAL_K_KEY: self.search.local_k(max(len(clients), 1))}
        else:
            arrays, ks, splits = candidates_to_arrays(self.candidates, self.pairs)
            parameters = ndarrays_to_parameters(arrays)
            config = {SELECT_KEY: PHASE_STATISTICS, CANDIDATE_KS_KEY: ks, SPLITS_KEY: splits}
        instructions = [(client, EvaluateIns(parameters, dict(config))) for client in clients]
        self._bytes["down"] += len(instructions) * sum(len(t) for t in parameters.tensors)
        return instructions

    def aggregate(
        self, phase: str, results: list[tuple[ClientProxy, EvaluateRes]], failures: Failures
    ) -> bool:
        """Take a round's replies. Round A: False when there is no round B (every client has labels, or
        nothing left to score); round B: True when the range was extended (rounds A and B again)."""
        self._note_failures(phase, failures)
        if phase == PHASE_CENTRES and self.vertical:
            self._take_views(results)
            return False
        if phase == PHASE_CENTRES:
            return self._take_centres(results)
        parts = []
        ks, dims, splits = sorted(self.candidates), self._dims(), self._splits()
        for client, res in _by_partition(results):
            try:
                blob = res.metrics[STATISTICS_KEY]
                self._bytes["up"] += len(blob)  # type: ignore[arg-type]
                arrays = decode_arrays(blob, f"'{STATISTICS_KEY}'")
                ordered = [arrays[f"arr_{i}"] for i in range(len(arrays))]
                parts.append(statistics_from_arrays(ordered, ks, dims, splits))
            except (KeyError, ValueError) as exc:
                self.host.warn(f"k selection (statistics): client {client.cid}'s reply left out ({exc})")
        if not parts:
            raise KSelectionError("k selection: no client sent usable statistics for the candidates")
        return self._choose(merge_statistics(parts))

    def configure_secure(
        self, client_manager: ClientManager, scale: float
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Round B as SecAgg+ fit messages, the sums multiplied by `scale` (public)."""
        instructions = self.configure(PHASE_STATISTICS, client_manager)
        return [
            (client, FitIns(ins.parameters, {**ins.config, SCALE_KEY: scale})) for client, ins in instructions
        ]

    def aggregate_secure(
        self, results: list[tuple[ClientProxy, FitRes]], failures: Failures, scale: float, last_try: bool
    ) -> str:
        """Round B's secure totals: SECURE_DONE, SECURE_RETRY (SecAgg+ would clip: ask again with a smaller
        scale) or SECURE_STOP. After SECURE_DONE, `again` says whether the range was extended."""
        self._note_failures(PHASE_STATISTICS, failures)
        if not results:
            return SECURE_STOP
        clipped = clipped_or_retry(results, "k selection", scale, last_try)
        if clipped is None:
            return SECURE_RETRY
        if clipped:
            self.host.warn(f"k selection: SecAgg+ clipped {clipped} values even at scale {scale:g}")
        totals = secure_totals(results)
        self._bytes["up"] += sum(t.size * 8 for t in totals) * len(results)
        stats = statistics_from_arrays(
            totals, sorted(self.candidates), self._dims(), self._splits(), scale, rounded=True
        )
        self.secure_scale = scale
        self._choose(stats)
        return SECURE_DONE

    # ------------------------------------------------------------------------------ the choice
    def _take_centres(self, results: list[tuple[ClientProxy, EvaluateRes]]) -> bool:
        cfg = self.host.cfg
        assert self.search is not None  # made by configure(PHASE_CENTRES)
        centres, sizes, squares, labelled = [], [], [], []
        for client, res in _by_partition(results):  # the union's order is the clients', not arrival's
            if LABELLED_KEY in res.metrics:
                labelled.append(client.cid)
                continue
            try:
                blob_c, blob_s = res.metrics[CENTRES_KEY], res.metrics[SIZES_KEY]
                self._bytes["up"] += len(blob_c) + len(blob_s)  # type: ignore[arg-type]
                c, s = decode_array(blob_c, CENTRES_KEY), decode_array(blob_s, SIZES_KEY)
                q = float(res.metrics[SQUARES_KEY])  # type: ignore[arg-type]
                if c.ndim != 2 or s.shape != (c.shape[0],) or not np.isfinite(c).all() or (s < 1).any():
                    raise ValueError(f"centres {c.shape} and sizes {s.shape} do not fit")
                if not (np.isfinite(q) and q >= 0):
                    raise ValueError(f"sum of squared norms {q!r} is not a non-negative number")
                if centres and c.shape[1] != centres[0].shape[1]:
                    raise ValueError(f"centres of width {c.shape[1]}, others {centres[0].shape[1]}")
            except (KeyError, ValueError) as exc:
                self.host.warn(f"k selection (local centres): client {client.cid}'s reply left out ({exc})")
                continue
            centres.append(c)
            sizes.append(s)
            squares.append(q)
        if not centres:
            if labelled and len(labelled) == len(results):
                self.summary = {"skipped": "every client has labels: k is the number of classes"}
                log(INFO, "%s k = 0: every client has labels, k = the classes", PROGRESS_MARKER)
                return False
            raise KSelectionError("k selection: no client sent usable local centres")
        try:
            self.candidates, self.pairs = self.search.plan(centres, sizes, cfg.seed, squares)
        except SelectionError as exc:
            raise KSelectionError(f"k selection: {exc}") from None
        if not self.candidates:  # an extension the privacy floor stopped: the choice stands
            self._finish()
            return False
        ks = sorted(self.candidates)
        log(
            INFO,
            "%s k = 0 without labels: scoring k = %d..%d (%d candidates, %d local centres from %d clients)",
            PROGRESS_MARKER,
            ks[0],
            ks[-1],
            len(ks),
            sum(len(c) for c in centres),
            len(centres),
        )
        return True

    def _take_views(self, results: list[tuple[ClientProxy, EvaluateRes]]) -> None:
        """Vertical: the parties' own choices and their rounded mean; a label holder's classes win."""
        cfg = self.host.cfg
        labelled = [int(res.metrics[LABELLED_KEY]) for _, res in results if LABELLED_KEY in res.metrics]
        if labelled:
            self._decide(max(labelled), {"skipped": "a party has labels: k is the number of classes"})
            return
        views: dict[str, Any] = {}
        for client, res in _by_partition(results):
            try:
                table = json.loads(str(res.metrics[VIEW_SELECTION_KEY]))
                chosen = int(table["chosen_k"])
                if chosen < cfg.k_min or chosen not in {int(row["k"]) for row in table["candidates"]}:
                    raise ValueError(f"chosen k = {chosen} is none of its candidates from k-min={cfg.k_min}")
            except (KeyError, ValueError, TypeError) as exc:
                self.host.warn(f"k selection (view): client {client.cid}'s reply left out ({exc})")
                continue
            views[str(res.metrics.get("partition-id", client.cid))] = table
        if not views:
            raise KSelectionError("k selection: no party sent a usable choice on its view")
        outcome = views_outcome(views, cfg.k_rule)
        self._decide(outcome["chosen_k"], outcome)
        write_selection(self.host.out_dir, self.summary)
        if outcome["confidence"]["verdict"] == "weak":
            choices = ", ".join(f"party {p}: {k}" for p, k in outcome["confidence"]["choices"].items())
            self.host.warn(
                f"k selection: weak evidence for k = {outcome['chosen_k']} ({outcome['confidence']['why']}; "
                f"{choices}); see tune.png, or set k"
            )

    def _decide(self, chosen: int, summary: dict[str, Any]) -> None:
        """The run's k, without round B (vertical runs, a label holder's classes)."""
        self.chosen = self.host.k = chosen
        self.summary = {
            **summary,
            "chosen_k": chosen,
            "cost": {"extra_rounds": 1, "seconds": round(time.perf_counter() - self._started, 2)},
        }
        log(
            INFO,
            "%s chosen k = %d (%s)",
            PROGRESS_MARKER,
            chosen,
            summary.get("rule", summary.get("skipped")),
        )

    def _dims(self) -> int:
        return next(iter(self.candidates.values())).shape[1]

    def _splits(self) -> int:
        return len(next(iter(self.pairs.values()), []))

    def _choose(self, merged: dict[int, CandidateStats]) -> bool:
        """Score this pass's candidates; True when the range was extended (another pass)."""
        assert self.search is not None
        try:
            self.again = self.search.take(merged, self.candidates)
        except SelectionError as exc:
            raise KSelectionError(f"k selection: {exc}") from None
        if self.again:
            log(
                INFO,
                "%s k selection: the best k is the top of the range; extending k-max to %d",
                PROGRESS_MARKER,
                self.search.k_max,
            )
            return True
        self._finish()
        return False

    def _finish(self) -> None:
        """The choice of the passes so far is the run's: summary, files, the console line, a warning
        when the evidence is weak."""
        assert self.search is not None
        selection = self.search.selection()
        self.chosen = self.host.k = selection.k
        self.summary = {
            **selection.to_json(),
            **({"secagg": {"scale": self.secure_scale}} if self.secure_scale is not None else {}),
            "cost": {
                "extra_rounds": 2 * self.search.passes,
                "bytes_up": float(self._bytes["up"]),
                "bytes_down": float(self._bytes["down"]),
                "seconds": round(time.perf_counter() - self._started, 2),
            },
        }
        write_selection(self.host.out_dir, self.summary)
        sure = selection.confidence
        log(
            INFO,
            "%s chosen k = %d in %d..%d (%s; %s; tune.json, tune.png)",
            PROGRESS_MARKER,
            selection.k,
            *sure["range"],  # type: ignore[misc]
            selection.rule,
            sure["verdict"],
        )
        if sure["verdict"] == "weak":
            runners = ", ".join(str(k) for k in sure.get("runner_up", []))  # type: ignore[attr-defined]
            self.host.warn(
                f"k selection: weak evidence for k = {selection.k} ({sure['why']}); runner-up k: "
                f"{runners or 'none'}; see tune.png, or set k"
            )

    def _note_failures(self, phase: str, failures: Failures) -> None:
        for failure in failures:
            self.host.warn(f"k selection ({phase}): client failure: {describe_failure(failure)}")

    # ------------------------------------------------------------------------------ after the choice
    def stamp(self, instructions: list[tuple[ClientProxy, Any]]) -> list[tuple[ClientProxy, Any]]:
        """Every message after the choice tells its client the chosen k (a client's run config says 0)."""
        if self.chosen is not None:
            for _, ins in instructions:
                ins.config[CHOSEN_K_KEY] = self.chosen
        return instructions

    def state_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "chosen": self.chosen}  # a run resumes after its choice

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.summary, self.chosen = dict(state["summary"]), state["chosen"]


def _by_partition(results: list[tuple[ClientProxy, Any]]) -> list[tuple[ClientProxy, Any]]:
    """Replies in partition order: what the server computes must not depend on which arrived first."""
    return sorted(results, key=lambda result: (str(result[1].metrics.get("partition-id")), result[0].cid))
