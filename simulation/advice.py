"""`fedapp methods --for DATA`: which methods apply to a federation's data and which the measured tables
favour for its shape, with the evidence.

The shape that decides between the text methods is label skew across sites (docs/methods/fstc.md, "Real
data shapes"). It is measured here as FSTC's own run measures it (`fedapp.maths.fstc.site_skew`): every
site's k local k-means centres and sizes in the space the methods cluster in (sentence embeddings for
texts, the features for vectors), the global centres from their union, then each site's share over them
against the federation's. This runs on the machine that holds the sites' files (a simulation, or one
site's administrator with a sample of each); a deployed FSTC run reports the same number in summary.json.

An advisory command writes nothing: the embeddings of a user's own texts stay in memory (`embedding-cache
= off` unless `--set embedding-cache=DIR` names a place); registered benchmark sets, whose texts are
public, use the user cache a run would.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedapp.config.run import RunConfig, parse_run_config
from fedapp.datasets import has_placeholder
from fedapp.datasets.local import load_run_dataset, local_view, owns_file
from fedapp.datasets.registry import dataset_info
from fedapp.datasets.sources import Columns
from fedapp.maths.fstc import SITE_SKEW_WARNING, initial_centres, site_skew
from fedapp.methods import METHODS, methods_for_kind
from fedapp.privacy.floor import CLIENT_MIN_CLUSTER, floored_kmeans
from simulation.tune import client_rows, tune

SKEW_EVIDENCE = "docs/methods/fstc.md#real-data-shapes-label-skewed-sites-long-tailed-clusters-many-clusters"


@dataclass(frozen=True)
class Advice:
    kind: str
    sites: int
    records: list[int]
    skew: list[float] | None  # per site; None: not measured (one site, or a vertical federation)
    applicable: tuple[str, ...]
    favoured: list[tuple[str, str]]  # (method, why with its evidence)
    k_used: str = ""  # the k the skew was measured at, and where it came from
    no_skew: str = ""  # why the skew was not measured

    def render(self) -> str:
        lines = [
            f"data: {self.kind}, {self.sites} site{'s' * (self.sites != 1)}, {sum(self.records)} records "
            f"({self.records} per site)"
        ]
        if self.skew is not None:
            mean = float(np.mean(self.skew))
            shape = "sites hold different clusters" if mean > SITE_SKEW_WARNING else "sites look alike"
            per_site = ", ".join(f"{value:.2f}" for value in self.skew)
            lines.append(f"site skew: mean {mean:.2f} ({per_site}); {shape} (threshold {SITE_SKEW_WARNING})")
            if self.k_used:
                lines.append(f"site skew measured at {self.k_used}")
        elif self.no_skew:
            lines.append(f"site skew: not measured ({self.no_skew})")
        lines.append(f"methods for {self.kind}: {', '.join(self.applicable)}")
        for method, why in self.favoured:
            lines += textwrap.wrap(f"favoured: {method} — {why}", 110, subsequent_indent="    ")
        return "\n".join(lines)


def measure_skew(cfg: RunConfig, k: int, rows: list[np.ndarray]) -> list[float]:
    """FSTC's site skew per site (module docstring) at `k` clusters, from each site's `rows` in the
    space `fedapp tune` would score."""
    points, weights = [], []
    for site, space in enumerate(rows):
        centres, counts, _ = floored_kmeans(space, k, cfg.seed + site, CLIENT_MIN_CLUSTER, n_init=1)
        points.append(centres)
        weights.append(counts.astype(np.float64))
    return site_skew(points, weights, initial_centres(points, weights, k, cfg.seed))


def favoured(kind: str, skew: float | None) -> list[tuple[str, str]]:
    """What the measured tables say for this kind and shape."""
    if kind == "texts":
        if skew is not None and skew > SITE_SKEW_WARNING:
            return [
                (
                    "fsbert-kfed",
                    "with sites holding different topics FSTC's training loses what its start had "
                    f"(StackOverflow alpha 0.3: 51.9 against 70.7 NMI; {SKEW_EVIDENCE}); FSTC with "
                    "select = best falls back to that start when it sees the loss",
                )
            ]
        return [("fstc", f"level with or above fsbert-kfed on IID and long-tailed sites ({SKEW_EVIDENCE})")]
    if kind == "multiview":
        return [("cefmc", METHODS["cefmc"].when + " (docs/methods/cefmc.md)")]
    if kind == "images":
        return [("ccfc", "cluster-contrastive training over an encoder (docs/methods/ccfc.md)")]
    return [
        ("kfed", "one round, k local centres per site (docs/methods/baselines.md); ffcm for soft memberships")
    ]


def advise(dataset: str, overrides: dict[str, Any]) -> Advice:
    """Read every site's data as a run would (`overrides`: run-config keys), measure, and advise."""
    keys = {"num-clients": 4, **overrides, "dataset": dataset}
    columns = Columns.parse(
        str(keys.get("text-column", "text")),
        str(keys.get("label-column", "label")),
        str(keys.get("id-column", "")),
        str(keys.get("feature-columns", "")),
    )
    kind = dataset_info(dataset, columns=columns).kind
    # a method that reads this kind, so every site's data loads as that run would read it
    reader = "fsbert-kfed" if kind == "texts" else "cefmc" if kind == "multiview" else "kfed"
    cfg = parse_run_config({"method": reader, **keys})
    if cfg.own_data and "embedding-cache" not in overrides:  # nothing derived from their records on disk
        cfg = cfg.with_keys({"embedding-cache": "off"})
    skew, k_used, no_skew = None, "", ""
    if kind == "multiview":  # vertical parties hold the same records: no skew
        sites = [local_view(cfg, site, cfg.num_clients) for site in range(cfg.num_clients)]
        records, no_skew = [site.n_samples for site in sites], "the parties hold the same records"
    elif cfg.num_clients < 2:  # one site: nothing to compare it with
        records, no_skew = [load_run_dataset(cfg, 0 if owns_file(cfg) else None).n_samples], "one site"
    else:
        first = load_run_dataset(cfg, 0 if has_placeholder(cfg.dataset) else None)
        sites, rows = client_rows(cfg)
        records = [site.n_samples for site in sites]
        if cfg.k:
            k, k_used = cfg.k, f"k = {cfg.k} (given)"
        elif first.labelled:
            k, k_used = first.n_classes, f"k = {first.n_classes} (the classes)"
        else:  # the skew depends on k: measured where a k = 0 run would cluster, not at a fixed guess
            chosen = tune(cfg, rows).outcome
            k = int(chosen["chosen_k"])
            verdict = chosen.get("confidence", {}).get("verdict", "-")
            k_used = f"k = {k} (chosen without labels as a k = 0 run would, {verdict})"
        skew = measure_skew(cfg, k, rows)
    mean = None if skew is None else float(np.mean(skew))
    return Advice(
        kind, len(records), records, skew, methods_for_kind(kind), favoured(kind, mean), k_used, no_skew
    )
