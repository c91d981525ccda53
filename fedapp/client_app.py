"""The one ClientApp: run-config `method` picks the NumPyClient (see fedapp/methods.py)."""

from __future__ import annotations

from pathlib import Path

from flwr.client import Client, ClientApp
from flwr.client.mod import secaggplus_mod
from flwr.common import Context

from fedapp.checkpoint import CheckpointingClient, checkpoint_dir
from fedapp.config import ConfigError, parse_run_config
from fedapp.methods import load_class, method_spec
from fedapp.results import default_out_dir


def client_fn(context: Context) -> Client:
    cfg = parse_run_config(context.run_config)
    spec = method_spec(cfg.method)
    if spec.client is None:
        raise ConfigError(f"method '{cfg.method}' has no federated client")
    build = load_class(spec.client)
    if not (cfg.checkpoint_every or cfg.resume):
        return build(context, cfg).to_client()
    out_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(cfg.method, cfg.dataset, cfg.seed)
    partition_id = int(context.node_config.get("partition-id", -1))
    directory = checkpoint_dir(cfg, out_dir)
    return CheckpointingClient(build, context, cfg, partition_id, directory).to_client()


# secaggplus_mod only acts on SecAgg+ stage messages (run-config `secagg`); other messages pass through
app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod])
