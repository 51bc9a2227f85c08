"""The four service charts: linted and rendered by Helm's own engine, every manifest valid for
Kubernetes, values checked against values.schema.json, and the defaults secure."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]  # ships no stubs or py.typed
import pytest
import yaml

from tests.deploy.conftest import HELM, Rendered, charts, full_values, merge
from tests.deploy.settings_catalogue import SERVICES, service_settings

EXPECTED_KINDS = sorted(
    ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service", "ServiceAccount"]
)
# The ways to authenticate that a chart passes as files or values (TOOLBUS_NATS_* of
# toolbus_common.Settings): names the templates write, checked against the settings below.
SECRET_VARIABLE_MARKERS = ("PASSWORD", "SECRET", "TOKEN", "KEY")


def values_of(chart: str) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((HELM / chart / "values.yaml").read_text())
    return values


def schema_of(chart: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((HELM / chart / "values.schema.json").read_text())
    return schema


def test_generated_chart_files_match_the_generator() -> None:
    assert charts.stale() == []


def test_every_service_has_a_chart_on_the_library() -> None:
    assert sorted(charts.SERVICES_BY_NAME) == sorted(SERVICES)
    for chart in SERVICES:
        loaded = helm_python.Chart.load(HELM / chart)
        assert loaded.name == chart
        assert [d["name"] for d in loaded.dependencies] == [charts.LIBRARY]
        assert [d["type"] for d in loaded.dependencies] == ["library"]


def _undocumented(values: dict[str, Any], params: set[str], path: str = "") -> list[str]:
    """Value paths with no `## @param` line: a documented key covers everything under it."""
    out = []
    for key, value in values.items():
        here = f"{path}{key}"
        if here in params:
            continue
        if isinstance(value, dict) and value:
            out += _undocumented(value, params, f"{here}.")
        else:
            out.append(here)
    return out


@pytest.mark.parametrize("chart", SERVICES)
def test_every_value_has_a_param_comment(chart: str) -> None:
    text = (HELM / chart / "values.yaml").read_text()
    params = set(re.findall(r"^\s*## @param (\S+) \S", text, flags=re.MULTILINE))
    assert _undocumented(values_of(chart), params) == []
    assert params <= _paths(values_of(chart)), "a @param names a value that does not exist"


def _paths(values: dict[str, Any], path: str = "") -> set[str]:
    out = set()
    for key, value in values.items():
        out.add(f"{path}{key}")
        if isinstance(value, dict):
            out |= _paths(value, f"{path}{key}.")
    return out


@pytest.mark.parametrize("chart", SERVICES)
def test_helm_lint_strict_finds_nothing(chart: str) -> None:
    report = helm_python.lint(HELM / chart, strict=True, kube_version=f"v{charts.KUBE_VERSION}.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    assert report["total_charts_linted"] == 1


@pytest.mark.parametrize("chart", SERVICES)
def test_default_render_is_the_six_resources_all_valid_kubernetes(
    chart: str, rendered: dict[str, Rendered]
) -> None:
    docs = rendered[chart].docs
    assert rendered[chart].kinds() == EXPECTED_KINDS
    for doc in docs:
        kubernetes_validate.validate(doc, charts.KUBE_VERSION, strict=True)
        assert doc["metadata"]["name"] == f"toolbus-{chart}"
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "toolbus"


@pytest.mark.parametrize("chart", SERVICES)
def test_render_with_every_option_is_valid_kubernetes(chart: str, rendered_full: dict[str, Rendered]) -> None:
    full = rendered_full[chart]
    # Autoscaling off: no HPA, and the Deployment carries the replica count itself.
    assert "HorizontalPodAutoscaler" not in full.kinds()
    assert full.one("Deployment")["spec"]["replicas"] == 3
    assert full.one("PodDisruptionBudget")["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": full.one("Deployment")["spec"]["selector"]["matchLabels"]},
    }
    assert full.container["image"] == f"registry.example/toolbus-{chart}@sha256:" + "a" * 64
    for doc in full.docs:
        kubernetes_validate.validate(doc, charts.KUBE_VERSION, strict=True)


@pytest.mark.parametrize("chart", SERVICES)
def test_render_with_the_readme_example_values_is_valid_kubernetes(
    chart: str, rendered_example: dict[str, Rendered]
) -> None:
    example = rendered_example[chart]
    assert example.kinds() == EXPECTED_KINDS
    for doc in example.docs:
        kubernetes_validate.validate(doc, charts.KUBE_VERSION, strict=True)
    config = example.one("ConfigMap")["data"]
    assert config["TOOLBUS_JS_REPLICAS"] == "3"
    assert config["TOOLBUS_REDIS_SENTINEL_MASTER"] == "mymaster"
    assert example.container["image"] == f"registry.example.com/toolbus/toolbus-{chart}:0.1.0"
    assert set(config) <= service_settings(chart)


def test_nats_example_gives_every_user_the_password_the_charts_read() -> None:
    """deploy/helm/examples/nats-values.yaml (for the official NATS chart) passes nats-server one
    password variable per user of deploy/nats/, each from the Secret `toolbus-nats-<user>` that
    the service charts read theirs from."""
    from tests.deploy.test_compose import nats_conf_variables

    example = yaml.safe_load((HELM / "examples" / "nats-values.yaml").read_text())
    env = example["container"]["env"]
    assert set(env) == nats_conf_variables()
    for variable, spec in env.items():
        user = variable.removeprefix("TOOLBUS_NATS_PASSWORD_").lower().replace("_", "-")
        assert spec["valueFrom"]["secretKeyRef"] == {"name": f"toolbus-nats-{user}", "key": "password"}
    for chart in SERVICES:
        ref = values_of(chart)["secrets"]["natsPassword"]
        assert (ref["existingSecret"], ref["key"]) == (f"toolbus-nats-{chart}", "password")
    assert example["config"]["merge"] == {"$include": "./toolbus-auth.conf"}
    assert example["config"]["cluster"] == {"enabled": True, "replicas": 3}
    assert example["config"]["jetstream"]["enabled"] is True


def test_kubernetes_validate_refuses_a_broken_manifest(rendered: dict[str, Rendered]) -> None:
    """The validator is not a no-op: the same Deployment with a wrong type is refused."""
    deployment = json.loads(json.dumps(rendered["dispatcher"].one("Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, charts.KUBE_VERSION, strict=True)


@pytest.mark.parametrize("chart", SERVICES)
def test_default_values_satisfy_the_schema(chart: str) -> None:
    schema = schema_of(chart)
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(values_of(chart))
    jsonschema.Draft7Validator(schema).validate(merge(values_of(chart), full_values(chart)))
    helm_python.Chart.load(HELM / chart).validate_schema(None)


@pytest.mark.parametrize(
    ("chart", "values", "named"),
    [
        ("registry", {"replicaCount": "two"}, "replicaCount"),
        ("registry", {"replicas": 2}, "replicas"),
        ("approval", {"config": {"LOG_LEVEL": "DEBUG"}}, "LOG_LEVEL"),
        ("dispatcher", {"secrets": {"secretKey": {"existingSecret": ""}}}, "existingSecret"),
        ("credentials", {"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ("credentials", {"autoscaling": {"maxReplicas": 0}}, "maxReplicas"),
        ("registry", {"secrets": {"redisPassword": {"existingSecret": "x", "key": "k"}}}, "redisPassword"),
    ],
)
def test_schema_refuses_bad_values_in_helm_and_jsonschema(
    chart: str, values: dict[str, Any], named: str
) -> None:
    with pytest.raises(helm_python.HelmError) as refused:
        helm_python.Chart.load(HELM / chart).render(values=values, name="toolbus", namespace="tools")
    assert named in str(refused.value)
    merged = helm_python.Chart.load(HELM / chart).merge_values(values)
    assert not jsonschema.Draft7Validator(schema_of(chart)).is_valid(merged)


@pytest.mark.parametrize("chart", SERVICES)
def test_security_defaults_are_the_restricted_profile(chart: str, rendered: dict[str, Rendered]) -> None:
    r = rendered[chart]
    pod, container = r.pod, r.container
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert not {"hostNetwork", "hostPID", "hostIPC"} & pod.keys()
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] != 0
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # The only writable place is a size-limited /tmp.
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    assert r.one("ServiceAccount")["automountServiceAccountToken"] is False
    assert container["resources"]["requests"].keys() == {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]


@pytest.mark.parametrize("chart", SERVICES)
def test_probes_metrics_and_service_use_the_health_port(chart: str, rendered: dict[str, Rendered]) -> None:
    r = rendered[chart]
    container = r.container
    mcp = chart == "gateway"  # the gateway's MCP endpoint is a second port
    mcp_port = [{"name": "mcp", "containerPort": 8787, "protocol": "TCP"}] if mcp else []
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}, *mcp_port]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    annotations = r.one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8080"
    assert annotations["prometheus.io/path"] == "/metrics"
    config = r.one("ConfigMap")["data"]
    assert (config["TOOLBUS_HTTP_HOST"], config["TOOLBUS_HTTP_PORT"]) == ("0.0.0.0", "8080")
    pod_labels = r.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    service = r.one("Service")["spec"]
    mcp_service = [{"name": "mcp", "port": 8787, "targetPort": "mcp", "protocol": "TCP"}] if mcp else []
    assert service["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"},
        *mcp_service,
    ]
    if mcp:
        assert (config["TOOLBUS_GATEWAY_HOST"], config["TOOLBUS_GATEWAY_PORT"]) == ("0.0.0.0", "8787")
    assert service["selector"].items() <= pod_labels.items()
    assert r.one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = r.one("HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": f"toolbus-{chart}",
    }
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 6)
    assert "replicas" not in r.one("Deployment")["spec"]


@pytest.mark.parametrize("chart", SERVICES)
def test_every_variable_the_chart_sets_is_a_setting_of_the_service(
    chart: str, rendered: dict[str, Rendered], rendered_full: dict[str, Rendered]
) -> None:
    known = service_settings(chart)
    for r in (rendered[chart], rendered_full[chart]):
        names = set(r.one("ConfigMap")["data"]) | {e["name"] for e in r.container.get("env", [])}
        assert names - known == set(), f"{chart} sets variables no settings class of it reads"


@pytest.mark.parametrize("chart", SERVICES)
def test_secrets_are_references_never_values(
    chart: str, rendered: dict[str, Rendered], rendered_full: dict[str, Rendered]
) -> None:
    for r in (rendered[chart], rendered_full[chart]):
        assert "Secret" not in r.kinds()
        for name in r.one("ConfigMap")["data"]:
            assert not any(m in name for m in SECRET_VARIABLE_MARKERS if not name.endswith("_FILE")), name
        for env in r.container.get("env", []):
            if env["name"].endswith("_FILE") or env["name"] == "TOOLBUS_LOG_LEVEL":
                continue
            assert set(env) == {"name", "valueFrom"}, env
            assert set(env["valueFrom"]) == {"secretKeyRef"}, env
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in rendered[chart].container["env"]}
    uses_key = charts.SERVICES_BY_NAME[chart].secret_key
    assert ("TOOLBUS_SECRET_KEY" in env) is uses_key
    if uses_key:
        # Required: the pod does not start without it, rather than start and fail every call.
        assert env["TOOLBUS_SECRET_KEY"] == {"name": "toolbus", "key": "secret-key"}
    assert ("TOOLBUS_WEBHOOK_SECRET" in env) is charts.SERVICES_BY_NAME[chart].webhook_secret
    assert env["TOOLBUS_NATS_PASSWORD"] == {
        "name": f"toolbus-nats-{chart}",
        "key": "password",
        "optional": True,
    }
    assert ("TOOLBUS_REDIS_PASSWORD" in env) is charts.SERVICES_BY_NAME[chart].redis
    config = rendered[chart].one("ConfigMap")["data"]
    assert (config["TOOLBUS_NATS_USER"], config["TOOLBUS_NATS_INBOX_PREFIX"]) == (chart, f"_INBOX.{chart}")


@pytest.mark.parametrize("chart", SERVICES)
def test_secret_files_are_mounted_read_only_where_their_settings_point(
    chart: str, rendered_full: dict[str, Rendered]
) -> None:
    r = rendered_full[chart]
    env = {e["name"]: e for e in r.container["env"]}
    mounts = {m["name"]: m for m in r.container["volumeMounts"]}
    volumes = {v["name"]: v for v in r.pod["volumes"]}
    expected = {
        "TOOLBUS_NATS_CREDS_FILE": ("nats-credentials", "toolbus-nats-creds", "nats.creds"),
        "TOOLBUS_NATS_NKEY_FILE": ("nats-nkey", "nkey", "nkey.seed"),
        "TOOLBUS_NATS_TLS_CA_FILE": ("nats-tls", "nats-tls", "ca.crt"),
        "TOOLBUS_NATS_TLS_CERT_FILE": ("nats-tls", "nats-tls", "tls.crt"),
        "TOOLBUS_NATS_TLS_KEY_FILE": ("nats-tls", "nats-tls", "tls.key"),
    }
    if charts.SERVICES_BY_NAME[chart].redis:
        expected["TOOLBUS_REDIS_TLS_CA_FILE"] = ("redis-tls", "redis-tls", "ca.crt")
        assert "TOOLBUS_REDIS_TLS_CERT_FILE" not in env  # no client certificate asked for
        assert env["TOOLBUS_REDIS_SENTINEL_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "sentinel"
        assert r.one("ConfigMap")["data"]["TOOLBUS_REDIS_SENTINELS"] == "redis-node-0:26379"
    else:
        assert not any(name.startswith("TOOLBUS_REDIS") for name in env)
    assert env["TOOLBUS_NATS_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "nats-token", "key": "token"}
    for variable, (volume, secret, key) in expected.items():
        mount = mounts[volume]
        assert mount["readOnly"] is True
        assert env[variable]["value"] == f"{mount['mountPath']}/{key}"
        assert volumes[volume]["secret"]["secretName"] == secret
        assert {"key": key, "path": key} in volumes[volume]["secret"]["items"]
        assert volumes[volume]["secret"]["defaultMode"] == 0o440
    assert env["TOOLBUS_LOG_LEVEL"] == {"name": "TOOLBUS_LOG_LEVEL", "value": "DEBUG"}
    assert r.container["args"] == ["--ignored"]


def test_the_approval_chart_trusts_request_info_and_serves_the_console_behind_its_own_ingress() -> None:
    """deploy/nats/ (the NATS chart's configuration) vouches for the approver's identity, so the
    chart names deciders by it; the console is off by default, and when on has a port, a Service
    port and an Ingress of its own (never the health port)."""
    from tests.deploy.conftest import _render

    default = _render("approval", None)
    config = default.one("ConfigMap")["data"]
    assert config["TOOLBUS_APPROVAL_TRUST_REQUEST_INFO"] == "1"
    assert "TOOLBUS_CONSOLE_PORT" not in config and "Ingress" not in default.kinds()
    on = {
        "console": {
            "enabled": True,
            "ingress": {"enabled": True, "host": "approvals.example.org", "tlsSecret": "tls"},
        }
    }
    r = _render("approval", on)
    for doc in r.docs:
        kubernetes_validate.validate(doc, charts.KUBE_VERSION, strict=True)
    config = r.one("ConfigMap")["data"]
    assert (config["TOOLBUS_CONSOLE_HOST"], config["TOOLBUS_CONSOLE_PORT"]) == ("0.0.0.0", "8788")
    assert {"name": "console", "containerPort": 8788, "protocol": "TCP"} in r.container["ports"]
    assert {"name": "console", "port": 8788, "targetPort": "console", "protocol": "TCP"} in r.one("Service")[
        "spec"
    ]["ports"]
    ingress = r.one("Ingress")["spec"]
    (rule,) = ingress["rules"]
    assert rule["host"] == "approvals.example.org" and ingress["tls"][0]["secretName"] == "tls"
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": "toolbus-approval", "port": {"name": "console"}}
