"""Checks that need the data, run before any Flower process starts (the runner and the deploy script).

`parse_run_config` checks keys alone; this module checks the run they describe: the dataset's files load
and parse, the partition exists for this many clients, every client holds at least k samples, and the
output directory is writable. Each failure is one line naming the input and what to change, in seconds,
instead of a Ray start-up and thousands of log lines later (or a client error repeated every round).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from fedapp.checkpoint import checkpoint_dir
from fedapp.config import ConfigError, RunConfig
from fedapp.local_data import load_run_dataset, views_of
from fedapp.methods import method_spec
from fedapp.partition import partition_indices


def check_run(cfg: RunConfig, num_clients: int) -> None:
    """Raise ConfigError / DatasetError / PartitionError for a run that cannot work as configured."""
    if num_clients < 1:
        raise ConfigError(
            f"the simulation needs at least 1 client, got {num_clients} (num-clients = 0, 'every connected "
            "SuperNode', only means something in a deployment)"
        )
    check_out_dir(Path(cfg.out_dir))
    if cfg.resume and not (checkpoint_dir(cfg, Path(cfg.out_dir)) / "latest.json").is_file():
        raise ConfigError(
            f"resume=true but there is no checkpoint in {checkpoint_dir(cfg, Path(cfg.out_dir))} "
            "(the first run needs checkpoint-every > 0)"
        )
    data = load_run_dataset(cfg)  # reads and parses every file: a corrupt one fails here
    k = cfg.k or data.n_classes
    if method_spec(cfg.method).vertical:
        n_views = len(views_of(data))
        if num_clients != n_views:
            raise ConfigError(
                f"vertical method '{cfg.method}' needs one client per view: dataset '{cfg.dataset}' has "
                f"{n_views} views, num-clients={num_clients}"
            )
        if data.n_samples < k:
            raise ConfigError(f"k={k} clusters but dataset '{cfg.dataset}' has only {data.n_samples} samples")
        return
    if not method_spec(cfg.method).federated:
        return
    parts = partition_indices(
        data.y, num_clients, cfg.partition, seed=cfg.seed, p=cfg.p, ratio=cfg.ratio, alpha=cfg.alpha
    )
    sizes = [len(part) for part in parts]
    smallest = min(range(num_clients), key=sizes.__getitem__)
    if sizes[smallest] < k:
        raise ConfigError(
            f"k={k} clusters but client {smallest} holds only {sizes[smallest]} samples under partition "
            f"'{cfg.partition}' with {num_clients} clients (sizes {min(sizes)}..{max(sizes)}): use fewer "
            "clients, a smaller k, or another partition"
        )


def check_out_dir(out_dir: Path) -> None:
    """The output directory exists (or can be made) and accepts a file."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise ConfigError(f"output directory {out_dir} is not writable: {exc.strerror or exc}") from None
