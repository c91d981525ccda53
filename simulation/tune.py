"""`fedapp tune`: choose k without labels (`fedapp.maths.selection`) over a simulation's clients, and print
the table.

The selection's two rounds run here, in the CLI's process, over each client's own rows exactly as its
client computes them (`fedapp.app.k_selection.selection_rows`): round A's local centres and sizes, round
B's per-candidate sums. Only those arrays enter the server's side (`select_k`); their bytes are counted as
they would cross the wire. A run (`fedapp run`, `fedapp deploy`) with k = 0 on unlabelled files runs the
same two rounds as Flower messages before its first round (`strategies.k_choice`).

The space a method is judged in is the one it clusters in at its start: text methods (FSTC and its
variants, FSCCL, the text k-FEDs) their sentence embeddings, every other horizontal method its features
(images flattened, multi-view sets concatenated; CCFC's encoder is untrained before its first round).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedapp.app.floor_rules import run_floor
from fedapp.app.k_selection import selection_rows, selection_space
from fedapp.config.run import ConfigError, RunConfig
from fedapp.datasets.local import LocalData, local_partition, own_file, owns_file
from fedapp.launch.resolve import ResolvedRun
from fedapp.maths.selection import Selection, select_k
from fedapp.report.selection_files import TUNE_JSON, TUNE_PNG, format_table, write_selection

BYTES = 8  # float64 / int64 on the wire


def client_rows(cfg: RunConfig) -> tuple[list[LocalData], list[np.ndarray]]:
    """Every simulated client's data and its rows in the selection space."""
    selection_space(cfg)  # a run that cannot choose k says why
    locals_, rows = [], []
    for pid in range(cfg.num_clients):
        local = own_file(cfg, pid) if owns_file(cfg) else local_partition(cfg, pid, cfg.num_clients)
        locals_.append(local)
        rows.append(selection_rows(cfg, local, pid))
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


def tune_command(run: ResolvedRun, *, overwrite: bool = False) -> str:
    """`fedapp tune`: the selection over the run's clients, its files in --out; returns what to print.
    An earlier tune.json / tune.png in --out is refused unless `overwrite`."""
    out_dir = Path(run.config.out_dir)
    earlier = [out_dir / name for name in (TUNE_JSON, TUNE_PNG) if (out_dir / name).exists()]
    if earlier and not overwrite:
        raise ConfigError(f"{out_dir} holds an earlier {earlier[0].name}: pass --overwrite or another --out")
    tuned = tune(run.config)
    write_selection(out_dir, tuned.to_json())
    cost = tuned.cost
    return (
        f"{format_table(tuned.to_json())}\n"
        f"cost: {cost['extra_rounds']} rounds, {cost['bytes_up'] / 1e6:.2f} MB up, "
        f"{cost['bytes_down'] / 1e6:.2f} MB down, {cost['seconds']:.1f} s\n"
        f"wrote {out_dir / TUNE_JSON} and {out_dir / TUNE_PNG}"
    )
