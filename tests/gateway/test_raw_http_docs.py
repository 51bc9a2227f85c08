"""The raw-HTTP examples of docs/gateway.md (curl, both protocol revisions) run as written against
a gateway and give the answers they show."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.gateway.conftest import Deployment
from tests.support.gates import missing

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

GATEWAY_DOCS = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"


def _raw_http_script(docs: str) -> str:
    """The two `sh` blocks after **Raw HTTP.**, without the line that sets URL and TOKEN."""
    section = docs[docs.index("**Raw HTTP.**") : docs.index("## tools/list")]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2, blocks
    lines = [line for line in "".join(blocks).splitlines() if not line.startswith("URL=")]
    return "set -e\n" + "\n".join(lines) + "\n"


def _run(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


async def test_the_curl_examples_run_as_written(deployment: Deployment, toolset: str, tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        missing("curl is not installed: the raw-HTTP examples of docs/gateway.md use it")
    script = _raw_http_script(await asyncio.to_thread(GATEWAY_DOCS.read_text))
    token = await deployment.token([toolset])
    env = dict(os.environ, URL=deployment.url(toolset), TOKEN=token)
    done = await asyncio.to_thread(_run, script, tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.count('"isError":false') == 2, out
    assert out.count('"structuredContent":{"text":"hi"}') == 2, out
    assert '"protocolVersion":"2025-11-25"' in out  # the initialize answer
    assert "event: message" in out
    assert token not in out + done.stderr
