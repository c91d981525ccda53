"""Run experiments: one run (`run`), a TOML experiment file (`experiment`), or list datasets/methods.

Engines:
- `flwr` (default): Flower's Ray simulation through `flwr run`, against a local simulation SuperLink
  that this runner starts on free loopback ports with a private FLWR_HOME and always stops by PID.
- `inprocess`: the same strategy/client classes under Flower's legacy `Server` loop without Ray
  (fedapp/app/inprocess.py) — for seed sweeps; results are identical in kind.
Centralized references (method `kmeans`) run directly, without Flower.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from fedapp.app.preflight import check_run
from fedapp.config.run import PROJECT_ROOT, ConfigError, RunConfig, default_run_config, parse_run_config
from fedapp.datasets import (
    MAT_PREFIX,
    PARTITION_PLACEHOLDER,
    has_placeholder,
    is_source_spec,
    load_dataset,
    require_files,
    resolve_data_dir,
)
from fedapp.datasets.local import views_of
from fedapp.methods import METHODS, method_spec
from fedapp.report.records import mark_summary
from simulation.processes import (
    RUN_TOKEN_ENV,
    ProcessError,
    console_script,
    flower_env,
    free_port,
    run_filtered,
    start_logged,
    stop_process,
    stop_run,
    wait_for_health,
)
from simulation.watchdog import start_watchdog, stop_watchdog

ENGINES = ("flwr", "inprocess")
SUPERLINK_START_TIMEOUT_S = 60
DEFAULT_CLIENTS = 10
DEFAULT_CPUS_PER_CLIENT = 1
LOG_NAME = "flower.log"  # everything Flower prints goes here; the terminal gets one line per round


@dataclass(frozen=True)
class ClientResources:
    """What Ray reserves per simulated client: `client-resources-num-cpus` / `-num-gpus`.

    Ray runs as many clients at once as the machine's CPUs (and GPUs) allow: 1 CPU per client on 2 cores
    means 2 clients at a time; `gpus=0.1` lets 10 clients share one GPU.
    """

    cpus: int = DEFAULT_CPUS_PER_CLIENT
    gpus: float = 0.0

    def federation_config(self, num_clients: int) -> str:
        """The `flwr run --federation-config` value for a simulation of `num_clients` SuperNodes."""
        return (
            f"num-supernodes={num_clients} client-resources-num-cpus={self.cpus} "
            f"client-resources-num-gpus={self.gpus:g}"
        )

    def validate(self, cpu_count: int | None = None, gpu_count: int | None = None) -> None:
        """Refuse what Ray could never schedule (it would wait forever instead of failing)."""
        import os

        if cpu_count is None:
            cpu_count = os.cpu_count() or 1
        if float(self.cpus) != int(self.cpus) or self.cpus < 1:
            raise ConfigError(f"--cpus-per-client must be a whole number >= 1, got {self.cpus}")
        if self.cpus > cpu_count:
            raise ConfigError(f"--cpus-per-client {self.cpus} exceeds the {cpu_count} CPUs of this machine")
        if self.gpus < 0:
            raise ConfigError(f"--gpus-per-client must be >= 0, got {self.gpus:g}")
        if self.gpus > 0:
            if gpu_count is None:
                gpu_count = cuda_device_count()
            if gpu_count == 0:
                raise ConfigError(
                    f"--gpus-per-client {self.gpus:g} but no CUDA GPU is visible on this machine "
                    "(Ray would never schedule a client); use --gpus-per-client 0"
                )
            if self.gpus > gpu_count:
                raise ConfigError(f"--gpus-per-client {self.gpus:g} exceeds the {gpu_count} GPU(s) here")


def cuda_device_count() -> int:
    """CUDA devices torch sees (0 without torch or CUDA); no torch import where no NVIDIA device exists."""
    import glob

    if not glob.glob("/dev/nvidia[0-9]*") and not Path("/proc/driver/nvidia/gpus").is_dir():
        return 0  # importing torch takes seconds: skip it where there cannot be a CUDA device
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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


def merge_flags(
    flags: Mapping[str, Any], settings: Mapping[str, Any], out: Path | None = None
) -> dict[str, Any]:
    """Flag values + `--set` values; one key given two different values (`--clients 3 --set
    num-clients=5`, `--out X --set out-dir=Y`) is a ConfigError naming both, never resolved silently."""
    named = {**flags, **({"out-dir": str(out)} if out is not None else {})}
    for key, value in settings.items():
        if key in named and named[key] is not None and str(named[key]) != str(value):
            flag = FLAG_OF.get(key, key)
            raise ConfigError(f"{flag} {named[key]} and --set {key}={value} disagree: give one of them")
    merged = {key: value for key, value in flags.items() if value is not None}
    merged.update(settings)
    return merged


FLAG_OF = {
    "num-clients": "--clients",
    "num-rounds": "--rounds",
    "out-dir": "--out",
    "data-dir": "--data-dir",
    "method": "--method",
    "dataset": "--dataset",
    "seed": "--seed",
    "partition": "--partition",
    "device": "--device",
}


def path_argument(text: str) -> Path:
    """argparse type of a path option: an empty or blank path is an error, not the current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give a folder or file name")
    return Path(text)


