"""Who is asked each round: the connected clients, minus those that failed, minus a seeded dropout draw.

`ClientRoster` is owned by `ClusteringStrategy` (`strategy.roster`). The first round waits (up to
CLIENT_WAIT_S) for `num-clients` SuperNodes; later rounds go on with whoever is connected, so a dead
SuperNode costs at most one round-timeout. A client that fails or times out is not asked again.
"""

from __future__ import annotations

import math
import time
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from fedapp.config.run import RunConfig
from strategies.records import RunRecord
from strategies.replies import ClientReply

CLIENT_WAIT_S = 300
NODE_POLL_S = (0.01, 0.5)  # first and longest pause between looks at the connected clients


class FederationError(RuntimeError):
    """The federation cannot proceed (e.g. too few clients connected)."""


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


class ClientRoster:
    """The federation's clients as the server sees them (see the module docstring)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.excluded: dict[str, int] = {}  # cid -> the round it failed or timed out in: not asked again
        self.clients_seen = 0
        self.waited = False
        self.owner: dict[int, str] = {}  # partition id -> the client that holds it (from valid replies)
        self.duplicates: list[str] = []  # what each refused duplicate claimed, in words
        self.awaiting: str = ""  # a duplicate left a partition missing: the next round waits for it

    def usable(self, client_manager: ClientManager, record: RunRecord) -> list[ClientProxy]:
        """The connected clients that have not failed, sorted by id (waiting for them the first time,
        booked in `record` as start-up, not as the round's work)."""
        if not self.waited:
            wanted = self.cfg.num_clients or 1  # 0: every SuperNode connected when the round starts
            started = time.perf_counter()
            if not wait_for_clients(client_manager, wanted, CLIENT_WAIT_S):
                raise FederationError(
                    f"run-config num-clients={wanted} but only {client_manager.num_available()} client(s) "
                    f"connected after {CLIENT_WAIT_S} s: start the simulation with num-supernodes={wanted} "
                    f"or start {wanted} SuperNodes"
                )
            record.book_wait(time.perf_counter() - started)
            self.waited = True
        if self.awaiting:
            self._wait_for_missing(client_manager, record)
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

    def unique_partitions(self, server_round: int, claims: list[tuple[str, int]]) -> set[str]:
        """Refuse all but one of the clients that claim the same partition id in one round (the client
        that held it before, else the first by id); returns the refused, excluded from now on. Across
        rounds a new client may take a partition over (a restarted node gets a new id). With
        `num-clients` set, a refusal leaves a partition missing, which the next round waits for instead
        of running without it."""
        claimants: dict[int, list[str]] = {}
        for cid, partition in sorted(claims):
            claimants.setdefault(partition, []).append(cid)
        refused = set()
        for partition, cids in claimants.items():
            keeper = self.owner.get(partition) if self.owner.get(partition) in cids else cids[0]
            self.owner[partition] = keeper
            for cid in cids:
                if cid == keeper:
                    continue
                refused.add(cid)
                self.excluded.setdefault(cid, server_round)
                words = f"client {cid} claims partition-id {partition}, which client {keeper} holds: refused"
                self.duplicates.append(words)
                log(WARNING, "round %d: %s", server_round, words)
        missing = sorted(set(range(self.cfg.num_clients)) - set(self.owner))
        if refused and missing:
            self.awaiting = f"partition-id(s) {missing} never reported ({'; '.join(self.duplicates)})"
        return refused

    def admit(
        self, server_round: int, replies: list[ClientReply], failure_messages: list[str]
    ) -> tuple[list[ClientReply], bool]:
        """`replies` less the refused duplicate claims (`unique_partitions`; what each claimed is added to
        `failure_messages`), and whether a refusal left a partition missing, which the run waits for."""
        refused = self.unique_partitions(server_round, [(reply.cid, reply.partition_id) for reply in replies])
        if refused:
            failure_messages.extend(self.duplicates[-len(refused) :])
        return [reply for reply in replies if reply.cid not in refused], bool(refused and self.awaiting)

    def _wait_for_missing(self, client_manager: ClientManager, record: RunRecord) -> None:
        """After a refused duplicate: wait for num-clients usable clients again, or stop naming both."""
        wanted = self.cfg.num_clients + len(self.excluded)
        timeout = min(CLIENT_WAIT_S, self.cfg.round_timeout or CLIENT_WAIT_S)
        started = time.perf_counter()
        if not wait_for_clients(client_manager, wanted, timeout):
            raise FederationError(f"{self.awaiting}; waited {timeout:.0f} s for another client")
        record.book_wait(time.perf_counter() - started)
        self.awaiting = ""

    def exclude(self, cids: list[str], server_round: int) -> None:
        """Clients that failed or timed out in `server_round`: they are not asked again."""
        for cid in cids:
            self.excluded.setdefault(cid, server_round)
            log(WARNING, "round %d: client %s failed or timed out; it is not asked again", server_round, cid)

    def min_fit(self) -> int:
        """Valid replies a fit round needs to count (run-config min-fit-clients / min-fit-fraction)."""
        return max(self.cfg.min_fit_clients, math.ceil(self.cfg.min_fit_fraction * self.clients_seen))

    def too_few(self, usable: int, server_round: int, failure_messages: list[str]) -> str | None:
        """Why a fit round cannot start with `usable` clients (fewer than `min_fit`), or None."""
        needed = self.min_fit()
        if usable >= needed:
            return None
        lost = ", ".join(f"{cid} (round {r})" for cid, r in sorted(self.excluded.items())) or "none"
        detail = f"; first error: {failure_messages[0]}" if failure_messages else ""
        return (
            f"only {usable} usable client(s) before round {server_round}, {needed} needed "
            f"(failed or timed out: {lost}){detail}"
        )

    def simulate_dropout(self, server_round: int, clients: list[ClientProxy]) -> list[ClientProxy]:
        """Run-config `dropout-rate`: round(rate * n) clients, drawn from (seed, round), sit this round out.

        They get no fit instruction, as if disconnected (the CCFC paper's Fig. 6); at least one client
        always stays. The draw depends only on the seed, the round and the sorted client ids.
        """
        rate = self.cfg.dropout_rate
        if rate <= 0 or len(clients) <= 1:
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

    # ------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        # `waited` is left out: a resumed run waits for its clients again
        return {
            "excluded": dict(self.excluded),
            "clients_seen": self.clients_seen,
            "owner": dict(self.owner),
            "duplicates": list(self.duplicates),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.excluded, self.clients_seen = dict(state["excluded"]), int(state["clients_seen"])
        self.owner, self.duplicates = dict(state.get("owner", {})), list(state.get("duplicates", []))
