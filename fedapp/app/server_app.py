"""The one ServerApp: run-config `method` picks the strategy (see fedapp/methods/)."""

from __future__ import annotations

from logging import INFO

from flwr.common import Context, log
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat import start_grid
from flwr.serverapp import Grid

from fedapp.app.preflight import check_dependencies
from fedapp.app.secure_loop import run_secure
from fedapp.app.server_loop import CountingGrid, FedappServer
from fedapp.config.run import ConfigError, RunConfig, parse_run_config
from fedapp.methods import load_class, method_spec
from fedapp.report.pages.run import update_run_report
from fedapp.report.records import PROGRESS_MARKER


def server_fn(context: Context) -> ServerAppComponents:
    """Validate the whole run config before round 1, then build the method's strategy."""
    return server_components(parse_run_config(context.run_config))


def server_components(cfg: RunConfig) -> ServerAppComponents:
    """`FedappServer` with the method's strategy (restored from its checkpoint when `resume` is set)."""
    spec = method_spec(cfg.method)
    if spec.strategy is None:
        raise ConfigError(
            f"method '{cfg.method}' is the centralized reference and does not run under Flower; "
            f"run it with: python -m simulation run --method {cfg.method} --dataset {cfg.dataset}"
        )
    check_dependencies(cfg.method)  # the SuperLink's machine lacks the method's extra: one line
    strategy = load_class(spec.strategy)(cfg)
    if cfg.resume:
        try:
            strategy.restore()
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
    log(
        INFO,
        "%s %s on %s: clients=%d rounds=%d seed=%d out-dir=%s",
        PROGRESS_MARKER,
        cfg.method,
        cfg.dataset,
        cfg.num_clients,
        cfg.num_rounds,
        cfg.seed,
        strategy.out_dir.resolve(),
    )
    server = FedappServer(client_manager=SimpleClientManager(), strategy=strategy)
    config = ServerConfig(num_rounds=strategy.total_rounds, round_timeout=cfg.round_timeout or None)
    return ServerAppComponents(server=server, config=config)


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower's legacy server loop (our `FedappServer`), or its SecAgg+ variant when `secagg` is on."""
    cfg = parse_run_config(context.run_config)
    components = server_components(cfg)
    assert components.server is not None and components.config is not None
    counting = CountingGrid(grid)  # the wire bytes of every message, SecAgg+'s stages included
    try:
        if cfg.secagg:
            run_secure(counting, context, components.server, components.config, cfg)
        else:
            start_grid(grid=counting, server=components.server, config=components.config)
    finally:
        out_dir = components.server.strategy.out_dir  # type: ignore[attr-defined]
        counting.write(out_dir)
        update_run_report(out_dir)  # the page shows the wire bytes too
