"""The image's health check: the role's HTTP API answers GET /health on this host (the SuperLink over TLS
when it was given a certificate, so both schemes are tried; a loopback probe needs no verification).

FEDAPP_HEALTH_PORT names the port (compose.yaml sets it); else Flower's default of the role."""

import os
import ssl
import sys
import urllib.request

DEFAULT_PORTS = {"superlink": "9092", "supernode": "9094"}

port = os.environ.get("FEDAPP_HEALTH_PORT") or DEFAULT_PORTS.get(os.environ.get("FEDAPP_ROLE", ""), "9094")
unverified = ssl._create_unverified_context()  # noqa: S323 (loopback probe of this container's own port)
for scheme in ("https", "http"):
    try:
        url = f"{scheme}://127.0.0.1:{port}/health"
        with urllib.request.urlopen(url, timeout=4, context=unverified) as response:
            sys.exit(0 if response.status == 200 else 1)
    except Exception:  # noqa: BLE001 (not this scheme, or not up: try the next)
        continue
sys.exit(1)
