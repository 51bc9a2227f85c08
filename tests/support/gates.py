"""Quality gates that need something fetched (npm catalogues, a TypeScript compiler) skip on a
developer's machine without it, and fail in CI (`CI` set to anything but empty, 0, false or no):
a CI run without them would pass without checking anything."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """True when the `CI` environment variable says this run is CI (GitHub and GitLab set `true`)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str) -> NoReturn:
    """What a gate does when what it checks is missing: fail in CI, else skip with `reason`."""
    if in_ci():
        pytest.fail(f"quality gate cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason)
