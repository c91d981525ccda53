"""The one ClientApp: run-config `method` picks the NumPyClient (see fedapp/methods/)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from flwr.client import Client, ClientApp
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Context, Message
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

from fedapp.app.checkpoint import checkpoint_dir
from fedapp.app.managed_client import ManagedClient
from fedapp.app.preflight import check_dependencies
from fedapp.config.run import ConfigError, NodeSettings, RunConfig, parse_run_config
from fedapp.methods import load_class, method_spec
from fedapp.privacy.floor import min_cluster_size
from fedapp.report.records import default_out_dir

# Keys a SuperNode may set in its own node config, overriding the run config for that node only: its own
# data file and columns (deployment: the file is on the node's machine), where it writes (its records'
# clusters, its texts' embeddings), its id secret.
# Its `min-cluster-size` is merged apart: it can raise the privacy floor, never lower it.
NODE_KEYS = (
    "dataset",
    "data-dir",
    "text-column",
    "label-column",
    "id-column",
    "feature-columns",
    "node-out-dir",
    "embedding-cache",
    "id-key",
)
FLOOR_KEY = "min-cluster-size"


def node_run_config(run_config: Mapping[str, Any], node_config: Mapping[str, Any]) -> RunConfig:
    """The run as this node sees it, merged and parsed once: NODE_KEYS from its node config win, the
    floor is max(client default, node's, run config's) (`fedapp.privacy.floor`), and a `dataset` of its own
    means it reads that file whole. Clients read their settings from this config alone."""
    settings = {key: node_config[key] for key in (*NODE_KEYS, FLOOR_KEY) if key in node_config}
    return _node_view(tuple(sorted(run_config.items())), tuple(sorted(settings.items())))


@lru_cache(maxsize=8)
def _node_view(run_items: tuple[tuple[str, Any], ...], node_items: tuple[tuple[str, Any], ...]) -> RunConfig:
    """A process hosts many virtual clients of one run, each message rebuilding its client: merge once
    (keyed by the node's settings, not its identity, so that they all share it)."""
    run_config, settings = dict(run_items), dict(node_items)
    own = {key: settings[key] for key in NODE_KEYS if key in settings}
    cfg = parse_run_config({**run_config, **own})
    floor = min_cluster_size(cfg.min_cluster_size, settings)
    node = NodeSettings(own_file="dataset" in own, run_dataset=str(run_config.get("dataset", "")))
    return replace(cfg.with_keys({FLOOR_KEY: floor}), node=node)


def client_fn(context: Context) -> Client:
    cfg = node_run_config(context.run_config, context.node_config)
    spec = method_spec(cfg.method)
    if spec.client is None:
        raise ConfigError(f"method '{cfg.method}' has no federated client")
    check_dependencies(cfg.method)  # a node installed without the method's extra: say so, not ImportError
    checkpoints = None
    if cfg.checkpoint_every or cfg.resume:
        out_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(cfg.method, cfg.dataset, cfg.seed)
        checkpoints = checkpoint_dir(cfg, out_dir)
    return ManagedClient(load_class(spec.client), context, cfg, checkpoints).to_client()


def secagg_when_asked(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower's SecAgg+ client mod for the messages of a SecAgg+ round (run-config `secagg`) only:
    `secaggplus_mod` itself rejects every other fit message."""
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        with seeded_numpy_global(rounding_seed(msg, context)):
            return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


def rounding_seed(msg: Message, context: Context) -> list[int]:
    """SecAgg+ quantizes with stochastic rounding drawn from NumPy's global generator (its masks and keys
    use their own, cryptographic ones): seeded by the run seed, the node's partition and the message group
    (the round), a secure run is reproducible like a plain one, whichever process serves the node."""
    seed = int(context.run_config.get("seed", 0))
    node = int(context.node_config.get("partition-id", context.node_id))
    group = msg.metadata.group_id
    round_number = int(group) if group.lstrip("-").isdigit() else sum(group.encode())
    return [seed % 2**32, node % 2**32, round_number % 2**32]


@contextmanager
def seeded_numpy_global(entropy: list[int]) -> Iterator[None]:
    """NumPy's global generator seeded from `entropy` inside the block, restored after it."""
    state = np.random.get_state()
    np.random.seed(np.random.SeedSequence(entropy).generate_state(1)[0])
    try:
        yield
    finally:
        np.random.set_state(state)


app = ClientApp(client_fn=client_fn, mods=[secagg_when_asked])
