"""Write deploy/compose/.env from .env.example with fresh secrets: a Fernet key, a Redis password
and one NATS password per user of deploy/nats/. Refuses to overwrite an existing .env.

    python scripts/compose_env.py [--force]
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
from pathlib import Path

from cryptography.fernet import Fernet

COMPOSE = Path(__file__).resolve().parent.parent / "deploy" / "compose"
EMPTY = re.compile(r"^(TOOLBUS_[A-Z0-9_]+)=$")


def fresh(name: str) -> str:
    if name == "TOOLBUS_SECRET_KEY":
        return Fernet.generate_key().decode()
    # nats-server reads its passwords as configuration values: a letter then hex stays a string.
    return "p" + secrets.token_hex(24)


def render(example: str) -> str:
    """The example with every empty `NAME=` line (the secrets) given a fresh value."""
    lines = []
    for line in example.splitlines():
        match = EMPTY.match(line)
        lines.append(f"{match[1]}={fresh(match[1])}" if match else line)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--force", action="store_true", help="overwrite an existing .env")
    args = parser.parse_args(argv)
    target = COMPOSE / ".env"
    if target.exists() and not args.force:
        print(f"{target} exists; keeping it (--force writes new secrets)", file=sys.stderr)
        return 1
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(render((COMPOSE / ".env.example").read_text()))
    print(f"wrote {target} (mode 600) with fresh secrets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
