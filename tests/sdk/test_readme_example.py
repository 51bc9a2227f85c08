"""The README's example and docs/sdk.md's raw-NATS one run as written against the npm reference
MCP server: only its URL (port 3001 in the docs) and the deployment's settings differ."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.everything_server import everything_server

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOC_URL = "http://127.0.0.1:3001/mcp"


def python_blocks(doc: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(encoding="utf-8"), flags=re.S)


@pytest.fixture(scope="module")
async def everything_url() -> AsyncIterator[str]:
    async with everything_server() as url:
        yield url


async def run_example(code: str, url: str, stack: dict[str, str], tmp_path: Path) -> str:
    assert DOC_URL in code
    script = tmp_path / "example.py"
    script.write_text(code.replace(DOC_URL, url))
    env = {**os.environ, **{k: stack[k] for k in ("TOOLBUS_NATS_URL", "TOOLBUS_SUBJECT_PREFIX")}}
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def test_the_readme_example_runs_as_written(
    stack: dict[str, str], everything_url: str, tmp_path: Path
) -> None:
    [example] = [b for b in python_blocks("README.md") if "Toolbus.connect" in b]
    out = await run_example(example, everything_url, stack, tmp_path)
    toolset_id, output = out.strip().splitlines()
    assert re.fullmatch(r"ts_[0-9a-f]{64}", toolset_id)
    assert "Echo: hi" in output


async def test_the_raw_nats_example_runs_as_written(
    stack: dict[str, str], everything_url: str, tmp_path: Path
) -> None:
    [example] = [b for b in python_blocks("docs/sdk.md") if "import nats" in b]
    out = await run_example(example, everything_url, stack, tmp_path)
    assert "'ok': True" in out and "Echo: hi" in out
