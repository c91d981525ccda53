"""`fedapp tune`: choose k without labels (`fedapp.maths.selection`) over a simulation's clients, and print
the table.

The selection's rounds run here, in the CLI's process, over each client's own rows exactly as its client
computes them (`fedapp.app.k_selection.selection_rows`): round A's local centres and sizes, round B's
per-candidate sums and split-pair tables, again while the range is extended (`KSearch`); a vertical
method's parties each choose on their own view and the run takes the rounded mean, as a run does. Only
those arrays enter the server's side; their bytes are counted as they would cross the wire. A run
(`fedapp run`, `fedapp deploy`) with k = 0 on unlabelled files runs the same rounds as Flower messages
before its first round (`strategies.k_choice`).

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
from fedapp.app.k_selection import selection_rows, selection_space, views_outcome
from fedapp.config.run import RunConfig
from fedapp.datasets.local import LocalData, local_partition, local_view, own_file, owns_file
from fedapp.launch.outputs import check_selection_outputs
from fedapp.launch.resolve import ResolvedRun
from fedapp.maths.selection import KSearch, candidate_statistics, local_summary, merge_statistics, select_k
from fedapp.methods import method_spec
from fedapp.report.selection_files import TUNE_JSON, TUNE_PNG, format_table, write_selection

BYTES = 8  # float64 / int64 on the wire


def client_rows(cfg: RunConfig) -> tuple[list[LocalData], list[np.ndarray]]:
    """Every simulated client's data (a vertical party: its own view) and its rows in the selection space."""
    selection_space(cfg)  # a run that cannot choose k says why
    vertical = method_spec(cfg.method).vertical
    locals_, rows = [], []
    for pid in range(cfg.num_clients):
        if owns_file(cfg):
            local = own_file(cfg, pid)
        elif vertical:
            local = local_view(cfg, pid, cfg.num_clients)
        else:
            local = local_partition(cfg, pid, cfg.num_clients)
        locals_.append(local)
        rows.append(selection_rows(cfg, local, pid))
    return locals_, rows


@dataclass(frozen=True)
class Tuned:
    """A selection (`Selection.to_json()`, or a vertical run's `views_outcome`), every candidate's centres
    (horizontal only) and its cost: the extra rounds, bytes each way and seconds it took."""

    outcome: dict[str, Any]
    candidates: dict[int, np.ndarray]
    cost: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {**self.outcome, "cost": self.cost}


def tune(cfg: RunConfig, rows: list[np.ndarray] | None = None) -> Tuned:
    """Run the selection's rounds over the run's clients (`rows`: their vectors, if already computed):
    rounds A and B, again while the range is extended, or a vertical run's one round."""
    selection_space(cfg)  # a run that cannot choose k says why
    started = time.perf_counter()
    rows = rows if rows is not None else client_rows(cfg)[1]
    floor = run_floor(cfg)
    if method_spec(cfg.method).vertical:  # each party on its own view, as `KChoice._take_views`
        views = {
            str(pid): select_k([X], cfg.k_min, cfg.k_max, cfg.seed, floor, cfg.k_rule, extend=cfg.k_extend)[
                0
            ].to_json()
            for pid, X in enumerate(rows)
        }
        cost = {"extra_rounds": 1, "seconds": round(time.perf_counter() - started, 2)}
        return Tuned(views_outcome(views, cfg.k_rule), {}, cost)
    search = KSearch(cfg.k_min, cfg.k_max, cfg.k_rule, floor=floor, extend=cfg.k_extend)
    up = down = 0
    dims = rows[0].shape[1]
    while True:
        k_local = search.local_k(len(rows))
        summaries = [local_summary(X, k_local, cfg.seed + pid, floor) for pid, X in enumerate(rows)]
        up += BYTES * sum(len(c) * (dims + 1) + 1 for c, _, _ in summaries)
        centres, sizes, squares = ([part[i] for part in summaries] for i in range(3))
        candidates, pairs = search.plan(centres, sizes, cfg.seed, squares)
        if not candidates:
            break
        merged = merge_statistics([candidate_statistics(X, candidates, floor, pairs) for X in rows])
        centres = sum(len(c) for c in candidates.values())
        splits = len(next(iter(pairs.values()), []))
        tables = sum(splits * k * k for k in candidates)
        down += len(rows) * (BYTES * centres * dims + 4 * 2 * splits * centres * dims)  # pairs in float32
        up += BYTES * len(rows) * (centres * (dims + 3) + 2 * len(candidates) + tables)
        if not search.take(merged, candidates):
            break
    selection = search.selection()
    cost = {
        "extra_rounds": 2 * search.passes,
        "bytes_up": float(up),
        "bytes_down": float(down),
        "seconds": round(time.perf_counter() - started, 2),
    }
    return Tuned(selection.to_json(), search.candidates, cost)


def tune_command(run: ResolvedRun, *, overwrite: bool = False) -> str:
    """`fedapp tune`: the selection over the run's clients, its files in --out; returns what to print.
    An earlier tune.json / tune.png in --out is refused unless `overwrite`."""
    out_dir = Path(run.config.out_dir)
    check_selection_outputs(out_dir, overwrite=overwrite)  # before the work, as `fedapp run` does
    tuned = tune(run.config)
    write_selection(out_dir, tuned.to_json())
    cost = tuned.cost
    volume = (
        f"{cost['bytes_up'] / 1e6:.2f} MB up, {cost['bytes_down'] / 1e6:.2f} MB down, "
        if "bytes_up" in cost
        else ""
    )
    return (
        f"{format_table(tuned.to_json())}\n"
        f"cost: {cost['extra_rounds']} rounds, {volume}{cost['seconds']:.1f} s\n"
        f"wrote {out_dir / TUNE_JSON} and {out_dir / TUNE_PNG}"
    )
