"""How every toolbus client connects to NATS: credentials and TLS from `TOOLBUS_NATS_*` settings
(`NatsAuth`) and a flush that covers nats-py's pending buffer (`flush`).

One small package with nats-py as its only dependency, so the SDK and the CLI share it with the
services without importing the services' runtime (`toolbus_common` brings Redis, FastStream and
Starlette: about 1 s of import time for every CLI command, see docs/design.md)."""

from toolbus_nats_connect.auth import DEFAULT_NATS_URL, ENV_PREFIX, NatsAuth
from toolbus_nats_connect.flush import flush

__all__ = ["DEFAULT_NATS_URL", "ENV_PREFIX", "NatsAuth", "flush"]
