"""What every entry point that starts Flower processes shares — the simulation CLI (`simulation/`) and the
loopback deployment (`deploy/`): command-line run options (`options`), the one resolved run
configuration and its checks (`resolve`), named presets (`presets`), starting and stopping Flower's
processes (`processes`) and the guard that stops them if the entry point is killed (`watchdog`)."""
