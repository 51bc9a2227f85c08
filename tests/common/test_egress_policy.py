"""`toolbus_common.egress.EgressPolicy`: what `TOOLBUS_EGRESS_ALLOW` parses to, which addresses
the default refuses, names allowed whatever they resolve to, and `addresses` keeping only what
passes (the connection goes to one of those)."""

from __future__ import annotations

import pytest
from toolbus_common import Settings
from toolbus_common.egress import EgressPolicy, EgressRefused
from toolbus_contracts.errors import HostNotAllowed

DEFAULT = EgressPolicy()


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.0.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "0.1.2.3",
        "255.255.255.255",
        "192.0.2.1",
        "198.18.0.1",
        "240.0.0.1",
        "224.0.0.1",
        "::",
        "::1",
        "fe80::1",
        "fe80::1%eth0",
        "fd00:ec2::254",
        "fec0::1",
        "ff0e::1",
        "::ffff:127.0.0.1",
        "::ffff:0:127.0.0.1",
        "::127.0.0.1",
        "64:ff9b::10.0.0.1",
        "64:ff9b:1::808:808",
        "2002:c0a8:1::",
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",
        "2001:db8::1",
        "not an address",
    ],
)
def test_the_default_refuses_every_special_purpose_address(address: str) -> None:
    assert DEFAULT.allows_address(address) is False


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "93.184.216.34", "2606:4700:4700::1111", "::ffff:1.1.1.1", "64:ff9b::808:808"]
)
def test_the_default_allows_public_unicast(address: str) -> None:
    assert DEFAULT.allows_address(address) is True


def test_parse_takes_networks_addresses_and_names_and_refuses_the_rest() -> None:
    policy = EgressPolicy.parse(" 10.0.0.0/8, ::1 ,[fd00::1], mcp.corp.internal., *.svc.cluster.local,")
    assert policy.allows_address("10.200.0.1") and policy.allows_address("::1")
    assert policy.allows_address("fd00::1") and not policy.allows_address("fd00::2")
    assert policy.allows_name("MCP.corp.internal") and policy.allows_name("a.b.svc.cluster.local")
    assert not policy.allows_name("svc.cluster.local") and not policy.allows_name("corp.internal")
    for bad in ("10.0.0.0/33x", "a b", "*", "http://x/"):
        with pytest.raises(ValueError, match="TOOLBUS_EGRESS_ALLOW"):
            EgressPolicy.parse(bad)
    with pytest.raises(ValueError, match="TOOLBUS_EGRESS_ALLOW"):
        Settings(egress_allow="10.0.0.0/8,not/a name")
    assert Settings().egress == EgressPolicy()


def test_static_refusal_judges_literals_and_localhost_only() -> None:
    assert DEFAULT.static_refusal("10.0.0.1") is not None
    assert DEFAULT.static_refusal("[::1]") is not None
    assert DEFAULT.static_refusal("LOCALHOST.") is not None
    assert DEFAULT.static_refusal("*.localhost") is not None
    assert DEFAULT.static_refusal("a.localhost") is not None
    assert DEFAULT.static_refusal("api.example.com") is None  # checked when it resolves
    assert DEFAULT.static_refusal("8.8.8.8") is None
    allowing = EgressPolicy.parse("localhost,10.0.0.0/8")
    assert allowing.static_refusal("localhost") is None and allowing.static_refusal("10.9.9.9") is None


async def test_addresses_keep_what_passes_in_order_and_refuse_when_none_does() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return {"mixed.test": ["10.0.0.1", "8.8.8.8", "::1", "1.1.1.1"], "inside.test": ["10.0.0.1"]}[host]

    assert await DEFAULT.addresses("mixed.test", 443, resolver) == ["8.8.8.8", "1.1.1.1"]
    with pytest.raises(EgressRefused):
        await DEFAULT.addresses("inside.test", 443, resolver)
    with pytest.raises(EgressRefused):
        await DEFAULT.addresses("[::ffff:10.0.0.1]", 443, resolver)
    named = EgressPolicy.parse("inside.test")
    assert await named.addresses("inside.test", 443, resolver) == ["10.0.0.1"]  # allowed by name
    with pytest.raises(HostNotAllowed) as err:
        await DEFAULT.checker(resolver)("inside.test", 443)
    assert err.value.details == {"host": "inside.test"}
