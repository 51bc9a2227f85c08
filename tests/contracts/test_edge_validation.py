"""Validation at the edge (CONTRACT v1.1): names that become keys have a charset and a length,
allow entries are host names, `*.` host names or IP literals, URL hosts in IPv4 number forms are
the address they spell, non-global addresses are told apart, and http.fetch headers are checked
before anything is sent."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from toolbus_common.egress import is_public
from toolbus_contracts import (
    CallGetRequest,
    CallStartRequest,
    HttpSpec,
    NamespaceCredentialsSetRequest,
    RunCloseRequest,
    RunOpenRequest,
    WorkflowGetRequest,
    parse_body,
)
from toolbus_contracts.errors import HostNotAllowed, InvalidInput, InvalidRequest
from toolbus_contracts.names import is_allow_entry, normalize_allow_entry
from toolbus_dispatcher.allowlist import AllowList, whatwg_ipv4
from toolbus_dispatcher.executors.http import checked_headers

TS = "ts_" + "0" * 64
ODD = ["", "a b", "a*", ">", "a.b.>", "\u0000", "😀", "a\nb", "x" * 129, "a:b", "{a}"]


def _refused(model: Any, body: dict[str, Any], field: str) -> None:
    import json

    with pytest.raises(InvalidRequest) as err:
        parse_body(model, json.dumps(body))
    assert err.value.details["field"] == field, err.value.message
    assert len(err.value.message) < 400


@pytest.mark.parametrize("name", ODD)
def test_run_ids_and_namespaces_outside_their_charset_are_invalid_request(name: str) -> None:
    _refused(RunOpenRequest, {"toolsetId": TS, "runId": name}, "runId")
    _refused(RunCloseRequest, {"runId": name}, "runId")
    _refused(CallStartRequest, {"runId": name, "tool": "t"}, "runId")
    _refused(CallGetRequest, {"callId": name}, "callId")
    if name not in ("a:b",) and "." not in name:
        _refused(RunOpenRequest, {"toolsetId": TS, "namespace": name}, "namespace")
        _refused(
            NamespaceCredentialsSetRequest,
            {"namespace": name, "toolsetId": TS, "credentials": {"servers": {}}},
            "namespace",
        )


def test_an_email_is_a_namespace_and_128_characters_is_the_limit() -> None:
    assert parse_body(RunOpenRequest, f'{{"toolsetId":"{TS}","namespace":"ann.lee@example.com"}}').namespace
    parse_body(RunOpenRequest, f'{{"toolsetId":"{TS}","runId":"{"r" * 128}"}}')
    _refused(RunOpenRequest, {"toolsetId": TS, "namespace": "n" * 129}, "namespace")


@pytest.mark.parametrize("name", [*ODD, "a.b", "1abc", "x" * 65])
def test_workflow_get_with_an_odd_name_is_invalid_request(name: str) -> None:
    _refused(WorkflowGetRequest, {"name": name}, "name")


def test_workflow_get_versions_are_12_hex_digits() -> None:
    _refused(WorkflowGetRequest, {"name": "triage", "version": "*"}, "version")
    assert parse_body(WorkflowGetRequest, '{"name":"triage","version":"9f2c4e1a07b3"}').version


@pytest.mark.parametrize(
    "entry",
    [
        "example.com",
        "*.example.com",
        "127.0.0.1",
        "::1",
        "[::1]",
        "localhost",
        "bücher.de",
        "a_b.internal",
        "example.com:8443",
        "*.example.com:443",
        "127.0.0.1:9000",
        "[::1]:8080",
        "localhost:1",
        "localhost:65535",
    ],
)
def test_allow_entries_that_are_names_wildcard_names_or_ip_literals_pass(entry: str) -> None:
    assert is_allow_entry(entry)
    HttpSpec.model_validate({"allow": [entry]})


@pytest.mark.parametrize(
    "entry",
    [
        *("*.1", "*.0.0.1", "2130706433", "127.1", "0x7f.1", "*", "*.", "a b", "x.*.com", "", "a..b"),
        *("example.com:", "example.com:0", "example.com:65536", "example.com:+80", "example.com:http"),
        *("[::1]8080", "[::1]:", "127.1:80", "*.1:80", ":80", "[::1]:080000"),
        *("example.com:²", "example.com:٨٠", "[1.2.3.4]x:80"),  # digits must be ASCII ones
    ],
)
def test_numeric_wildcards_and_malformed_allow_entries_are_refused(entry: str) -> None:
    assert not is_allow_entry(entry)
    _refused(HttpSpec, {"allow": [entry]}, "allow[0]")


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("2130706433", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("10.1", "10.0.0.1"),
    ],
)
def test_url_hosts_in_ipv4_number_forms_are_the_address_they_spell(host: str, address: str) -> None:
    assert whatwg_ipv4(host) == address


@pytest.mark.parametrize(
    "url",
    ["http://2130706433/", "http://127.1/", "http://0x7f.1/", "http://[::ffff:127.0.0.1]/", "http://a.1/"],
)
def test_a_numeric_wildcard_lets_no_loopback_form_through(url: str) -> None:
    allow = AllowList(["*.1", "*.example.com"])  # "*.1" as pinned before entries were checked
    with pytest.raises(HostNotAllowed):
        allow.check(url)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.0.0.1",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fd00:ec2::254",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "64:ff9b::a00:1",
        "2002:7f00:1::",
        "224.0.0.1",
    ],
)
def test_special_purpose_addresses_are_not_public(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111", "::ffff:1.1.1.1"])
def test_global_addresses_are_public(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "headers",
    [
        {"X-A": "a\r\nInjected: 1"},
        {"X-A": "a\nb"},
        {"X-A": "\u0000"},
        {"X-A": "emoji 😀"},
        {"X-A": "ünï€"},
        {"X-A": "caf\u0301e"},  # a combining accent: outside Latin-1
        {"X-A": "a\x85b"},  # a C1 control (NEL)
        {"X-A": "a\x7f"},
        {"X-A": "a\x0bb"},
        {"X-A": " padded"},
        {"X-A": "padded\t"},
        {"X-A": "   "},
        {"Bad Name": "v"},
        {"": "v"},
        {"X\r\nY": "v"},
        {"X-A": 5},
    ],
)
def test_headers_with_control_characters_or_outside_latin1_are_invalid_input(headers: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput) as err:
        checked_headers(headers)
    assert err.value.details["path"].startswith("$.headers")


def test_plain_headers_pass_as_bytes_latin1_as_its_bytes_and_hop_headers_are_dropped() -> None:
    assert checked_headers(
        {
            "Accept": "text/plain",
            "X-Latin": "café",
            "X-Inner": "a \t b",
            "X-Empty": "",
            "Host": "evil",
            "Content-Length": "9",
        }
    ) == {
        "Accept": b"text/plain",
        "X-Latin": b"caf\xe9",  # obs-text (RFC 9110): the Latin-1 byte, not UTF-8
        "X-Inner": b"a \t b",
        "X-Empty": b"",
    }


def test_redis_not_now_replies_through_the_script_pipe_are_backing_store_faults() -> None:
    from toolbus_common.faults import is_backing_store_fault, unavailable
    from toolbus_common.script_pipe import ScriptReplyError

    loading = ScriptReplyError("LOADING Redis is loading the dataset in memory")
    assert is_backing_store_fault(loading) and unavailable(loading).details == {"store": "Redis"}
    assert is_backing_store_fault(ScriptReplyError("READONLY You can't write against a read only replica."))
    assert not is_backing_store_fault(ScriptReplyError("ERR user_script:1: Script attempted to access key"))


@pytest.mark.parametrize(
    ("entry", "pinned"),
    [
        ("Example.COM.", "example.com"),  # as pinned before ports existed: the same toolset id
        ("[::1]", "[::1]"),
        ("::1", "::1"),
        ("Example.COM.:0443", "example.com:443"),
        ("*.Corp.Example:8443", "*.corp.example:8443"),
        ("[::1]:8080", "[::1]:8080"),
        ("::1:8080", "::1:8080"),  # a bare IPv6 address (any port), not [::1] on 8080
        ("[1.2.3.4]:80", "[1.2.3.4]:80"),
    ],
)
def test_allow_entries_are_pinned_lower_cased_with_the_port_as_a_number(entry: str, pinned: str) -> None:
    assert normalize_allow_entry(entry) == pinned
