"""What every client gets around its method's maths: its own compute time, and checkpoints.

`ManagedClient` wraps the method's NumPyClient. It adds `client-seconds` (the wall time of this client's
fit or evaluate call) to the reply's metrics, so the server can split a round into its own work, the
clients' compute and the rest (transport, scheduling); and, with `checkpoint-every` / `resume`, it saves
`context.state` after each fit and reloads it once after a resume (see fedapp/app/checkpoint.py). A fit
message that carries the final report's stage (`fedapp.report.stages`, sent so under SecAgg+) goes to the
client's report (`final_report.secure`, clients/report.py), not to the method's training step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from flwr.client import NumPyClient
from flwr.common import ConfigRecord, Context, NDArrays, RecordDict, Scalar

from fedapp.app.checkpoint import RESUME_KEY, load_client_state, save_client_state
from fedapp.config.run import RunConfig
from fedapp.datasets import DatasetError
from fedapp.datasets.sources import source_path
from fedapp.report.stages import REPORT_KEY

SECONDS_KEY = "client-seconds"  # metrics key: this client's compute time for the message
_RESTORED = "fedapp.restored"  # context.state marker: this client has reloaded its state


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
        with self._named():
            self.inner = build(context, cfg)

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return self.inner.get_properties(config)

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        started = time.perf_counter()
        if REPORT_KEY in config:  # the final report through SecAgg+: no training, nothing to checkpoint
            report = self.inner.final_report  # type: ignore[attr-defined]  # every client composes one
            arrays, n, metrics = report.secure(parameters, config)
            return arrays, n, {**metrics, SECONDS_KEY: time.perf_counter() - started}
        with self._named():
            self._restore_once(config)
            arrays, n, metrics = self.inner.fit(parameters, config)
        server_round = config.get("server-round")
        if self.checkpoints is not None and isinstance(server_round, int):
            state = RecordDict({key: value for key, value in self.context.state.items() if key != _RESTORED})
            save_client_state(self.checkpoints, self.partition_id, server_round, state)
        return arrays, n, {**metrics, SECONDS_KEY: time.perf_counter() - started}

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        started = time.perf_counter()
        with self._named():
            loss, n, metrics = self.inner.evaluate(parameters, config)
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
        self.inner = self.build(self.context, self.cfg)  # a client may read its state when built
