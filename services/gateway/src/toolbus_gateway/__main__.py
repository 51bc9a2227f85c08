"""`python -m toolbus_gateway`: serve toolsets as MCP servers until SIGTERM."""

import sys

from toolbus_common.runtime import run_service

from toolbus_gateway.app import PortTaken, build

if __name__ == "__main__":
    try:
        run_service(build)
    except PortTaken as exc:
        sys.exit(f"error: {exc}")
