"""Approval rules as the dispatcher evaluates them, and how the approval service names deciders."""

from __future__ import annotations

from typing import Any

from toolbus_approval.identity import Identity
from toolbus_contracts import EffectivePolicy, PolicySpec
from toolbus_contracts.registry import ApprovalRule
from toolbus_dispatcher.approval_rules import ApprovalRules, uses_credentials

REFUNDS = ApprovalRule(
    when={
        "properties": {
            "input": {"properties": {"amount": {"minimum": 100}}, "required": ["amount"]},
            "run": {"properties": {"namespace": {"enum": ["prod", "eu-prod"]}}},
        }
    }
)


def subject(amount: int, namespace: str | None = "prod") -> dict[str, Any]:
    run = {"runId": "run_1", "namespace": namespace, "toolsetId": "ts_1", "credentials": None}
    return {"input": {"amount": amount}, "tool": "shop.refund", "run": run}


def test_a_rule_asks_when_input_and_run_match_and_not_otherwise() -> None:
    rules = ApprovalRules()
    assert rules.verdict(REFUNDS, subject(500)).ask is True
    assert rules.verdict(REFUNDS, subject(5)).ask is False  # input does not match
    assert rules.verdict(REFUNDS, subject(500, "dev")).ask is False  # run does not match
    assert rules.verdict(True, subject(5)).ask is True and rules.verdict(False, subject(500)).ask is False


def test_a_rule_that_cannot_be_evaluated_asks_and_says_why() -> None:
    rules = ApprovalRules()
    remote = ApprovalRule(when={"$ref": "https://rules.example.invalid/r.json"})
    verdict = rules.verdict(remote, subject(5))
    assert verdict.ask is True and verdict.error is not None and "rules.example.invalid" in verdict.error
    invalid = ApprovalRule(when={"type": "no-such-type"})  # stored before the registry refused such
    verdict = rules.verdict(invalid, subject(5))
    assert verdict.ask is True and verdict.error is not None and "not valid JSON Schema" in verdict.error
    recursive = ApprovalRule(
        when={"$defs": {"n": {"properties": {"n": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}
    )
    deep: dict[str, Any] = {}
    for _ in range(5000):
        deep = {"n": deep}
    verdict = rules.verdict(recursive, deep)
    assert verdict.ask is True and verdict.error is not None


def test_credentials_are_resolved_only_for_rules_that_name_them() -> None:
    assert uses_credentials(ApprovalRule(when={"properties": {"run": {"properties": {"credentials": {}}}}}))
    assert not uses_credentials(REFUNDS)


def test_a_rule_policy_is_hashable_and_keeps_its_rule() -> None:
    spec = PolicySpec.model_validate({"approval": REFUNDS.wire(), "approvalTimeout": "10m"})
    effective = EffectivePolicy.for_kind("host", spec)  # cached: the policy must hash
    assert effective.approval == REFUNDS and effective.approval_timeout == "10m"
    assert EffectivePolicy.for_kind("host", None).wire().get("approvalTimeout") is None


INFO = '{"acc":"APPROVER","user":"alice","kind":"Client"}'


def test_deciders_are_the_vouched_nats_user_or_the_claim_marked_as_such() -> None:
    trusted, open_ = Identity(trust_request_info=True), Identity()
    assert trusted.decider({"Nats-Request-Info": INFO}, "mallory") == "nats:APPROVER/alice"
    assert trusted.decider({}, "bob") == "claimed:bob"  # no header: the services' own account
    assert open_.decider({"Nats-Request-Info": INFO}, None) == "anonymous"  # a client could write it
    assert open_.decider({"Nats-Request-Info": INFO}, "bob") == "claimed:bob"
    assert trusted.decider({"Nats-Request-Info": "not json"}, None) == "anonymous"
