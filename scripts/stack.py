"""`make up` / `make down` / `make logs` / `make status`: the stack of `toolbus_devstack.stack`, with
its state in this checkout's `.stack/` (`TOOLBUS_STACK_DIR` moves it) and the secured
configuration (`TOOLBUS_SECURE=1`) from its `deploy/nats/`. `toolbus up` is the same."""

from __future__ import annotations

import sys
from pathlib import Path

from toolbus_devstack.stack import main

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    sys.exit(main(default_dir=ROOT / ".stack", checkout=ROOT))
