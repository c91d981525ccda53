"""Privacy around every method: the privacy floor, differential privacy, SecAgg+ encoding and vertical id
alignment."""
