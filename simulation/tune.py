"""`fedapp tune`: choose k without labels (`fedapp.maths.selection`), and `fedapp run` with k = 0 on
unlabelled data, which runs the same selection first.

The selection's two rounds run here, in the CLI's process, over each client's own rows exactly as its
client would compute them: round A's local centres and sizes, round B's per-candidate sums. Only those
arrays enter the server's side (`select_k`); their bytes are counted as they would cross the wire. It is
not a Flower stage yet, so a deployment (`fedapp deploy`) must still be given k, and so must a run with
secagg = true: round A's local centres cannot be hidden by a sum (docs/model-selection.md).

The space a method is judged in is the one it clusters in at its start: text methods (FSTC and its
variants, FSCCL, the text k-FEDs) their sentence embeddings, every other horizontal method its features
(images flattened, multi-view sets concatenated; CCFC's encoder is untrained before its first round).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedapp.app.floor_rules import run_floor
from fedapp.app.k_selection import selection_space
from fedapp.config.run import ConfigError, RunConfig
from fedapp.datasets import PARTITION_PLACEHOLDER
from fedapp.datasets.local import LocalData, load_run_dataset, local_partition, own_file, owns_file
from fedapp.launch.resolve import ResolvedRun
from fedapp.maths.selection import CRITERIA, Selection, select_k
from fedapp.methods import method_spec

TUNE_JSON, TUNE_PNG = "tune.json", "tune.png"
SELECTION_MAX_LENGTH = 32  # encoder input length in tokens: FSBERT's, FSTC's and FSCCL's default
BYTES = 8  # float64 / int64 on the wire


def needs_selection(cfg: RunConfig) -> bool:
    """k = 0 on data without labels, for a method whose clusters are run-config k."""
    spec = method_spec(cfg.method)
    if cfg.k or spec.own_k or not spec.federated:
        return False
    if cfg.own_data and owns_file(cfg):
        return not all(own_file(cfg, pid).labelled for pid in range(cfg.num_clients))
    return not load_run_dataset(cfg).labelled


def client_rows(cfg: RunConfig) -> tuple[list[LocalData], list[np.ndarray]]:
    """Every simulated client's data and its rows in the selection space."""
    from fedapp.features.texts import embedding_cache, local_embeddings

    space = selection_space(cfg)
    locals_, rows = [], []
    for pid in range(cfg.num_clients):
        local = own_file(cfg, pid) if owns_file(cfg) else local_partition(cfg, pid, cfg.num_clients)
        if space == "embeddings":
            node_dir = Path(cfg.node_out_dir.replace(PARTITION_PLACEHOLDER, str(pid)))
            cache = embedding_cache(
                cfg.embedding_cache, own_data=cfg.own_data, node_dir=node_dir, partition_id=pid
            )
            vectors = local_embeddings(local, cfg.embedding_model, SELECTION_MAX_LENGTH, cfg.device, cache)
        else:
            vectors = local.features
        locals_.append(local)
        rows.append(np.asarray(vectors, dtype=np.float64))
    return locals_, rows


@dataclass(frozen=True)
class Tuned:
    """A selection with its cost: the extra rounds, bytes each way and seconds it took."""

    selection: Selection
    candidates: dict[int, np.ndarray]
    cost: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {**self.selection.to_json(), "cost": self.cost}


