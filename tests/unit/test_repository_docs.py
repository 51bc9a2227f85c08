"""The repository documents its own protocol: nothing in it points outside the checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = "../" + "shared"  # spelled in two parts so that this file does not name it


def tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_file_names_the_shared_folder_outside_the_repository() -> None:
    files = tracked_files()
    assert len(files) > 50  # the listing worked: we are scanning the repository, not nothing
    naming = []
    for path in files:
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if OUTSIDE in text:
            naming.append(str(path.relative_to(ROOT)))
    assert naming == []


def test_readme_design_and_service_readmes_link_the_protocol() -> None:
    assert (ROOT / "docs" / "protocol.md").is_file()
    for doc in [
        "README.md",
        "docs/design.md",
        *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("services/*/README.md")),
    ]:
        assert "protocol.md" in (ROOT / doc).read_text(encoding="utf-8"), doc
