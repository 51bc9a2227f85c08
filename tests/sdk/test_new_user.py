"""What a new user met on a fresh clone: an input over NATS' max_payload is a one-line
`invalidRequest` naming the size and the limit (the SDK raised nats' MaxPayloadError, the CLI
printed a traceback), a bad YAML file is named with its line and column, tables end a cut
description with an ellipsis, and the example toolset file is a valid spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from toolbus import InvalidRequest, Toolbus
from toolbus.cli._app import _spec_kwargs, shorten
from toolbus_contracts.registry import ToolsetCreateRequest

from tests.sdk.test_cli import cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "toolset.yaml"
RUN_ID = "run_" + "0" * 32


async def test_an_input_over_max_payload_is_invalid_request_naming_size_and_limit(tb: Toolbus) -> None:
    limit = tb.nc.max_payload
    with pytest.raises(InvalidRequest) as caught:
        await tb.runs.attach(RUN_ID).invoke("everything.echo", {"message": "x" * (2 * 1024 * 1024)})
    details = caught.value.details
    assert details["field"] == "body"
    assert details["maxPayload"] == limit
    assert details["size"] > 2 * 1024 * 1024
    assert f"is {details['size']:,} bytes, over the {limit:,} bytes" in caught.value.message


@pytest.mark.e2e
async def test_the_cli_refuses_a_huge_input_in_one_line(stack: dict[str, str], tmp_path: Path) -> None:
    env = {k: stack[k] for k in ("TOOLBUS_NATS_URL", "TOOLBUS_SUBJECT_PREFIX")}
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"message": "x" * (2 * 1024 * 1024)}))
    done = await cli(env, "calls", "invoke", "everything.echo", "--run", RUN_ID, "-i", f"@{huge}")
    assert done.returncode == 5, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: invalidRequest: The request on ")
    assert "bytes a NATS message may carry on this server (max_payload)" in lines[0]
    assert "Traceback" not in done.stderr


async def test_a_bad_yaml_file_is_named_with_its_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "toolset.yaml"
    bad.write_text("mcp:\n  - name: everything\n    url: [unclosed\n")
    done = await cli({}, "toolsets", "create", "-f", str(bad))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {bad}:4:1: not valid YAML: "), done.stderr
    bad_json = tmp_path / "toolset.json"
    bad_json.write_text('{"mcp": [\n  {"name": "x",}\n]}')
    done = await cli({}, "toolsets", "create", "-f", str(bad_json))
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {bad_json}:2:16: not valid JSON: "), done.stderr


def test_a_cut_description_ends_at_a_word_with_an_ellipsis() -> None:
    text = "Search the issues of a repository by label, state and assignee, newest first, paged"
    short = shorten(text, 40)
    assert short == "Search the issues of a repository by…"
    assert len(short) <= 40
    assert shorten("short enough", 40) == "short enough"
    assert shorten("x" * 50, 10) == "x" * 9 + "…"


def test_the_example_toolset_file_is_a_valid_spec() -> None:
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    request = ToolsetCreateRequest.model_validate(_spec_kwargs(spec))
    assert [s.name for s in request.mcp] == ["everything"]
    assert request.mcp[0].policies["echo"].on_interruption == "retry"
    assert [h.name for h in request.host] == ["support.ask_user"]
    assert request.http is not None and request.http.allow == ["api.github.com"]
