"""Checks that need the data, run before any Flower process starts (the runner and the deploy script).

`parse_run_config` checks keys alone; this module checks the run they describe: the method's optional
dependencies are installed (`check_dependencies`: a torch method in a base install), the dataset's files load
and parse, the partition exists for this many clients, every client holds at least k samples and at least
the privacy floor where its method's clients refuse below it, their local centres can reach k
(`fedapp.app.floor_rules`), vertical parties' own files share enough ids, and the output directory is
writable. Each failure is one line naming the input and what to change, in seconds,
instead of a Ray start-up and thousands of log lines later (or a client error repeated every round).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedapp.app.checkpoint import checkpoint_dir
from fedapp.app.floor_rules import FloorRule, floor_rule, run_floor
from fedapp.app.k_selection import selection_space
from fedapp.config.run import ConfigError, RunConfig
from fedapp.datasets import Dataset, DatasetError, has_placeholder
from fedapp.datasets.local import columns_of, expected_kind, load_run_dataset, views_of
from fedapp.datasets.partition import partition_indices
from fedapp.datasets.streaming import Summary, streams, summary
from fedapp.methods import method_spec, missing_modules
from fedapp.privacy.alignment import AlignmentError, intersect
from fedapp.privacy.plan import check_delta

LISTED_SITES = 8  # per-client figures in a message beyond this many are cut (messages stay one line)


@dataclass(frozen=True)
class Site:
    """One client's data as the checks see it: its partition id, where its records come from, how many."""

    partition_id: int
    source: str  # its file, or the partition that gives it its records
    records: int

    def holds(self) -> str:
        return f"client {self.partition_id}: {self.source} holds {self.records} records"


def check_dependencies(method: str) -> None:
    """A method whose code needs an optional dependency group (`MethodSpec.extra`) that is not installed
    here: one line naming the extra, instead of an ImportError after the federation started."""
    spec = method_spec(method)
    missing = missing_modules(spec)
    if missing:
        raise ConfigError(
            f"method '{method}' needs the '{spec.extra}' extra ({', '.join(missing)} not installed here): "
            f"pip install 'fedapp[{spec.extra}]' (bash scripts/setup.sh installs everything)"
        )


def check_run(cfg: RunConfig, num_clients: int) -> None:
    """Raise ConfigError / DatasetError / PartitionError for a run that cannot work as configured.

    The output directory is checked, not made (`check_out_dir`): a refused run leaves none. k = 0 on
    unlabelled own files is chosen before round 1 (`strategies.k_choice`), so such a run is checked with its
    smallest candidate, k-min."""
    if num_clients < 1:
        raise ConfigError(
            f"the simulation needs at least 1 client, got {num_clients} (num-clients = 0, 'every connected "
            "SuperNode', only means something in a deployment)"
        )
    check_out_dir(Path(cfg.out_dir))
    if cfg.checkpoint_every or cfg.resume:
        checkpoints = checkpoint_dir(cfg, Path(cfg.out_dir))
        if checkpoints.exists() and not checkpoints.is_dir():
            raise ConfigError(f"checkpoint-dir {checkpoints} is a file, not a folder")
        check_out_dir(checkpoints)
    if cfg.resume and not (checkpoint_dir(cfg, Path(cfg.out_dir)) / "latest.json").is_file():
        raise ConfigError(
            f"resume=true but there is no checkpoint in {checkpoint_dir(cfg, Path(cfg.out_dir))} "
            "(the first run needs checkpoint-every > 0)"
        )
    if cfg.own_data and has_placeholder(cfg.dataset):
        check_own_files(cfg, num_clients)
        return
    data = load_run_dataset(cfg)  # reads and parses every file: a corrupt one fails here
    k = cfg.k or _unlabelled_k(cfg, data.labelled, f"dataset '{cfg.dataset}' has") or data.n_classes
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
    check_delta(cfg, sizes)
    smallest = min(range(num_clients), key=sizes.__getitem__)
    if sizes[smallest] < k:
        raise ConfigError(
            f"k={k} clusters but client {smallest} holds only {sizes[smallest]} samples under partition "
            f"'{cfg.partition}' with {num_clients} clients (sizes {min(sizes)}..{max(sizes)}): use fewer "
            "clients, a smaller k, or another partition"
        )
    source = f"partition '{cfg.partition}' of {cfg.dataset} ({num_clients} clients)"
    check_floor(cfg, [Site(i, source, size) for i, size in enumerate(sizes)], k)


def check_own_files(cfg: RunConfig, num_clients: int) -> None:
    """One file per client (`{partition-id}`): each reads, fits the method, holds k records, and every
    client's vectors have the same width. Errors name the client (and, from the reader, file/row/column)."""
    vertical = method_spec(cfg.method).vertical
    files: list[Dataset | Summary] = []
    for partition_id in range(num_clients):
        try:
            files.append(_own_file(cfg, partition_id, vertical))
        except DatasetError as exc:
            raise DatasetError(f"client {partition_id}: {exc}") from None
    labelled = [data.labelled for data in files]
    unlabelled = [i for i, has in enumerate(labelled) if not has]
    k_min = 0 if cfg.k else _unlabelled_k(cfg, not unlabelled, f"client(s) {unlabelled} have")
    k = cfg.k or k_min or max(data.n_classes for data in files)
    key = "k-min" if k_min else "k"  # the key to change: k = 0 chooses k, trying k-min first
    for partition_id, data in enumerate(files):
        if data.n_samples < k:
            raise ConfigError(
                f"client {partition_id}: {data.name} holds {data.n_samples} records, "
                f"fewer than {key}={k} clusters: lower {key}, or give it more records"
            )
        if vertical and (isinstance(data, Summary) or data.ids is None):
            raise ConfigError(
                f"client {partition_id}: {data.name}: vertical parties align by id: set id-column"
            )
    if vertical:
        check_shared_ids([data for data in files if isinstance(data, Dataset)], k)
        return
    check_delta(cfg, [data.n_samples for data in files])
    check_floor(cfg, [Site(i, data.name, data.n_samples) for i, data in enumerate(files)], k, key)
    widths = {i: width for i, data in enumerate(files) if (width := _width(data)) is not None}
    if len(set(widths.values())) > 1:
        first = min(widths)
        odd = next(i for i, width in widths.items() if width != widths[first])
        raise DatasetError(
            f"client {odd}: {files[odd].name} has shape {widths[odd]} per record, client "
            f"{first}'s file {widths[first]}: every node needs the same feature columns / image size"
        )


