"""What a run leaves behind: the final report's protocol, per-node assignments, the saved model and the
run records."""
