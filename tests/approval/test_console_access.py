"""Which approvals a person's groups let them see and decide (`TOOLBUS_CONSOLE_GROUPS`)."""

from __future__ import annotations

from typing import Any

import pytest
from toolbus_approval.console.access import Grants, Person

GROUPS = {
    "ops": "*",
    "shop": {"namespaces": ["shop-prod", "shop-dev"]},
    "refunds": {"toolsets": ["ts_a"], "namespaces": ["prod"]},
    "two": [{"toolsets": ["ts_b"]}, {"namespaces": [""]}],
}


def person(*groups: str) -> Person:
    return Person(subject="s", name="n", groups=groups, grants=Grants(GROUPS).of(groups))


def test_a_grant_covers_an_approval_when_every_list_it_gives_holds_it() -> None:
    assert person("ops").may("ts_x", "anything") and person("ops").may("ts_x", None)
    assert person("shop").may("ts_x", "shop-dev") and not person("shop").may("ts_x", "prod")
    refunds = person("refunds")
    assert refunds.may("ts_a", "prod")
    assert not refunds.may("ts_a", "dev") and not refunds.may("ts_b", "prod")
    two = person("two")
    assert two.may("ts_b", "prod") and two.may("ts_z", None) and not two.may("ts_z", "prod")
    assert not person().may("ts_a", "prod") and not person("unknown").may("ts_a", "prod")
    assert person("unknown", "shop").may("ts_x", "shop-prod")  # one covering grant is enough


def test_remembered_decisions_need_a_grant_of_any_toolset() -> None:
    assert person("shop").may_remembered("shop-prod") and not person("shop").may_remembered("prod")
    assert not person("refunds").may_remembered("prod")  # it names toolsets; a remembered one has none
    assert person("ops").may_remembered(None)


@pytest.mark.parametrize(
    "groups",
    [
        {"g": "all"},
        {"g": {"tools": ["x"]}},
        {"g": {"namespaces": "prod", "toolsets": [1]}},
        {"g": [{"namespaces": ["a"]}, 5]},
    ],
)
def test_a_malformed_group_map_is_refused_naming_the_group(groups: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="TOOLBUS_CONSOLE_GROUPS"):
        Grants(groups)


def test_the_namespaces_to_read_pending_approvals_from() -> None:
    assert person("shop").namespaces() == frozenset({"shop-prod", "shop-dev"})
    assert person("shop", "refunds").namespaces() == frozenset({"shop-prod", "shop-dev", "prod"})
    assert person("ops").namespaces() is None and person("two").namespaces() is None
    assert person().namespaces() == frozenset()