def _own_file(cfg: RunConfig, partition_id: int, vertical: bool) -> Dataset | Summary:
    """A client's own file as the checks need it: read whole, or, for a vector file the clients stream
    (`fedapp.datasets.streaming`: larger than `STREAM_ABOVE_BYTES`), its records, width and labels from the
    metadata, the first batch and the label column, so a file larger than memory is never held here.
    Its other cells are checked by the client's streamed parse (the same one-line errors, at its first
    message)."""
    spec, expect, columns = cfg.dataset, expected_kind(cfg.method), columns_of(cfg)
    whole = vertical or cfg.max_samples or cfg.imbalance  # clients read these whole too (`own_file`)
    if not whole and streams(spec, columns, partition_id, expect):
        return summary(spec, columns, partition_id, expect)
    return load_run_dataset(cfg, partition_id)


def _width(data: Dataset | Summary) -> int | tuple[int, ...] | None:
    """A record's shape: the feature count, or an image's shape; None for texts."""
    if isinstance(data, Summary):
        return data.width
    if data.images is not None or data.vectors is not None:
        return data.image_shape or data.features.shape[1]
    return None


def _unlabelled_k(cfg: RunConfig, labelled: bool, who: str) -> int:
    """k = 0: 0 where the classes give k; k-min where the run chooses k first (own files); else a
    ConfigError."""
    if labelled or method_spec(cfg.method).own_k:
        return 0
    if not cfg.own_data:  # registered sets: only their classes give k
        raise ConfigError(f"{who} no labels, so k cannot default to the classes: set k (or see fedapp tune)")
    selection_space(cfg)  # vertical methods and DP cannot choose k
    return cfg.k_min


def check_floor(cfg: RunConfig, sites: Sequence[Site], k: int, key: str = "k") -> None:
    """The privacy floor against every site's records, and k against the local centres it lets the
    clients send (`fedapp.app.floor_rules`), for the floor every client enforces at least. `key`: the
    run-config key k came from (`k-min` when the run chooses k)."""
    rule, floor = floor_rule(cfg, k), run_floor(cfg)
    check_sites_above_floor(sites, rule, floor, cfg.method)
    check_local_centres(sites, rule, floor, k, cfg.method, key)


def check_sites_above_floor(sites: Sequence[Site], rule: FloorRule, floor: int, method: str) -> None:
    """A client with fewer records than the floor sends nothing where its method refuses below it: the run
    would lose that client in its first round (or, one-shot, its only one)."""
    if not rule.refuses_below_floor:
        return
    small = next((site for site in sites if site.records < floor), None)
    if small is not None:
        raise ConfigError(
            f"{small.holds()}, fewer than the privacy floor min-cluster-size={floor}: a {method} client "
            "that small sends nothing; give it more records or leave it out"
        )


def check_local_centres(
    sites: Sequence[Site], rule: FloorRule, floor: int, k: int, method: str, key: str = "k"
) -> None:
    """The server clusters the clients' local centres into k: fewer than k in all (k' <= n // floor per
    client) and its merge fails, after the rounds it took to collect them."""
    if not (rule.needs_k and rule.asked):
        return
    sendable = [rule.sendable(site.records, floor) for site in sites]
    if sum(sendable) >= k:
        return
    figures = " + ".join(str(count) for count in sendable[:LISTED_SITES])
    figures += " + ..." if len(sendable) > LISTED_SITES else ""
    per_client = (
        f"k' <= records // min-cluster-size={floor} per client: {figures}"
        if rule.capped
        else f"{rule.asked} per client"
    )
    raise ConfigError(
        f"{key}={k} clusters but the {len(sites)} {method} clients can send only {sum(sendable)} local "
        f"centres ({per_client}): lower {key}, or use fewer, larger clients"
    )


def check_shared_ids(files: Sequence[Dataset], k: int) -> None:
    """Vertical parties' own files line up by id: the ids every party holds must reach k and 10 % of the
    smallest party's (the rule the alignment round applies to their hashes)."""
    ids = {
        party: np.array(data.ids if data.ids is not None else [], dtype=str)
        for party, data in enumerate(files)
    }
    try:
        intersect(ids, k)
    except AlignmentError as exc:
        raise ConfigError(f"{', '.join(data.name for data in files)}: {exc}") from None


def check_out_dir(out_dir: Path, *, create: bool = False) -> None:
    """The output directory exists or can be made, and accepts a file: checked by making what is missing
    and writing a file there, then removing both, so a run refused by a later check (or a dry run) leaves
    no empty folder behind; a folder that was already there is never removed. `create`: keep the folder."""
    missing = [folder for folder in (out_dir.absolute(), *out_dir.absolute().parents) if not folder.exists()]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise ConfigError(f"output directory {out_dir} is not writable: {exc.strerror or exc}") from None
    finally:
        if not create:
            for folder in missing:  # deepest first: only the folders this check made
                with contextlib.suppress(OSError):
                    folder.rmdir()
