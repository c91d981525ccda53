"""Run experiments: one run (`run`), a TOML experiment file (`experiment`), or list datasets/methods.

Engines:
- `flwr` (default): Flower's Ray simulation through `flwr run`, against a local simulation SuperLink
  that this runner starts on free loopback ports with a private FLWR_HOME and always stops by PID.
- `inprocess`: the same strategy/client classes under Flower's legacy `Server` loop without Ray
  (fedapp/inprocess.py) — for seed sweeps; results are identical in kind.
Centralized references (method `kmeans`) run directly, without Flower.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tomli_w

from fedapp.config import PROJECT_ROOT, ConfigError, RunConfig, default_run_config, parse_run_config
from fedapp.datasets import load_dataset, require_files, resolve_data_dir
from fedapp.local_data import views_of
from fedapp.methods import METHODS, method_spec
from simulation.processes import (
    ProcessError,
    console_script,
    flower_env,
    free_port,
    start_logged,
    stop_process,
    wait_for_health,
)

ENGINES = ("flwr", "inprocess")
SUPERLINK_START_TIMEOUT_S = 60
DEFAULT_CLIENTS = 10


class RunError(ProcessError):
    """A run did not produce its summary.json."""


def parse_set_options(items: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs; values parse as TOML (numbers, booleans, quoted strings), else as plain strings."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got '{item}'")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = value.strip()
    return out


def build_overrides(base: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """Absolute paths for out-dir and data-dir: Flower's processes run in other working directories."""
    overrides = dict(base)
    spec = METHODS.get(str(overrides.get("method")))
    if spec is not None and spec.vertical:  # one client per view
        n_views = count_views(overrides)
        if overrides.get("num-clients") and int(overrides["num-clients"]) != n_views:
            raise ConfigError(
                f"vertical method '{spec.name}' needs one client per view: dataset "
                f"'{overrides.get('dataset')}' has {n_views} views, num-clients={overrides['num-clients']}"
            )
        overrides["num-clients"] = n_views
    overrides["num-clients"] = int(overrides.get("num-clients") or DEFAULT_CLIENTS)  # runner: fixed size
    overrides["out-dir"] = str(out_dir.resolve())
    data_dir = resolve_data_dir(overrides.get("data-dir") or None)
    if data_dir is not None:
        overrides["data-dir"] = str(Path(data_dir).resolve())
    return overrides


def count_views(overrides: Mapping[str, Any]) -> int:
    """Number of views of the configured dataset (vertical federations need one client per view)."""
    dataset = str(overrides.get("dataset") or default_run_config()["dataset"])
    data = load_dataset(
        dataset,
        resolve_data_dir(overrides.get("data-dir") or None),
        max_samples=int(overrides.get("max-samples") or 0),
    )
    try:
        return len(views_of(data))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def execute(overrides: Mapping[str, Any], engine: str = "flwr", *, quiet: bool = False) -> dict[str, Any]:
    """Validate, run, and return the parsed summary.json."""
    import json

    if engine not in ENGINES:
        raise ValueError(f"unknown engine '{engine}'; choose one of {ENGINES}")
    cfg = parse_run_config(overrides)  # fails before any process starts
    require_files(cfg.dataset, resolve_data_dir(cfg.data_dir or None))  # so does a missing dataset file
    out_dir = Path(cfg.out_dir)
    summary_path = out_dir / "summary.json"
    if summary_path.exists():
        summary_path.unlink()
    if not method_spec(cfg.method).federated:
        from fedapp.centralized import run_centralized

        run_centralized(cfg)
    elif engine == "inprocess":
        _run_inprocess(cfg, overrides, quiet=quiet)
    else:
        _run_flwr(overrides, cfg.num_clients, quiet=quiet)
    if not summary_path.exists():
        raise RunError(f"the run wrote no {summary_path}; see the log above")
    summary = json.loads(summary_path.read_text())
    if not summary.get("metrics"):
        raise RunError(f"{summary_path} has no metrics (every client failed?); see the log above")
    return summary


def _run_inprocess(cfg: RunConfig, overrides: Mapping[str, Any], *, quiet: bool) -> None:
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    from fedapp.client_app import client_fn
    from fedapp.inprocess import run_inprocess
    from fedapp.server_app import server_fn

    previous = FLOWER_LOGGER.level
    if quiet:
        FLOWER_LOGGER.setLevel(logging.WARNING)
    try:
        run_inprocess(server_fn, client_fn, overrides, cfg.num_clients)
    finally:
        FLOWER_LOGGER.setLevel(previous)


@contextmanager
def local_simulation_superlink(flwr_home: Path, env: dict[str, str]):
    """Start `flower-superlink --simulation` as `flwr run` would, but on free ports and owned by us."""
    http_port, control_port = free_port(), free_port()
    env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(http_port)
    env["FLWR_LOCAL_CONTROL_API_PORT"] = str(control_port)
    log_path = flwr_home / "superlink.log"
    command = [
        console_script("flower-superlink"),
        "--insecure",
        "--simulation",
        "--isolation",
        "subprocess",
        "--control-api-address",
        f"127.0.0.1:{control_port}",
        "--host",
        "127.0.0.1",
        "--port",
        str(http_port),
        "--disable-runtime-dependency-installation",
    ]
    process = start_logged(command, env, log_path)
    try:
        wait_for_health(http_port, process, SUPERLINK_START_TIMEOUT_S, f"flower-superlink (log: {log_path})")
        yield process
    finally:
        stop_process(process)


def _run_flwr(overrides: Mapping[str, Any], num_clients: int, *, quiet: bool) -> None:
    flwr_home = Path(tempfile.mkdtemp(prefix="fedapp-flwr-home-"))
    try:
        env = flower_env(flwr_home)
        run_config = flwr_home / "run-config.toml"
        run_config.write_text(tomli_w.dumps(dict(overrides)))
        federation = f"num-supernodes={num_clients} client-resources-num-cpus=1"
        with local_simulation_superlink(flwr_home, env):
            command = [
                console_script("flwr"),
                "run",
                str(PROJECT_ROOT),
                "--stream",
                "--federation-config",
                federation,
                "--run-config",
                str(run_config),
            ]
            result = subprocess.run(
                command,
                env=env,
                cwd=PROJECT_ROOT,
                text=True,
                stdout=subprocess.PIPE if quiet else None,
                stderr=subprocess.STDOUT,
            )
        if result.returncode != 0:
            tail = (result.stdout or "")[-3000:] if quiet else ""
            raise RunError(f"flwr run exited with code {result.returncode}\n{tail}")
    finally:
        shutil.rmtree(flwr_home, ignore_errors=True)
