"""The fault suite's long form (`-m faults_long`) is left out of a plain run (`make test`), which
runs the short form: the long one is deselected unless the marker expression names it."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "faults_long" in (config.option.markexpr or ""):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("faults_long") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
