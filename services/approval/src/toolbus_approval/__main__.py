"""`python -m toolbus_approval`: serve approvals until SIGTERM."""

from toolbus_common.runtime import run_service

from toolbus_approval.app import build

if __name__ == "__main__":
    run_service(build)
