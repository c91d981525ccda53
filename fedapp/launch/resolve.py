"""One run's configuration, resolved once: flags, preset, `--set` values and defaults become a
`ResolvedRun` — the Flower keys handed to `flwr run --run-config` (or the in-process engine) and their
checked, typed `RunConfig` — which the checks before a run (`validate`, `fedapp.app.preflight`), the
simulation runner, the experiments and the loopback deployment all take instead of parsing it again."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedapp.app.preflight import check_dependencies, check_run
from fedapp.config.run import ConfigError, RunConfig, default_run_config, parse_run_config
from fedapp.datasets import (
    MAT_PREFIX,
    PARTITION_PLACEHOLDER,
    has_placeholder,
    load_dataset,
    require_files,
    resolve_data_dir,
)
from fedapp.datasets.local import views_of
from fedapp.launch.options import ClientResources, cuda_device_count
from fedapp.launch.outputs import check_outputs
from fedapp.methods import method_spec

ENGINES = ("flwr", "inprocess")
DEFAULT_CLIENTS = 10


@dataclass(frozen=True, eq=False)
class ResolvedRun(Mapping[str, Any]):
    """The run's Flower keys (absolute paths, client count and rounds filled in) — read as a mapping —
    and `config`, the same keys parsed and checked once."""

    overrides: dict[str, Any]
    config: RunConfig

    def __getitem__(self, key: str) -> Any:
        return self.overrides[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.overrides)

    def __len__(self) -> int:
        return len(self.overrides)


def build_overrides(base: Mapping[str, Any], out_dir: Path) -> ResolvedRun:
    """Resolve `base` once: absolute paths for out-dir, node-out-dir, data-dir and the user's own files
    (Flower's processes run in other working directories), the client count a simulation needs and the
    method's own round schedule. Raises ConfigError with one line before any process starts."""
    cfg = parse_run_config(base)  # key names, types and ranges first: cheaper than reading the data
    overrides = dict(base)
    if cfg.dataset.startswith(MAT_PREFIX):  # a relative mat: path means the working directory, if it is there
        relative = Path(cfg.dataset.removeprefix(MAT_PREFIX)).expanduser()
        if not relative.is_absolute() and relative.is_file():
            overrides["dataset"] = MAT_PREFIX + str(relative.resolve())
    if cfg.own_data:  # the user's own file(s): relative to where the command runs
        overrides["dataset"] = absolute_spec(cfg.dataset)
    _resolve_clients(overrides, cfg)
    spec = method_spec(cfg.method)
    if spec.default_rounds and "num-rounds" not in overrides:
        overrides["num-rounds"] = spec.default_rounds  # the method's own schedule (e.g. FSTC's 1 + 40)
    overrides["out-dir"] = str(out_dir.resolve())
    node_dir = str(overrides.get("node-out-dir") or out_dir.resolve() / "nodes" / PARTITION_PLACEHOLDER)
    overrides["node-out-dir"] = os.path.abspath(os.path.expanduser(node_dir))  # each client: OUT/nodes/<id>
    data_dir = resolve_data_dir(overrides.get("data-dir") or None)
    if data_dir is not None:
        overrides["data-dir"] = str(Path(data_dir).resolve())
    derived = {key: value for key, value in overrides.items() if key not in base or base[key] != value}
    return ResolvedRun(overrides, cfg.with_keys(derived))


def _resolve_clients(overrides: dict[str, Any], cfg: RunConfig) -> None:
    """`num-clients` of a simulation: one per view (vertical), one per file, else the given or default
    count; a count that cannot work is a ConfigError naming the fix."""
    spec = method_spec(cfg.method)
    own_files = cfg.own_data and has_placeholder(cfg.dataset)
    if spec.vertical and cfg.own_data and not own_files:
        raise ConfigError(
            f"vertical method '{spec.name}' reads one file per party: put {PARTITION_PLACEHOLDER} in the "
            f"path, e.g. '{cfg.dataset.partition(':')[0]}:/data/view-{PARTITION_PLACEHOLDER}.csv'"
        )
    if spec.vertical and own_files:  # one file per party: --clients says how many
        if not overrides.get("num-clients"):
            raise ConfigError(
                f"dataset '{cfg.dataset}' has one file per party: give --clients (the number of views)"
            )
    elif spec.vertical:  # one client per view
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
    run: ResolvedRun,
    engine: str,
    resources: ClientResources,
    *,
    overwrite: bool = False,
) -> RunConfig:
    """Everything checked before a run starts (the method's optional dependencies, engine, resources,
    data, partition, k, the privacy floor, the output directory and an earlier run's outputs in it, which
    only `overwrite` or `resume` accept); nothing is created, so a dry run and a refused run leave nothing
    behind. Raises ConfigError /
    DatasetError with one line."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine '{engine}'; choose one of {ENGINES}")
    cfg = run.config
    check_dependencies(cfg.method)  # a torch method in a base install: before anything else is read
    if resources.ray_address and engine == "inprocess":
        raise ConfigError("--ray-address needs --engine flwr: the in-process engine runs without Ray")
    resources.validate()
    if cfg.device == "cuda" and cuda_device_count() == 0:
        raise ConfigError("run-config device='cuda' but no CUDA GPU is visible on this machine")
    if not cfg.own_data:  # own files are read whole by check_run
        require_files(cfg.dataset, resolve_data_dir(cfg.data_dir or None))  # so does a missing dataset file
    check_outputs(cfg, overwrite=overwrite)  # before the data: a second run into one folder fails fast
    check_run(cfg, cfg.num_clients)  # data that does not parse, partition, k, out-dir (made by the run)
    return cfg
