"""CeFMC paper Fig. 3 layout: objective (Eq. 19/35) and consensus ACC / purity per round, one dataset.

    python -m simulation.papers.cefmc.plot_objective --dataset hw --rounds 30 \
        --out docs/cefmc-objective-hw.png

Runs the Flower app (in-process engine: the same strategy and clients) with delta = 0 so that every
round runs, then plots `summary.json`'s objective_per_round and `rounds.json`'s metrics.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from fedapp.launch.resolve import build_overrides
from fedapp.report.records import save_figure
from simulation.runner import execute


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="hw")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lam", type=float, default=1.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        overrides = build_overrides(
            {
                "method": "cefmc",
                "dataset": args.dataset,
                "num-rounds": args.rounds,
                "cefmc.delta": 0.0,
                "eval-every": 1,  # ACC and purity after every round
                "seed": args.seed,
                "cefmc.lambda": args.lam,
            },
            Path(tmp),
        )
        summary = execute(overrides, "inprocess", quiet=True)
        history = json.loads((Path(tmp) / "rounds.json").read_text())
    objectives = summary["objective_per_round"]  # one per update round (rounds 2, 3, ...)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, left = plt.subplots(figsize=(6.5, 4))
    left.plot(
        range(2, 2 + len(objectives)),
        [value - objectives[0] for value in objectives],
        color="tab:blue",
        marker=".",
        label="objective (Eq. 35)",
    )
    left.set_xlabel("round (1 = initialisation)")
    left.set_ylabel(f"objective - {objectives[0]:.6g}", color="tab:blue")
    right = left.twinx()
    rounds = [h["round"] for h in history]
    for key, colour in (("acc", "tab:red"), ("purity", "tab:green")):
        right.plot(
            rounds, [100 * h["metrics"][key] for h in history], color=colour, marker=".", label=key.upper()
        )
    right.set_ylabel("ACC / purity (%)")
    fig.legend(loc="center right", bbox_to_anchor=(0.88, 0.45))
    left.set_title(f"CeFMC on {args.dataset}: lambda = beta = {args.lam:g}, seed {args.seed}")
    save_figure(fig, args.out, dpi=110)
    increases = sum(b >= a for a, b in zip(objectives, objectives[1:], strict=False))
    final_acc = 100 * summary["metrics"]["acc"]
    print(
        f"{len(objectives)} update rounds; objective non-decreasing in {increases}/{len(objectives) - 1} "
        f"steps; first {objectives[0]:.6g}, last {objectives[-1]:.6g}; final ACC {final_acc:.2f}"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
