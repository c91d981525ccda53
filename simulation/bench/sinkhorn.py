"""Measure FSTC's Sinkhorn (`fedapp.maths.fstc.sinkhorn_log_plan`) against the plain log-domain iteration
it replaced (two N x K logsumexps per iteration): seconds and the largest difference of the log plans.

    python -m simulation.bench.sinkhorn [--rows 4500] [--clusters 150] [--scales 1 5 20 60 200]

The scores are those of a head on clustered data: `scale` x cosine similarity of N noisy points to K
random centres (a larger scale: more confident predictions; 200 pushes the potentials beyond float64's
range, where the fast path gives way to the exact logsumexp). One thread, seeded; prints one JSON line
per scale.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from fedapp.maths.fstc import sinkhorn_log_plan


def reference_log_plan(
    log_probs: torch.Tensor, epsilon: float, max_iters: int = 1000, tol: float = 1e-6
) -> tuple[torch.Tensor, int]:
    """Eq. 2's plan by the plain log-domain Sinkhorn (the former code): (log plan, iterations)."""
    log_kernel = log_probs.double() / epsilon
    n, k = log_kernel.shape
    log_b = torch.full((k,), math.log(n / k), dtype=torch.float64)
    log_u = torch.zeros(n, dtype=torch.float64)
    log_v = torch.zeros(k, dtype=torch.float64)
    iterations = 0
    while iterations < max_iters:
        row_terms = torch.logsumexp(log_kernel + log_v[None, :], dim=1)
        if iterations > 0 and float(((log_u + row_terms).exp() - 1.0).abs().max()) <= tol:
            break
        iterations += 1
        log_u = -row_terms
        log_v = log_b - torch.logsumexp(log_kernel + log_u[:, None], dim=0)
    return log_u[:, None] + log_kernel + log_v[None, :], iterations


def head_scores(rows: int, clusters: int, scale: float, seed: int = 0) -> torch.Tensor:
    """log softmax of `scale` x cosine similarity of noisy points to random centres (float64)."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(clusters, 64, generator=generator)
    owner = torch.randint(0, clusters, (rows,), generator=generator)
    points = centres[owner] + 0.8 * torch.randn(rows, 64, generator=generator)
    cosine = torch.nn.functional.normalize(points, dim=1) @ torch.nn.functional.normalize(centres, dim=1).T
    return torch.log_softmax(scale * cosine.double(), dim=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simulation.bench.sinkhorn")
    parser.add_argument("--rows", type=int, default=4500)
    parser.add_argument("--clusters", type=int, default=150)
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 5.0, 20.0, 60.0, 200.0])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for scale in args.scales:
        log_probs = head_scores(args.rows, args.clusters, scale)
        started = time.perf_counter()
        reference, iterations = reference_log_plan(log_probs, 0.1)
        before = time.perf_counter() - started
        started = time.perf_counter()
        result = sinkhorn_log_plan(log_probs, 0.1)
        after = time.perf_counter() - started
        print(
            json.dumps(
                {
                    "scale": scale,
                    "iterations": [iterations, result.iterations],
                    "seconds_before": round(before, 3),
                    "seconds_after": round(after, 3),
                    "max_log_plan_difference": float((reference - result.log_plan).abs().max()),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