def tune(cfg: RunConfig, rows: list[np.ndarray] | None = None) -> Tuned:
    """Run both selection rounds over the run's clients (`rows`: their vectors, if already computed)."""
    selection_space(cfg)  # a run that cannot choose k says why
    started = time.perf_counter()
    rows = rows if rows is not None else client_rows(cfg)[1]
    selection, candidates = select_k(rows, cfg.k_min, cfg.k_max, cfg.seed, run_floor(cfg), cfg.k_rule)
    dims = rows[0].shape[1]
    local_k = [min(cfg.k_max, len(X) // run_floor(cfg)) for X in rows]  # an upper bound under merges
    candidate_rows = sum(candidates)  # sum of k over candidates
    cost = {
        "extra_rounds": 2,
        "bytes_up": float(
            BYTES
            * (
                sum(k * (dims + 1) for k in local_k)
                + len(rows) * (candidate_rows * (dims + 3) + len(candidates))
            )
        ),
        "bytes_down": float(BYTES * len(rows) * candidate_rows * dims),
        "seconds": round(time.perf_counter() - started, 2),
    }
    return Tuned(selection, candidates, cost)


def format_table(selection: Selection) -> str:
    """One line per candidate: k, inertia and each criterion; the chosen k marked."""
    names = ("inertia", *CRITERIA)
    lines = [f"{'k':>4}  " + "  ".join(f"{name:>21}" for name in names)]
    for k, row in sorted(selection.table.items()):
        cells = "  ".join(f"{'-' if row[n] is None else f'{row[n]:.6g}':>21}" for n in names)
        lines.append(f"{k:>4}  {cells}" + ("   <- chosen" if k == selection.k else ""))
    lines.append(f"chosen k = {selection.k} (rule: {selection.rule})")
    return "\n".join(lines)


def write_tune(out_dir: Path, tuned: Tuned) -> None:
    """tune.json and tune.png (each criterion against k, the chosen k marked) into `out_dir`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / TUNE_JSON).write_text(json.dumps(tuned.to_json(), indent=2) + "\n")
    table = tuned.selection.table
    ks = sorted(table)
    figure, axes = plt.subplots(1, len(CRITERIA), figsize=(4 * len(CRITERIA), 3.2))
    for axis, name in zip(axes, CRITERIA, strict=True):
        axis.plot(ks, [np.nan if table[k][name] is None else table[k][name] for k in ks], marker=".")
        axis.axvline(
            tuned.selection.k, color="tab:red", linestyle="--", label=f"chosen k={tuned.selection.k}"
        )
        axis.set_xlabel("k")
        axis.set_title(name.replace("_", " "))
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(out_dir / TUNE_PNG, dpi=100)
    plt.close(figure)


def with_chosen_k(run: ResolvedRun, *, quiet: bool = False) -> tuple[ResolvedRun, Tuned | None]:
    """`fedapp run`: the run with k chosen first when it needs it (`needs_selection`), and the selection;
    unless `quiet`, a line before (it may embed every text first) and one with the choice."""
    if not needs_selection(run.config):
        return run, None
    cfg = run.config
    if not quiet:
        print(
            f"k = 0 without labels: choosing k in {cfg.k_min}..{cfg.k_max} ({cfg.k_rule}, 2 rounds)",
            flush=True,
        )
    tuned = tune(cfg)
    if not quiet:
        print(
            f"chosen k = {tuned.selection.k} in {tuned.cost['seconds']:.1f} s (tune.json, tune.png)",
            flush=True,
        )
    overrides = {**run.overrides, "k": tuned.selection.k}
    return ResolvedRun(overrides, run.config.with_keys({"k": tuned.selection.k})), tuned


def record_selection(out_dir: Path, summary: dict[str, Any], tuned: Tuned) -> dict[str, Any]:
    """summary.json with `k_selection` (what `fedapp tune` would print), and tune.json / tune.png."""
    write_tune(out_dir, tuned)
    summary = {**summary, "k_selection": tuned.to_json()}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def tune_command(run: ResolvedRun, *, overwrite: bool = False) -> str:
    """`fedapp tune`: the selection over the run's clients, its files in --out; returns what to print.
    An earlier tune.json / tune.png in --out is refused unless `overwrite`."""
    out_dir = Path(run.config.out_dir)
    earlier = [out_dir / name for name in (TUNE_JSON, TUNE_PNG) if (out_dir / name).exists()]
    if earlier and not overwrite:
        raise ConfigError(f"{out_dir} holds an earlier {earlier[0].name}: pass --overwrite or another --out")
    tuned = tune(run.config)
    write_tune(out_dir, tuned)
    cost = tuned.cost
    return (
        f"{format_table(tuned.selection)}\n"
        f"cost: {cost['extra_rounds']} rounds, {cost['bytes_up'] / 1e6:.2f} MB up, "
        f"{cost['bytes_down'] / 1e6:.2f} MB down, {cost['seconds']:.1f} s\n"
        f"wrote {out_dir / TUNE_JSON} and {out_dir / TUNE_PNG}"
    )
