"""`python -m toolbus_gateway`: serve toolsets as MCP servers until SIGTERM."""

from toolbus_common.runtime import run_service

from toolbus_gateway.app import build

if __name__ == "__main__":
    run_service(build)
