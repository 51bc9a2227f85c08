"""A quality gate missing what it checks (npm catalogues, tsc) skips on a developer's machine and
fails in CI, so a CI run cannot pass without checking anything."""

from __future__ import annotations

import pytest

from tests.support.gates import in_ci, missing


@pytest.mark.parametrize("value", ["true", "1", "yes", "True"])
def test_in_ci_a_missing_catalogue_fails_the_gate(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci()
    with pytest.raises(pytest.fail.Exception, match="quality gate cannot run in CI: no catalogue"):
        missing("no catalogue")


@pytest.mark.parametrize("value", [None, "", "0", "false", "no"])
def test_outside_ci_a_missing_catalogue_skips_the_gate(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not in_ci()
    with pytest.raises(pytest.skip.Exception, match="no catalogue"):
        missing("no catalogue")