def build_overrides(base: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """Absolute paths for out-dir and data-dir: Flower's processes run in other working directories."""
    overrides = dict(base)
    parse_run_config(overrides)  # key names, types and ranges first: cheaper than reading the data
    dataset = str(overrides.get("dataset", ""))
    if dataset.startswith(MAT_PREFIX):  # a relative mat: path means the working directory, if it is there
        relative = Path(dataset.removeprefix(MAT_PREFIX)).expanduser()
        if not relative.is_absolute() and relative.is_file():
            overrides["dataset"] = MAT_PREFIX + str(relative.resolve())
    if is_source_spec(dataset):  # the user's own file(s): relative to where the command runs
        overrides["dataset"] = absolute_spec(dataset)
    spec = METHODS.get(str(overrides.get("method")))
    own_files = is_source_spec(dataset) and has_placeholder(dataset)
    if spec is not None and spec.vertical and is_source_spec(dataset) and not own_files:
        raise ConfigError(
            f"vertical method '{spec.name}' reads one file per party: put {PARTITION_PLACEHOLDER} in the "
            f"path, e.g. '{dataset.partition(':')[0]}:/data/view-{PARTITION_PLACEHOLDER}.csv'"
        )
    if spec is not None and spec.vertical and own_files:  # one file per party: --clients says how many
        if not overrides.get("num-clients"):
            raise ConfigError(
                f"dataset '{dataset}' has one file per party: give --clients (the number of views)"
            )
    elif spec is not None and spec.vertical:  # one client per view
        n_views = count_views(overrides)
        if overrides.get("num-clients") and int(overrides["num-clients"]) != n_views:
            raise ConfigError(
                f"vertical method '{spec.name}' needs one client per view: dataset "
                f"'{overrides.get('dataset')}' has {n_views} views, num-clients={overrides['num-clients']}"
            )
        overrides["num-clients"] = n_views
    if "num-clients" in overrides and int(overrides["num-clients"]) < 1:
        raise ConfigError(
            f"--clients must be >= 1 for a simulation, got {overrides['num-clients']} "
            "(num-clients = 0, 'every connected SuperNode', only means something in a deployment)"
        )
    overrides["num-clients"] = int(overrides.get("num-clients") or DEFAULT_CLIENTS)  # runner: fixed size
    if spec is not None and spec.default_rounds and "num-rounds" not in overrides:
        overrides["num-rounds"] = spec.default_rounds  # the method's own schedule (e.g. FSTC's 1 + 40)
    overrides["out-dir"] = str(out_dir.resolve())
    node_dir = str(overrides.get("node-out-dir") or out_dir.resolve() / "nodes" / PARTITION_PLACEHOLDER)
    overrides["node-out-dir"] = os.path.abspath(os.path.expanduser(node_dir))  # each client: OUT/nodes/<id>
    data_dir = resolve_data_dir(overrides.get("data-dir") or None)
    if data_dir is not None:
        overrides["data-dir"] = str(Path(data_dir).resolve())
    return overrides


def absolute_spec(spec: str) -> str:
    """A source spec with its path made absolute (Flower's processes run in other directories)."""
    prefix, _, path = spec.partition(":")
    return f"{prefix}:{os.path.abspath(os.path.expanduser(path))}"


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


def validate(
    overrides: Mapping[str, Any], engine: str, resources: ClientResources, *, dry_run: bool = False
) -> RunConfig:
    """Everything checked before a run starts (keys, resources, data, partition, k, output directory);
    `dry_run`: the same, creating nothing. Raises ConfigError / DatasetError with one line."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine '{engine}'; choose one of {ENGINES}")
    cfg = parse_run_config(overrides)  # fails before any process starts
    if cfg.secagg and engine == "inprocess":
        raise ConfigError("secagg=true needs --engine flwr: Flower's SecAgg+ runs on its message runtime")
    resources.validate()
    if cfg.device == "cuda" and cuda_device_count() == 0:
        raise ConfigError("run-config device='cuda' but no CUDA GPU is visible on this machine")
    if not is_source_spec(cfg.dataset):  # own files are read whole by check_run
        require_files(cfg.dataset, resolve_data_dir(cfg.data_dir or None))  # so does a missing dataset file
    check_run(cfg, cfg.num_clients, create=not dry_run)  # data that does not parse, partition, k, out-dir
    return cfg


def execute(
    overrides: Mapping[str, Any],
    engine: str = "flwr",
    *,
    quiet: bool = False,
    resources: ClientResources | None = None,
) -> dict[str, Any]:
    """Validate, run, and return the parsed summary.json.

    The terminal gets one line per round (unless `quiet`); everything Flower prints goes to
    `<out-dir>/flower.log`.
    """
    import json

    resources = resources or ClientResources()
    cfg = validate(overrides, engine, resources)
    out_dir = Path(cfg.out_dir)
    summary_path = out_dir / "summary.json"
    if summary_path.exists():
        summary_path.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / LOG_NAME
    if not method_spec(cfg.method).federated:
        from fedapp.app.centralized import run_centralized

        run_centralized(cfg)
    elif engine == "inprocess":
        _run_inprocess(cfg, overrides, log_path, quiet=quiet)
    else:
        _run_flwr(overrides, cfg.num_clients, resources, log_path, quiet=quiet)
    if not summary_path.exists():
        raise RunError(f"the run wrote no {summary_path}; see {log_path}\n{_log_tail(log_path)}")
    summary = json.loads(summary_path.read_text())
    if summary.get("status", "running") == "running" and method_spec(cfg.method).federated:
        raise RunError(
            f"the run broke off after round {summary.get('rounds')} of {cfg.num_rounds} without finishing; "
            f"see {log_path}\n{_log_tail(log_path)}"
        )
    return summary


def _log_tail(log_path: Path, lines: int = 25) -> str:
    """The last lines of the run's log, for an error message."""
    if not log_path.exists():
        return ""
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])


