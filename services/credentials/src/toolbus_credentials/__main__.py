"""`python -m toolbus_credentials`: serve the credentials subjects until SIGTERM."""

from toolbus_common.runtime import run_service

from toolbus_credentials.app import build

if __name__ == "__main__":
    run_service(build)
