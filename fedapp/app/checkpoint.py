"""Checkpoints: a killed run resumes from its last checkpoint to the same final result.

Two halves, because state lives on both sides:
- the server pickles its strategy's `state_dict()` (`strategy-round-R.pkl`) every `checkpoint-every`
  rounds, after the round's evaluation, and points `latest.json` at it; `restore` hands it back to
  `load_state_dict` (explicit fields, torch models and optimizers as their own `state_dict`s);
- every client writes its `context.state` (optimizer moments, RNG states, CeFMC's H_v, ...) after each
  fit as `client-P-round-R.recorddict` (Flower's own protobuf serialisation), keeping the last few.

With `resume = true` the server restores the strategy at round R and continues with round R + 1; each
client, told `resume-round = R`, reloads the newest state it wrote in a round <= R (a client that sat out
round R resumes from its last fit). The pickles are this server's own files: load them from nowhere else.
In a deployment each SuperNode writes under the same `checkpoint-dir` path on its own disk.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import tempfile
from pathlib import Path
from typing import Any

from flwr.common import RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as RecordDictProto

from fedapp.config.run import RunConfig

KEEP_CLIENT_STATES = 3  # per client: enough to resume from the server's last checkpoint
RESUME_KEY = "resume-round"  # fit-config key: the round the server resumed from


def checkpoint_dir(cfg: RunConfig, out_dir: Path) -> Path:
    return Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else out_dir / "checkpoint"


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------- server side
def save_strategy(directory: Path, server_round: int, state: dict[str, Any]) -> Path:
    """Pickle a `state_dict()` after `server_round`; `latest.json` names the newest complete one."""
    path = directory / f"strategy-round-{server_round:06d}.pkl"
    _atomic_write(path, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    _atomic_write(directory / "latest.json", json.dumps({"round": server_round, "file": path.name}).encode())
    for old in sorted(directory.glob("strategy-round-*.pkl"))[:-2]:
        old.unlink(missing_ok=True)
    return path


def load_strategy(directory: Path) -> tuple[int, dict[str, Any]]:
    """(round, state) of the newest checkpoint; a clear error when there is none."""
    latest = directory / "latest.json"
    if not latest.is_file():
        raise FileNotFoundError(
            f"no checkpoint to resume from in {directory} (run with checkpoint-every > 0)"
        )
    pointer = json.loads(latest.read_text())
    with (directory / pointer["file"]).open("rb") as fh:
        return int(pointer["round"]), pickle.load(fh)  # noqa: S301 (written by this server)


# ------------------------------------------------------------------------------------- client side
_CLIENT_FILE = re.compile(r"client-(\d+)-round-(\d+)\.recorddict$")


def save_client_state(directory: Path, partition_id: int, server_round: int, state: RecordDict) -> None:
    path = directory / f"client-{partition_id}-round-{server_round:06d}.recorddict"
    _atomic_write(path, recorddict_to_proto(state).SerializeToString())
    mine = sorted(directory.glob(f"client-{partition_id}-round-*.recorddict"))
    for old in mine[:-KEEP_CLIENT_STATES]:
        old.unlink(missing_ok=True)


def load_client_state(directory: Path, partition_id: int, at_most_round: int) -> RecordDict | None:
    """The newest state this client saved in a round <= `at_most_round` (None: it never fitted)."""
    candidates = []
    for path in directory.glob(f"client-{partition_id}-round-*.recorddict"):
        match = _CLIENT_FILE.search(path.name)
        if match and int(match.group(1)) == partition_id and int(match.group(2)) <= at_most_round:
            candidates.append((int(match.group(2)), path))
    if not candidates:
        return None
    proto = RecordDictProto()
    proto.ParseFromString(max(candidates)[1].read_bytes())
    return recorddict_from_proto(proto)
