"""Stand-ins for Flower's client side when a strategy is tested with hand-built replies."""

from __future__ import annotations

from unittest.mock import MagicMock

from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy


def mock_proxy(cid: str) -> ClientProxy:
    """A ClientProxy that only has an id (the strategy never calls it: replies are built by the test)."""
    proxy = MagicMock(spec=ClientProxy)
    proxy.cid = cid
    return proxy


def mock_manager(cids: list[str]) -> SimpleClientManager:
    """A client manager with one mock proxy per id, all connected."""
    manager = SimpleClientManager()
    for cid in cids:
        manager.register(mock_proxy(cid))
    return manager