def _run_inprocess(cfg: RunConfig, overrides: Mapping[str, Any], log_path: Path, *, quiet: bool) -> None:
    from fedapp.app.client_app import client_fn
    from fedapp.app.inprocess import run_inprocess
    from fedapp.app.server_app import server_fn

    with flower_log_to_file(log_path, quiet=quiet):
        run_inprocess(server_fn, client_fn, overrides, cfg.num_clients)


@contextmanager
def flower_log_to_file(log_path: Path, *, quiet: bool) -> Iterator[None]:
    """Flower's logger writes to `log_path` only; the terminal gets the per-round progress lines."""
    import logging
    import sys

    from flwr.common.logger import FLOWER_LOGGER

    from fedapp.report.records import PROGRESS_MARKER

    saved = (list(FLOWER_LOGGER.handlers), FLOWER_LOGGER.level)
    file_handler = logging.FileHandler(log_path, mode="w")
    file_handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s: %(message)s"))
    handlers: list[logging.Handler] = [file_handler]
    if not quiet:
        console = logging.StreamHandler(sys.stdout)
        console.addFilter(lambda record: PROGRESS_MARKER in record.getMessage())
        console.setFormatter(_ProgressFormatter())
        handlers.append(console)
    FLOWER_LOGGER.handlers = handlers
    FLOWER_LOGGER.setLevel(logging.INFO)
    try:
        yield
    finally:
        file_handler.close()
        FLOWER_LOGGER.handlers, level = saved
        FLOWER_LOGGER.setLevel(level)


class _ProgressFormatter:
    """Only the text after the progress marker."""

    def format(self, record: Any) -> str:
        from fedapp.report.records import progress_text

        return progress_text(record.getMessage())


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


def _run_flwr(
    overrides: Mapping[str, Any], num_clients: int, resources: ClientResources, log_path: Path, *, quiet: bool
) -> None:
    flwr_home = Path(tempfile.mkdtemp(prefix="fedapp-flwr-home-"))
    env = flower_env(flwr_home)
    guard = start_watchdog(env[RUN_TOKEN_ENV], [flwr_home])  # if this process is SIGKILLed
    started: list[subprocess.Popen] = []
    lost = ""  # the SuperLink died on its own: said once every process of the run has stopped
    try:
        run_config = flwr_home / "run-config.toml"
        run_config.write_text(tomli_w.dumps(dict(overrides)))
        federation = resources.federation_config(num_clients)
        with local_simulation_superlink(flwr_home, env) as superlink:
            started.append(superlink)
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
            returncode = run_filtered(command, env, log_path, quiet=quiet, cwd=PROJECT_ROOT, started=started)
            if returncode != 0 and superlink.poll() is not None:  # it died on its own, mid-run
                lost = f"SuperLink connection lost (flower-superlink exit code {superlink.returncode})"
        if returncode != 0 and not lost:
            raise RunError(f"flwr run exited with code {returncode}; see {log_path}\n{_log_tail(log_path)}")
    finally:
        leftovers = stop_run(env[RUN_TOKEN_ENV], started)  # Ray's workers too, found by the run token
        if leftovers:
            print(f"warning: processes {leftovers} of this run did not stop", file=sys.stderr)
        shutil.rmtree(flwr_home, ignore_errors=True)
        stop_watchdog(guard)
    if lost:  # the ServerApp is gone now: nothing overwrites the cause any more
        mark_summary(log_path.parent, "failed", lost)
        raise RunError(f"{lost}; see {log_path}")
