"""Deployment helpers: a loopback deployment (`run_local`) and its TLS certificates and keys (`secure`)."""
