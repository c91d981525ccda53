"""What every client gets around its method's maths: its own compute time, and checkpoints.

`ManagedClient` wraps the method's NumPyClient. It adds `client-seconds` (the wall time of this client's
fit or evaluate call) to the reply's metrics, so the server can split a round into its own work, the
clients' compute and the rest (transport, scheduling); in a Ray simulation, `ray-node` (the Ray node that
ran the fit, so a run on a Ray cluster shows where its clients ran: summary.json `ray_nodes`); and, with
`checkpoint-every` / `resume`, it saves
`context.state` after each fit and reloads it once after a resume (see fedapp/app/checkpoint.py). A fit
message that carries the final report's stage (`fedapp.report.stages`, sent so under SecAgg+) goes to the
client's report (`final_report.secure`, clients/report.py), not to the method's training step; one that
carries k selection's round B under SecAgg+ (`fedapp.app.k_selection`) to `secure_selection`. Faults a
test injects (`fedapp.app.faults`) happen here too, around the method.

A run with k = 0 on unlabelled files chooses k in its first two messages; every later message carries the
chosen k (`CHOSEN_K_KEY`), so the method's client is built for the message it answers, with that k.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from flwr.client import NumPyClient
from flwr.common import ConfigRecord, Context, NDArrays, RecordDict, Scalar

from fedapp.app.checkpoint import RESUME_KEY, load_client_state, save_client_state
from fedapp.app.faults import before_evaluate, before_fit, corrupted
from fedapp.app.k_selection import CHOSEN_K_KEY, SELECT_KEY
from fedapp.config.run import RunConfig
from fedapp.datasets import DatasetError
from fedapp.datasets.sources import source_path
from fedapp.report.keep import KEEP_KEY
from fedapp.report.stages import REPORT_KEY

SECONDS_KEY = "client-seconds"  # metrics key: this client's compute time for the message
RAY_NODE_KEY = "ray-node"  # metrics key of a fit reply in a Ray simulation: the node that ran it
_RESTORED = "fedapp.restored"  # context.state marker: this client has reloaded its state


def ray_node() -> str | None:
    """The id of the Ray node this process runs on, inside a Ray simulation's actor; None elsewhere
    (a deployment or the in-process engine, where Ray is not even imported)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return str(ray.get_runtime_context().get_node_id())


class ClientSiteError(RuntimeError):
    """A client's failure, naming its site: "partition-id P, file F: Type: message"."""


def _own_file(spec: str, partition_id: int) -> str | None:
    """The file this client reads when its dataset is a file (a source spec), else None."""
    try:
        return str(source_path(spec, partition_id))
    except DatasetError:
        return None


class ManagedClient(NumPyClient):
    """The method's client, timed; checkpointed when `checkpoints` is a directory."""

    def __init__(
        self,
        build: Callable[[Context, RunConfig], NumPyClient],
        context: Context,
        cfg: RunConfig,
        checkpoints: Path | None = None,
    ) -> None:
        self.build, self.context, self.cfg, self.checkpoints = build, context, cfg, checkpoints
        self.partition_id = int(context.node_config.get("partition-id", -1))
        self._inner: NumPyClient | None = None

    def client(self, config: dict[str, Scalar]) -> NumPyClient:
        """The method's client for this message: with the run's k, or the one chosen for it."""
        if self._inner is None:
            cfg = self.cfg
            chosen = config.get(CHOSEN_K_KEY)
            if not cfg.k and isinstance(chosen, int) and chosen > 0:
                cfg = self.cfg = cfg.with_keys({"k": chosen})
            with self._named():
                self._inner = self.build(self.context, cfg)
                if not getattr(self._inner, "k", 1) and SELECT_KEY not in config:
                    raise ValueError(
                        "its data has no labels and the server sent no chosen k, so k cannot default to the "
                        "number of classes: set k"
                    )
        return self._inner

    @property
    def inner(self) -> NumPyClient:
        """The method's client as last built (`client`)."""
        if self._inner is None:
            raise RuntimeError("the method's client is built with the first message")
        return self._inner

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return self.client(config).get_properties(config)

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        started = time.perf_counter()
        inner = self.client(config)
        secure = "secure_selection" if SELECT_KEY in config else "secure_choice" if KEEP_KEY in config else ""
        if secure:  # k selection's round B, `select = best`'s scoring, through SecAgg+: no training either
            with self._named():
                arrays, n, metrics = getattr(inner, secure)(parameters, config)
            return arrays, n, {**metrics, SECONDS_KEY: time.perf_counter() - started}
        if REPORT_KEY in config:  # the final report through SecAgg+: no training, nothing to checkpoint
            report = inner.final_report  # type: ignore[attr-defined]  # every client composes one
            arrays, n, metrics = report.secure(parameters, config)
            return arrays, n, {**metrics, SECONDS_KEY: time.perf_counter() - started}
        with self._named():
            fault = before_fit(self.partition_id, config, self.cfg.round_timeout)  # tests: FEDAPP_FAULTS
            self._restore_once(config)
            arrays, n, metrics = self.inner.fit(parameters, config)
            arrays = corrupted(arrays, fault)
        server_round = config.get("server-round")
        if self.checkpoints is not None and isinstance(server_round, int):
            state = RecordDict({key: value for key, value in self.context.state.items() if key != _RESTORED})
            save_client_state(self.checkpoints, self.partition_id, server_round, state)
        placed = {RAY_NODE_KEY: node} if (node := ray_node()) else {}
        return arrays, n, {**metrics, SECONDS_KEY: time.perf_counter() - started, **placed}

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        started = time.perf_counter()
        inner = self.client(config)
        with self._named():
            before_evaluate(self.partition_id, config)
            loss, n, metrics = inner.evaluate(parameters, config)
        return loss, n, {**metrics, SECONDS_KEY: time.perf_counter() - started}

    @contextmanager
    def _named(self) -> Iterator[None]:
        """Any exception of this client leaves it naming the site (partition id and, when it reads a file
        of its own, the file): the server sees only Flower's node id and a Ray traceback."""
        try:
            yield
        except ClientSiteError:
            raise
        except Exception as exc:
            file = _own_file(self.cfg.dataset, self.partition_id)
            where = f"partition-id {self.partition_id}" + (f", file {file}" if file else "")
            raise ClientSiteError(f"{where}: {type(exc).__name__}: {exc}") from exc

    def _restore_once(self, config: dict[str, Scalar]) -> None:
        """After a resume, reload the newest state saved in a round <= the resumed one, then rebuild."""
        resume_round = config.get(RESUME_KEY)
        if self.checkpoints is None or not isinstance(resume_round, int) or _RESTORED in self.context.state:
            return
        saved = load_client_state(self.checkpoints, self.partition_id, resume_round)
        for key in list(saved or {}):
            self.context.state[key] = saved[key]  # type: ignore[index]
        self.context.state[_RESTORED] = ConfigRecord({"round": resume_round})
        self._inner = self.build(self.context, self.cfg)  # a client may read its state when built
