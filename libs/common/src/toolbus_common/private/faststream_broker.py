"""FastStream's broker forgets a connection toolbus already closed (faststream 0.7.8).

`NatsBroker.stop()` drains its connection again, which waits up to 30 s on pull consumers'
fetches; the bus has flushed and closed it, so it clears `broker._connection` first."""

from __future__ import annotations

from faststream.nats import NatsBroker


def forget_connection(broker: NatsBroker) -> None:
    """Make `broker.stop()` leave its (already closed) connection alone."""
    broker._connection = None
