"""The one ClientApp: run-config `method` picks the NumPyClient (see fedapp/methods.py)."""

from __future__ import annotations

from flwr.client import Client, ClientApp
from flwr.common import Context

from fedapp.config import ConfigError, parse_run_config
from fedapp.methods import load_class, method_spec


def client_fn(context: Context) -> Client:
    cfg = parse_run_config(context.run_config)
    spec = method_spec(cfg.method)
    if spec.client is None:
        raise ConfigError(f"method '{cfg.method}' has no federated client")
    return load_class(spec.client)(context, cfg).to_client()


app = ClientApp(client_fn=client_fn)
