"""CCFC experiments: the MNIST tables (heterogeneity, ablations, lambda, disconnection), kNN and t-SNE."""
