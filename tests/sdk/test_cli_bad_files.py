"""The `toolbus` CLI, run as a user runs it, on files and inputs it cannot take: each is a one-line
usage error with exit code 2, before any connection (no traceback, no hang)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOLBUS = str(Path(sys.executable).with_name("toolbus"))
NOWHERE = {"TOOLBUS_NATS_URL": "nats://127.0.0.1:1"}  # never reached: the file is refused first


def run(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [TOOLBUS, "--timeout", "1", *args],
        env={"PATH": "/usr/bin:/bin", **NOWHERE},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def laughs() -> str:
    """The 'billion laughs' YAML: 10**9 strings from nine lines of aliases."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for before, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{before}'] * 10)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(120)
def test_unreadable_toolset_files_are_usage_errors(tmp_path: Path) -> None:
    binary = tmp_path / "bad.yaml"
    binary.write_bytes(b"\x00\xff\xfe")
    refused = run("toolsets", "create", "-f", str(binary))
    assert refused.returncode == 2, refused
    assert refused.stderr == f"error: {binary} is not UTF-8: byte 1 is 0xff\n"
    stdin = subprocess.run(  # stdin as bytes: the same error, named `-`
        [TOOLBUS, "--json", "toolsets", "create", "-f", "-"],
        env={"PATH": "/usr/bin:/bin", **NOWHERE},
        input=b"a: \xff\n",
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert stdin.returncode == 2 and json.loads(stdin.stdout)["error"] == {
        "code": "usage",
        "message": "- is not UTF-8: byte 3 is 0xff",
    }
    # Aliases: one that holds itself (was a RecursionError traceback), one exponential (hung).
    for name, text, where in (
        ("loop.yaml", "a: &a [*a]\n", "1:8"),
        ("laughs.yaml", laughs(), "2:8"),
        ("merge.yaml", "base: &b {x: 1}\nmcp:\n  <<: *b\n", "3:7"),
    ):
        path = tmp_path / name
        path.write_text(text)
        refused = run("toolsets", "create", "-f", str(path))
        assert refused.returncode == 2, refused
        assert (
            refused.stderr
            == f"error: {path}:{where}: YAML aliases (*{text.split('*')[1][0]}) are not supported: write the value out\n"
        )
    # Nesting too deep for Python's parsers, or deeper than toolbus carries.
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    deep_yaml = tmp_path / "deep.yaml"
    deep_yaml.write_text("a: " + "[" * 100_000 + "]" * 100_000)
    for path in (deep, deep_yaml):
        refused = run("toolsets", "create", "-f", str(path))
        assert refused.returncode == 2 and refused.stderr == f"error: {path} nests too deep to read\n", (
            refused
        )


@pytest.mark.timeout(120)
def test_inputs_nesting_too_deep_are_usage_errors(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for value, message in (
        (f"@{deep}", f"{deep} nests too deep to read"),
        ("[" * 50_000 + "]" * 50_000, "--input nests too deep to read"),  # fits one argument
        (
            '{"a": ' + "[" * 300 + "]" * 300 + "}",  # parses, but no JSON writer of toolbus's takes it
            "--input cannot be sent: Field 'a' nests deeper than 254 levels of objects and arrays.",
        ),
    ):
        refused = run("calls", "invoke", "e.echo", "--run", "r1", "--input", value)
        assert refused.returncode == 2 and refused.stderr == f"error: {message}\n", refused
