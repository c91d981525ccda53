"""The app's runtime: the one ServerApp and ClientApp, the server loop, the in-process engine, checkpoints
and the checks before a run."""
