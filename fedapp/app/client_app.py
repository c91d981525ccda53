"""The one ClientApp: run-config `method` picks the NumPyClient (see fedapp/methods/)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from flwr.client import Client, ClientApp
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Context, Message
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

from fedapp.app.checkpoint import checkpoint_dir
from fedapp.app.managed_client import ManagedClient
from fedapp.config.run import ConfigError, RunConfig, parse_run_config
from fedapp.methods import load_class, method_spec
from fedapp.report.records import default_out_dir


@lru_cache(maxsize=8)
def _parsed(run_config: tuple[tuple[str, Any], ...]) -> RunConfig:
    """A process hosts many virtual clients of one run, each message rebuilding its client: parse once."""
    return parse_run_config(dict(run_config))


# Keys a SuperNode may set in its own node config, overriding the run config for that node only: its own
# data file and columns (deployment: the file is on the node's machine), where it writes, its id secret.
NODE_KEYS = (
    "dataset",
    "data-dir",
    "text-column",
    "label-column",
    "id-column",
    "feature-columns",
    "node-out-dir",
    "id-key",
)


def node_run_config(run_config: Mapping[str, Any], node_config: Mapping[str, Any]) -> dict[str, Any]:
    """The run config as this node sees it: NODE_KEYS from its node config win."""
    return {**run_config, **{key: node_config[key] for key in NODE_KEYS if key in node_config}}


def client_fn(context: Context) -> Client:
    cfg = _parsed(tuple(sorted(node_run_config(context.run_config, context.node_config).items())))
    spec = method_spec(cfg.method)
    if spec.client is None:
        raise ConfigError(f"method '{cfg.method}' has no federated client")
    checkpoints = None
    if cfg.checkpoint_every or cfg.resume:
        out_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(cfg.method, cfg.dataset, cfg.seed)
        checkpoints = checkpoint_dir(cfg, out_dir)
    return ManagedClient(load_class(spec.client), context, cfg, checkpoints).to_client()


def secagg_when_asked(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower's SecAgg+ client mod for the messages of a SecAgg+ round (run-config `secagg`) only:
    `secaggplus_mod` itself rejects every other fit message."""
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


app = ClientApp(client_fn=client_fn, mods=[secagg_when_asked])
