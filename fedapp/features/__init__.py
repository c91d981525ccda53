"""Features computed on a client from its texts: sentence embeddings (cached) and the federated bag of
words."""
