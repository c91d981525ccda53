"""How much the stability of a structureless box moves from one seed to the next, against its nulls
(docs/model-selection.md, "Known misses outside the table").

A uniform box without clusters (2,000 rows in 8 dimensions, sides 3 to 0.3, 4 clients) should get a weak
verdict from `k = 0`. For each seed this prints, at k = 2..6, the stability of the data (4 split pairs of
the union of local centres, as a run measures it) and of three nulls through the same pipeline: the
run's box and Gaussian (`null_rows`), a box whose within-centre spread is taken per dimension (d sums of
squares a client instead of one; not what a run does), and an exact box of the data's own per-axis
spread (what no run can know); then the run's own choice and verdict at that seed (`select_k`).

    python -m simulation.bench.null_noise [--seeds 4] [--splits 4]
    python -m simulation.bench.null_noise --choices [--seeds 4]

`--choices` prints only the run's choice on each structureless cloud of `tests/test_selection.py` (a round
and an elongated Gaussian, boxes A and B): k, verdict, excess and gap at k, and the first reason it is weak.

`--splits` sets the data's split pairs (a run uses `SPLITS` = 4; each pair adds a k x k table per
candidate to round B); the nulls keep 4.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from fedapp.maths import selection as sel

KS = (2, 3, 4, 5, 6)
CLIENTS, FLOOR = 4, 5


def boxes() -> dict[str, np.ndarray]:
    """The box `tests/test_selection.py` once used (the third draw of seed 3) and the next one."""
    rng = np.random.default_rng(3)
    scales = np.geomspace(3, 0.3, 8)
    rng.normal(size=(2000, 8))
    first = rng.uniform(size=(2000, 8)) * scales
    rng.normal(size=(2000, 8))
    return {"box A": first, "box B": rng.uniform(size=(2000, 8)) * scales}


def per_dimension_box(
    centres: Sequence[np.ndarray], sizes: Sequence[np.ndarray], squares: np.ndarray, seed: int
) -> list[np.ndarray]:
    """The run's box null (`null_rows`, shape `box`) with the spread around the centres per dimension:
    `squares` (d,) the federation's sum of x_j^2 for each dimension j."""
    union = np.concatenate(centres)
    weights = np.concatenate(sizes).astype(np.float64)
    n = weights.sum()
    mean, singular, axes = sel.principal_axes(union, weights)
    spread = np.sqrt(np.maximum(squares - weights @ union**2, 0.0) / n)
    rng = np.random.default_rng([seed, 0x0B, 1])
    root3 = np.sqrt(3.0)
    return [
        mean
        + (rng.uniform(-root3, root3, (int(s.sum()), len(singular))) * singular) @ axes
        + spread * rng.uniform(-root3, root3, (int(s.sum()), mean.shape[0]))
        for s in sizes
    ]


def data_side(
    parts: Sequence[np.ndarray], ks: Sequence[int], seed: int, splits: int = sel.SPLITS
) -> tuple[int, tuple[list[np.ndarray], list[np.ndarray], list[float]], dict[int, float | None]]:
    """What a run measures on the clients' rows: the local k', round A's summaries (local centres, their
    sizes, each client's sum of squared norms) and the data's stability at `ks` from `splits` pairs."""
    k_local = sel.local_k(sel.DEFAULT_K_MAX, len(parts))
    summaries = [sel.local_summary(P, k_local, seed + i, FLOOR) for i, P in enumerate(parts)]
    centres, sizes, squares = ([s[i] for s in summaries] for i in range(3))
    pairs = sel.split_centres(centres, sizes, ks, seed, splits=splits)
    data = {k: sel.stability(sum(sel._agreement(P, pairs[k]) for P in parts))[0] for k in ks}
    return k_local, (centres, sizes, squares), data


def measure(X: np.ndarray, seed: int, splits: int = sel.SPLITS) -> dict[str, dict[int, float | None]]:
    parts = np.array_split(X, CLIENTS)
    k_local, (centres, sizes, squares), data = data_side(parts, KS, seed, splits)

    def null(rows: list[np.ndarray]) -> dict[int, float | None]:
        return {k: v["stability"] for k, v in sel.null_statistics(rows, KS, k_local, FLOOR, seed).items()}

    exact = np.random.default_rng(seed)
    half_sides = X.std(0) * np.sqrt(3.0)
    return {
        "data": data,
        "box": null(sel.null_rows(centres, sizes, squares, seed, shape="box")),
        "gauss": null(sel.null_rows(centres, sizes, squares, seed, shape="gauss")),
        "box, per dimension": null(per_dimension_box(centres, sizes, np.einsum("ij,ij->j", X, X), seed)),
        "exact box": null([X.mean(0) + exact.uniform(-1, 1, P.shape) * half_sides for P in parts]),
    }


def clouds() -> dict[str, np.ndarray]:
    """The structureless clouds `tests/test_selection.py` asks a weak verdict of: a round and an elongated
    Gaussian (its draws) and the two boxes."""
    rng = np.random.default_rng(3)
    gaussians = {
        "round Gaussian": rng.normal(size=(2000, 8)),
        "elongated Gaussian": rng.normal(size=(2000, 8)) * np.geomspace(3, 0.3, 8),
    }
    return {**gaussians, **boxes()}


def choices(seeds: int) -> None:
    """The run's choice on each cloud at each seed (`--choices`)."""
    print("| set | seed | k | verdict | excess at k | gap at k | why weak |")
    print("|---|---|---|---|---|---|---|")
    for name, X in clouds().items():
        for seed in range(seeds):
            chosen, _ = sel.select_k(np.array_split(X, CLIENTS), 2, 30, seed=seed, floor=FLOOR)
            sure = chosen.confidence
            why = str(sure["why"]).split(":")[0] if sure["verdict"] == "weak" else ""
            cells = [
                f"{v:.2f}" if isinstance(v, float) else "-" for v in (sure.get("excess"), sure.get("gap"))
            ]
            print(
                f"| {name} | {seed} | {chosen.k} | {sure['verdict']} | {cells[0]} | {cells[1]} | {why} |",
                flush=True,
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simulation.bench.null_noise")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--splits", type=int, default=sel.SPLITS, help="the data's split pairs")
    parser.add_argument("--choices", action="store_true", help="only the run's choice on each cloud")
    args = parser.parse_args(argv)
    if args.choices:
        choices(args.seeds)
        return
    print("| set | seed | stability at k = " + ", ".join(map(str, KS)) + " | run's choice |")
    print("|---|---|---|---|")
    for name, X in boxes().items():
        for seed in range(args.seeds):
            rows = measure(X, seed, args.splits)
            cells = "<br>".join(
                f"{what}: " + " ".join(f"{v:.2f}" if v is not None else "-" for v in row.values())
                for what, row in rows.items()
            )
            chosen, _ = sel.select_k(np.array_split(X, CLIENTS), 2, 30, seed=seed, floor=FLOOR)
            sure = chosen.confidence
            print(f"| {name} | {seed} | {cells} | k = {chosen.k}, {sure['verdict']} |", flush=True)


if __name__ == "__main__":
    main()
