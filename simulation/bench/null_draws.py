"""Would several null draws tell a structureless box from real clusters? (docs/model-selection.md, "Known
misses outside the table").

A run draws each null shape once (`KSearch.plan`), and a box's stability moves by up to 0.34 from one
draw to the next at small k (`simulation.bench.null_noise`). This measures what a run could do instead:
draw each shape `--draws` times (seeds apart), take per k the more stable shape's mean m0 and the spread
sd0 of its draws, and score the data's stability s against them: the excess (s - m0) / (1 - m0) and the
z-score (s - m0) / sd0. For each set and seed it prints the k with the best excess (k = 2..30, a run's
first pass) and, at that k, s, m0, sd0, z, against the run's own one-draw excess; and a Monte Carlo
reference for the best excess: each draw of the more stable shape taken as the data, scored against the
mean of the other draws, its best excess over k (the largest and the mean of those). Nothing here
changes a run: the question is whether any of these separates the boxes (which should be weak) from
data with clusters (which should be strong).

    python -m simulation.bench.null_draws [--seeds 3] [--draws 6] [SET ...]

Sets: the two 2,000-row boxes of `null_noise` on 4 clients; the selection benchmark's 4,000-row synthetic
sets (`none-*`, `mix-k*-d*`) and its feature sets (`digits`, `hw`, `hw-zscore`, `bdgp`, ...) on 10 IID
clients, as `simulation.bench.selection` splits them.
"""

from __future__ import annotations

import argparse

import numpy as np

from fedapp.maths import selection as sel
from simulation.bench.null_noise import FLOOR, boxes, data_side
from simulation.bench.selection import SYNTHETIC, _rows, _split

KS = tuple(range(2, 31))
DEFAULT_SETS = (
    "box A",
    "box B",
    "none-uniform-d8",
    "none-gauss-aniso-d8",
    "mix-k2-d10",
    "mix-k3-d10",
    "mix-k5-d10",
    "mix-k8-d10",
    "mix-k2-d50",
    "mix-k3-d50",
    "digits",
    "hw",
    "hw-zscore",
    "bdgp",
    "bdgp-zscore",
)


def parts_of(name: str) -> list[np.ndarray]:
    """The clients' rows of one set."""
    if name.startswith("box"):
        return np.array_split(boxes()[name], 4)
    if name in SYNTHETIC:
        X, y = SYNTHETIC[name]()
        owner = _split(len(y), 10, "iid")
    else:
        X, owner, _ = _rows(name, "iid")
    return [np.asarray(X[owner == c], dtype=np.float64) for c in range(10)]


def measure(parts: list[np.ndarray], seed: int, draws: int) -> dict[str, dict[int, float | None]]:
    """The data's stability at KS and each null shape's per-draw stability (draw 0 is the run's)."""
    k_local, (centres, sizes, squares), data = data_side(parts, KS, seed)
    out: dict[str, dict[int, float | None]] = {"data": data}
    for shape in sel.NULL_SHAPES:
        for draw in range(draws):
            s = seed + 1000 * draw
            rows = sel.null_rows(centres, sizes, squares, s, shape=shape)
            null = sel.null_statistics(rows, KS, k_local, FLOOR, s)
            out[f"{shape} {draw}"] = {k: v["stability"] for k, v in null.items()}
    return out


def score(table: dict[str, dict[int, float]], draws: int) -> dict[str, float]:
    """The k with the best excess against the draws' mean, its z, and the run's one-draw excess there."""
    data = table["data"]
    best: dict[str, float] | None = None
    for k in KS:
        per_shape = [np.array([table[f"{shape} {d}"][k] for d in range(draws)]) for shape in sel.NULL_SHAPES]
        shape = int(np.argmax([v.mean() for v in per_shape]))
        m0, sd0 = float(per_shape[shape].mean()), float(per_shape[shape].std(ddof=1))
        one = max(table[f"{s} 0"][k] for s in sel.NULL_SHAPES)
        row = {
            "k": k,
            "s": data[k],
            "m0": m0,
            "sd0": sd0,
            "excess": (data[k] - m0) / max(1 - m0, sel.NULL_FLOOR),
            "z": (data[k] - m0) / max(sd0, 1e-3),
            "run excess": (data[k] - one) / max(1 - one, sel.NULL_FLOOR),
        }
        if best is None or row["excess"] > best["excess"]:
            best = row
    assert best is not None
    return {**best, **reference(table, draws)}


def reference(table: dict[str, dict[int, float]], draws: int) -> dict[str, float]:
    """Each draw of the more stable shape as the data against the mean of the shapes' other draws: the
    largest and the mean of their best excess over KS (what a structureless cloud of this shape scores)."""
    bests = []
    for held in range(draws):
        others = [d for d in range(draws) if d != held]
        scores = []
        for k in KS:
            means = [np.mean([table[f"{shape} {d}"][k] for d in others]) for shape in sel.NULL_SHAPES]
            shape = sel.NULL_SHAPES[int(np.argmax(means))]
            m0, s = float(max(means)), table[f"{shape} {held}"][k]
            scores.append((s - m0) / max(1 - m0, sel.NULL_FLOOR))
        bests.append(max(scores))
    return {"reference max": float(np.max(bests)), "reference mean": float(np.mean(bests))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simulation.bench.null_draws")
    parser.add_argument("sets", nargs="*", default=list(DEFAULT_SETS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--draws", type=int, default=6, help="draws of each null shape")
    args = parser.parse_args(argv)
    print(
        "| set | seed | best k | s | m0 | sd0 | excess | z | the run's excess (one draw) "
        "| a null draw's best excess: mean, largest |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.sets:
        parts = parts_of(name)
        for seed in range(args.seeds):
            b = score(measure(parts, seed, args.draws), args.draws)
            print(
                f"| {name} | {seed} | {b['k']} | {b['s']:.2f} | {b['m0']:.2f} | {b['sd0']:.3f} "
                f"| {b['excess']:.2f} | {b['z']:.1f} | {b['run excess']:.2f} "
                f"| {b['reference mean']:.2f}, {b['reference max']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
