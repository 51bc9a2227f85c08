"""Every make target that runs uv or the venv's Python works on a fresh clone: it depends on the
uv bootstrap (`$(UV_DEP)`) or on the locked environment (`.venv/.synced`, which needs it)."""

from __future__ import annotations

import re
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"
BOOTSTRAP = (".venv/.synced", "$(UV_DEP)")


def rules() -> dict[str, tuple[str, str]]:
    """target -> (prerequisites, recipe) of each explicit rule with a `## help` comment."""
    found: dict[str, tuple[str, str]] = {}
    lines = MAKEFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^([a-z][a-z-]*):(.*?)##", line)
        if not match:
            continue
        recipe = []
        for body in lines[i + 1 :]:
            if not body.startswith("\t"):
                break
            recipe.append(body)
        found[match[1]] = (match[2], "\n".join(recipe))
    return found


def test_every_target_running_uv_or_the_venv_bootstraps_them_first() -> None:
    targets = rules()
    assert {"bench", "bench-alternatives", "test", "up"} <= targets.keys()
    lacking = [
        name
        for name, (prerequisites, recipe) in targets.items()
        if ("$(UV)" in recipe or "$(PYTHON)" in recipe) and not any(b in prerequisites for b in BOOTSTRAP)
    ]
    assert lacking == []
