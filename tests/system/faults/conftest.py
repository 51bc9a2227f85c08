"""The fault suite's long form (`-m faults_long`) is left out of a plain run (`make test`), which
runs the short form: the long one is deselected unless the marker expression names it.

At the end of a session that ran scenarios, their table is printed in the terminal summary (no
`-s` needed) and written to `$TOOLBUS_FAULTS_TABLE` (default `.cache/faults-table.md`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.system.faults.stack import TABLE_HEADER, TABLE_ROWS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "faults_long" in (config.option.markexpr or ""):
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        (drop if item.get_closest_marker("faults_long") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if not TABLE_ROWS:
        return
    table = TABLE_HEADER + "\n" + "\n".join(TABLE_ROWS) + "\n"
    path = Path(os.environ.get("TOOLBUS_FAULTS_TABLE") or config.rootpath / ".cache" / "faults-table.md")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(table)
    terminalreporter.section("fault suite")
    terminalreporter.write(table)
    terminalreporter.write_line(f"(written to {path})")
