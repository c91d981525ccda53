"""Benchmarks of the product rather than of a paper: round cost (docs/round-cost.md), reliability under
faults, embedding throughput (docs/data.md) and the privacy-utility sweep (docs/privacy.md)."""
