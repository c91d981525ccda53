"""CeFMC experiments: the paper's tables, the lambda grid, objective plots, timing and scaling benchmarks."""
