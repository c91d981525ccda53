"""Torch plumbing of the neural methods: weights <-> arrays, device, seeding, client state, the training
loop."""
